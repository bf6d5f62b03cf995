"""The six scenarios. Each runs both systems round-robin and adds rows to the results."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

from bench.context import Bench, Worker, gather_limited, rounds, supports_transport
from bench.procs import reset_peak
from bench.report import SYSTEMS, Row, Summary

RSS_TARGET_MB = 100.0


def _both(values: dict[str, list[float]]) -> tuple[Summary, Summary]:
    return Summary.of(values["relaykit"]), Summary.of(values["floor"])


def _per_system() -> dict[str, list[float]]:
    return {system: [] for system in SYSTEMS}


# --- 1. per-turn latency ----------------------------------------------------------------------


async def latency(bench: Bench) -> None:
    """Sequential runs of K tool-calling turns: wall time per turn, and the CPU time each process
    spent per turn (worker, Temporal server, model server)."""
    scenario = "1 per-turn latency"
    sizes = {10: bench.settings.repetitions(9, 2), 100: bench.settings.repetitions(5, 1)}
    workers = {system: bench.worker(system) for system in SYSTEMS}
    for system in SYSTEMS:  # warm-up: connections, sandbox imports, caches
        for _ in range(2):
            await bench.timed(bench.start_turns(workers[system], 3))
    median: dict[int, dict[str, float]] = {}
    for k, reps in sizes.items():
        wall = _per_system()
        cpu: dict[str, dict[str, list[float]]] = {s: {} for s in SYSTEMS}
        for _, order in rounds(reps):
            for system in order:
                meter = bench.cpu_meter(workers[system])
                seconds, _ = await bench.timed(bench.start_turns(workers[system], k))
                wall[system].append(seconds * 1000 / k)
                for name, used in meter.used().items():
                    cpu[system].setdefault(name, []).append(used * 1000 / k)
        rk, fl = _both(wall)
        median[k] = {"relaykit": rk.median, "floor": fl.median}
        row = bench.results.add(
            Row(scenario, f"wall time per turn, K={k}", "ms", rk, fl, target="≤ 1.25x floor")
        )
        row.ok = row.ratio is not None and row.ratio <= 1.25
        for name in ("worker", "temporal_server", "model_server"):
            if name not in cpu["relaykit"]:
                continue
            bench.results.add(
                Row(
                    scenario,
                    f"{name.replace('_', ' ')} CPU per turn, K={k}",
                    "ms",
                    Summary.of(cpu["relaykit"][name]),
                    Summary.of(cpu["floor"][name]) if name != "model_server" else None,
                )
            )
    # Fixed costs (start, final answer, result) weigh more at K=10; the marginal cost of a turn
    # between the two sizes shows what one more turn costs in a longer run.
    marginal = {s: (median[100][s] * 100 - median[10][s] * 10) / 90 for s in SYSTEMS}
    bench.results.add(
        Row(
            scenario,
            "marginal time per turn, K=10 → K=100",
            "ms",
            Summary.of([marginal["relaykit"]]),
            Summary.of([marginal["floor"]]),
            note="from the medians",
        )
    )
    r10 = median[10]["relaykit"] / median[10]["floor"]
    r100 = median[100]["relaykit"] / median[100]["floor"]
    growth = r100 / r10
    row = bench.results.add(
        Row(
            scenario,
            "ratio to floor at K=100 / ratio at K=10",
            "x",
            Summary.of([growth]),
            target="≤ 1.10 (overhead not growing with K)",
            ratio_override=growth,
        )
    )
    row.ok = growth <= 1.10


# --- 2. history growth ------------------------------------------------------------------------

HISTORY_SIZES = (10, 50, 100, 300)


async def history(bench: Bench) -> None:
    """Events and bytes per run and per turn; a run of each size per system (history is
    deterministic apart from ids and timestamps, so one run per size is enough). When relaykit
    lets a run choose its transcript transport, runs that send the whole transcript inline are
    measured too (informational: the default is what the targets judge)."""
    scenario = "2 history growth"
    variants: list[tuple[str, str, str | None]] = [
        ("relaykit", "relaykit", None),
        ("floor", "floor", None),
    ]
    if supports_transport():
        variants.append(("relaykit-inline", "relaykit", "inline"))
    stats: dict[tuple[str, int], Any] = {}
    for k in HISTORY_SIZES:
        for name, system, transport in variants:
            _, handle = await bench.timed(
                bench.start_turns(bench.worker(system), k, transport=transport)
            )
            chain, st = await bench.history(name, handle)
            if transport is None:
                bench.histories[(system, k)] = chain
            stats[(name, k)] = st
    bench.results.extra["history"] = {
        f"{name} K={k}": st.summary() for (name, k), st in stats.items()
    }

    def row(
        metric: str, unit: str, value: Callable[[Any], float], k: int, *,
        relaykit: str = "relaykit", **extra: Any,
    ) -> Row:
        return bench.results.add(
            Row(
                scenario,
                metric,
                unit,
                Summary.of([value(stats[(relaykit, k)])]),
                Summary.of([value(stats[("floor", k)])]),
                **extra,
            )
        )

    last = HISTORY_SIZES[-1]
    for k in HISTORY_SIZES:
        target = "≤ 2x floor" if k == 50 else ""
        r = row(f"history bytes per run, K={k}", "B", lambda s: s.bytes, k, target=target)
        if k == 50:
            r.ok = r.ratio is not None and r.ratio <= 2.0
        row(f"history events per run, K={k}", "events", lambda s: s.events, k)
    for n in (1, 10, 100, last):
        row(f"bytes added by turn {n} (K={last} run)", "B", lambda s, n=n: s.turn(n), last)
    row(f"largest event, K={last}", "B", lambda s: s.largest_event, last,
        note="the run's result, which carries the transcript")
    growth = stats[("relaykit", last)].turn(last) / stats[("relaykit", last)].turn(10)
    floor_growth = stats[("floor", last)].turn(last) / stats[("floor", last)].turn(10)
    r = bench.results.add(
        Row(
            scenario,
            f"growth of bytes per turn, turn {last} / turn 10",
            "x",
            Summary.of([growth]),
            Summary.of([floor_growth]),
            target="relaykit ≤ 1.5x (flat in K)",
            ratio_override=growth,
            absolute=True,
        )
    )
    r.ok = growth <= 1.5
    if not supports_transport():
        return
    for k in HISTORY_SIZES:
        st = stats[("relaykit-inline", k)]
        note = f"{st.runs} workflow runs (continued as new)" if st.runs > 1 else ""
        row(f"inline transcript: history bytes per run, K={k}", "B", lambda s: s.bytes, k,
            relaykit="relaykit-inline", note=note)
    for n in (1, 10, 100, last):
        row(f"inline transcript: bytes added by turn {n} (K={last} run)", "B",
            lambda s, n=n: s.turn(n), last, relaykit="relaykit-inline")
    inline = stats[("relaykit-inline", last)]
    bench.results.add(
        Row(
            scenario,
            f"inline transcript: growth of bytes per turn, turn {last} / turn 10",
            "x",
            Summary.of([inline.turn(last) / inline.turn(10)]),
            Summary.of([floor_growth]),
            ratio_override=inline.turn(last) / inline.turn(10),
        )
    )


# --- 3. throughput ----------------------------------------------------------------------------

THROUGHPUT_RUNS = 100
"""Concurrent runs of the throughput scenario unless ``--throughput-runs`` says otherwise."""
THROUGHPUT_TURNS = 10


async def throughput(bench: Bench) -> None:
    """N concurrent runs of K=10 on one fresh worker process per measurement."""
    scenario = "3 throughput"
    reps = bench.settings.repetitions(3, 1)
    n, k = bench.settings.throughput_runs or THROUGHPUT_RUNS, THROUGHPUT_TURNS
    wall, rate, peak = _per_system(), _per_system(), _per_system()
    cpu_worker, cpu_server = _per_system(), _per_system()
    for _, order in rounds(reps):
        for system in order:
            worker = bench.start_worker(system)
            try:
                await bench.timed(bench.start_turns(worker, 2))  # warm-up
                reset_peak(worker.pid)
                meter = bench.cpu_meter(worker)
                began = time.perf_counter()
                handles = await gather_limited(lambda _: bench.start_turns(worker, k), range(n), 100)
                await gather_limited(bench.result, handles, 200)
                seconds = time.perf_counter() - began
                used = meter.used()
                wall[system].append(seconds)
                rate[system].append(n / seconds)
                peak[system].append(bench.rss_mb(worker)["VmHWM"])
                cpu_worker[system].append(used["worker"] * 1000 / (n * k))
                if "temporal_server" in used:
                    cpu_server[system].append(used["temporal_server"] * 1000 / (n * k))
            finally:
                worker.stop()
    label = f"N={n}, K={k}"
    bench.results.add(Row(scenario, f"total wall time, {label}", "s", *_both(wall)))
    r = bench.results.add(
        Row(scenario, f"runs per second, {label}", "runs/s", *_both(rate), target="≥ 0.8x floor")
    )
    r.ok = r.ratio is not None and r.ratio >= 0.8
    r = bench.results.add(
        Row(scenario, f"worker peak RSS, {label}", "MB", *_both(peak), target="relaykit < 100 MB",
            absolute=True)
    )
    r.ok = r.relaykit is not None and r.relaykit.max < RSS_TARGET_MB
    bench.results.add(Row(scenario, f"worker CPU per turn, {label}", "ms", *_both(cpu_worker)))
    if cpu_server["relaykit"] and cpu_server["floor"]:
        bench.results.add(
            Row(scenario, f"temporal server CPU per turn, {label}", "ms", *_both(cpu_server))
        )


# --- 4. fan-out -------------------------------------------------------------------------------

FANOUT_CHILDREN = 20


async def fanout(bench: Bench) -> None:
    """One parent whose model asks for 20 children in one batch, each a child run of one turn:
    agent-as-tool (``ask_helper``: the parent waits for each) and background subagents
    (``spawn_subagent`` x 20, then ``wait_subagents``)."""
    scenario = "4 fan-out"
    reps = bench.settings.repetitions(7, 2)
    n = FANOUT_CHILDREN
    workers = {system: bench.worker(system) for system in SYSTEMS}
    kinds: dict[str, Callable[[Worker], Awaitable[Any]]] = {
        "agent-as-tool": lambda worker: bench.start_fanout(worker, n),
        "background subagents": lambda worker: bench.start_background(worker, n),
    }
    for kind, start in kinds.items():
        for system in SYSTEMS:  # warm-up
            await bench.timed(start(workers[system]))
        wall = _per_system()
        parent_bytes: dict[str, float] = {}
        for _, order in rounds(reps):
            for system in order:
                seconds, handle = await bench.timed(start(workers[system]))
                wall[system].append(seconds * 1000)
                if system not in parent_bytes:
                    chain = await bench.history_chain(handle)
                    parent_bytes[system] = sum(e.ByteSize() for h in chain for e in h.events)
        bench.results.add(
            Row(scenario, f"{kind}: parent wall time, {n} children", "ms", *_both(wall))
        )
        bench.results.add(
            Row(
                scenario,
                f"{kind}: parent history bytes, {n} children",
                "B",
                Summary.of([parent_bytes["relaykit"]]),
                Summary.of([parent_bytes["floor"]]),
            )
        )


# --- 5. idle cost -----------------------------------------------------------------------------


IDLE_WINDOW_S = 5.0
WARM_RSS_MARGIN_MB = 15.0


PARK_SECONDS_PER_RUN = 0.5
"""How long :func:`_wait_parked` gives each run to park (at least 600 s in all): 10,000 runs on a
loaded machine park in far more than 600 s."""


async def _wait_parked(bench: Bench, worker: Worker, n: int, timeout: float | None = None) -> float:
    timeout = max(600.0, PARK_SECONDS_PER_RUN * n) if timeout is None else timeout
    query = (
        f"TaskQueue = '{worker.task_queue}' AND ExecutionStatus = 'Running' "
        "AND RelayStatus = 'waiting_approval'"
    )
    began = time.perf_counter()
    while True:
        count = (await bench.client.count_workflows(query)).count
        if count >= n:
            return time.perf_counter() - began
        if time.perf_counter() - began > timeout:
            raise TimeoutError(f"only {count} of {n} runs reached their approval wait")
        await asyncio.sleep(0.2)


async def idle(bench: Bench) -> None:
    """N runs parked on an approval (relaykit) or a signal (floor) on one fresh worker: worker
    memory while they wait, then the time to answer them all and to see them all finish."""
    scenario = "5 idle cost"
    n = bench.settings.idle_n
    reps = bench.settings.repetitions(2, 1)
    rss, per_run_kb, answer, drain = _per_system(), _per_system(), _per_system(), _per_system()
    idle_cpu, park, warm_rss = _per_system(), _per_system(), _per_system()
    for _, order in rounds(reps):
        for system in order:
            worker = bench.start_worker(system)
            try:
                warm = await bench.start_approval(worker)
                await _wait_parked(bench, worker, 1)
                await bench.answer_approval(system, warm)
                await bench.result(warm)
                base = bench.rss_mb(worker)["VmRSS"]
                warm_rss[system].append(base)
                began = time.perf_counter()
                handles = await gather_limited(
                    lambda _: bench.start_approval(worker), range(n), 100
                )
                await _wait_parked(bench, worker, n)
                park[system].append(time.perf_counter() - began)
                await asyncio.sleep(1.0)
                meter = bench.cpu_meter(worker)
                await asyncio.sleep(IDLE_WINDOW_S)
                idle_cpu[system].append(meter.used()["worker"] * 1000 / IDLE_WINDOW_S)
                waiting = bench.rss_mb(worker)["VmRSS"]
                rss[system].append(waiting)
                per_run_kb[system].append((waiting - base) * 1024 / n)
                began = time.perf_counter()
                await bench.answer_all(system, worker, handles)
                answered = time.perf_counter() - began
                await gather_limited(bench.result, handles, 200)
                drained = time.perf_counter() - began
                answer[system].append(answered)
                drain[system].append(drained)
            finally:
                worker.stop()
    label = f"N={n}"
    r = bench.results.add(
        Row(scenario, "worker RSS after warm-up (one run answered)", "MB", *_both(warm_rss),
            target=f"≤ floor + {WARM_RSS_MARGIN_MB:g} MB", absolute=True)
    )
    r.ok = (
        r.relaykit is not None
        and r.floor is not None
        and r.relaykit.max <= r.floor.median + WARM_RSS_MARGIN_MB
    )
    r = bench.results.add(
        Row(scenario, f"worker RSS while {n} runs wait", "MB", *_both(rss),
            target="relaykit < 100 MB", absolute=True)
    )
    r.ok = r.relaykit is not None and r.relaykit.max < RSS_TARGET_MB
    bench.results.add(Row(scenario, f"RSS per waiting run, {label}", "kB", *_both(per_run_kb)))
    bench.results.add(
        Row(scenario, f"worker CPU while they wait, {label}", "ms/s", *_both(idle_cpu),
            note=f"over {IDLE_WINDOW_S:g} s")
    )
    bench.results.add(
        Row(scenario, f"time to start and park all, {label}", "s", *_both(park),
            note="polls visibility every 0.2 s")
    )
    bench.results.add(
        Row(scenario, f"time to answer all, {label}", "s", *_both(answer),
            note="relaykit: approve --all's path, a listing then signals; floor: signals")
    )
    bench.results.add(Row(scenario, f"time until all finished, {label}", "s", *_both(drain)))


# --- 6. replay --------------------------------------------------------------------------------

REPLAY_TURNS = 300


async def _history_of(bench: Bench, system: str, k: int) -> Any:
    if (system, k) not in bench.histories:
        _, handle = await bench.timed(bench.start_turns(bench.worker(system), k))
        bench.histories[(system, k)] = await bench.history_chain(handle)
    return bench.histories[(system, k)]


async def replay(bench: Bench) -> None:
    """``temporalio.worker.Replayer`` over a finished 300-turn history, in this process."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from relaykit import registry
    from relaykit.graph import AgentGraph
    from relaykit.sandbox import sandbox_runner
    from relaykit.workflows.agent_run import AgentRun

    from bench.agents import build_agents
    from bench.floor import FLOOR_WORKFLOWS
    from bench.worker import floor_runner

    scenario = "6 replay"
    reps = bench.settings.repetitions(5, 2)
    histories = {system: await _history_of(bench, system, REPLAY_TURNS) for system in SYSTEMS}
    graph = AgentGraph.build(build_agents(bench.model_url))
    # The recording worker found relaykit's search attributes registered (the dev server does
    # that), so its runs upserted them; replay must make the same decision.
    graph.search_attributes = True
    # Inside a Replayer, workflow.info().task_queue is not the recorded queue but
    # "replay-<build id>", so that is where AgentRun looks its graph up.
    build_id = "bench-replay"
    task_queue = f"replay-{build_id}"
    registry.register(task_queue, graph)
    replayers = {
        "relaykit": Replayer(
            workflows=[AgentRun], workflow_runner=sandbox_runner(),
            data_converter=pydantic_data_converter, build_id=build_id,
        ),
        "floor": Replayer(
            workflows=FLOOR_WORKFLOWS, workflow_runner=floor_runner(),
            data_converter=pydantic_data_converter,
        ),
    }

    async def once(system: str) -> float:
        began = time.perf_counter()
        for history in histories[system]:  # one history per run of a continue-as-new chain
            await replayers[system].replay_workflow(history)
        return time.perf_counter() - began

    try:
        for system in SYSTEMS:
            await once(system)  # warm-up: sandbox imports
        seconds = _per_system()
        for _, order in rounds(reps):
            for system in order:
                seconds[system].append(await once(system))
    finally:
        registry.unregister(task_queue, graph)
    runs = len(histories["relaykit"])
    bench.results.add(
        Row(scenario, f"replay of a {REPLAY_TURNS}-turn history", "ms",
            Summary.of([v * 1000 for v in seconds["relaykit"]]),
            Summary.of([v * 1000 for v in seconds["floor"]]),
            note=f"{runs} workflow runs" if runs > 1 else "")
    )


SCENARIOS: dict[str, Callable[[Bench], Awaitable[None]]] = {
    "latency": latency,
    "history": history,
    "throughput": throughput,
    "fanout": fanout,
    "idle": idle,
    "replay": replay,
}
