"""``python -m bench.crash``: what worker crashes cost runs that use default tool settings.

Two phases on one in-memory Temporal dev server, each with 30 concurrent runs of K tool-calling
turns served by three ``relaykit worker`` processes (the real CLI, default options):

1. **no kills**: the wall time from the first start to the last result;
2. **kills**: the same load while the driver SIGKILLs the oldest serving worker 6 times, spread
   over the first three quarters of the no-kill wall time, and starts a replacement at once each
   time (the replacement needs seconds to start, on a loaded machine 10-30 s; the report lists
   them).

The target: phase 2 takes at most 2x phase 1, every run's answer and transcript are right, and no
completed call is repeated. Executions are counted outside the workers: model requests at the
scripted model server (per run and turn), tool executions in a file every tool call appends to.
A call may run more than once only as a retry of an attempt that was in flight at a kill; the
check is that every call ran at most as many times as its activity's attempt count in the run's
history (a repeated *completed* call would exceed it, or would show as an extra activity).

The tool is ``async`` with default settings (``@tool``: a ``"write"``, 10 s heartbeat timeout,
automatic heartbeats, 5 attempts). A ``work`` call in flight at a kill is therefore not run again:
its result is an unknown outcome, which the scripted model takes as done. The report counts them
(``unknown_outcomes``) and checks that no ``work`` call ran twice.

Model calls get a 5 s heartbeat timeout (a ``ModelSpec`` setting; the
default is 30 s), as the crash tests use.

Phases alternate for ``--rounds`` pairs (machine noise hits both alike); the report gives each
pair's ratio and their median.

Options: ``--runs`` (30), ``--turns`` (24), ``--kills`` (6), ``--workers`` (3), ``--rounds`` (3),
``--tool-seconds`` (0.5), ``--model-latency-ms`` (100), ``--json PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from relaykit import Agent, ModelSpec, tool

ROOT = Path(__file__).resolve().parent.parent
MODEL_NAME = "crash-bench"
AGENT = "crash_bench"
ENV_MODEL_URL = "RELAYKIT_CRASH_BENCH_MODEL_URL"
ENV_TOOL_LOG = "RELAYKIT_CRASH_BENCH_TOOL_LOG"
ENV_TOOL_SECONDS = "RELAYKIT_CRASH_BENCH_TOOL_SECONDS"


# --- what the workers serve (``relaykit worker bench.crash:agents``) ---------------------------


@tool
async def work(tag: str, step: int) -> str:
    """Do one step of work (takes a moment), recording the execution.

    Args:
        tag: The run's tag.
        step: The step number.
    """
    log = os.environ.get(ENV_TOOL_LOG)
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{tag} {step}\n")
    await asyncio.sleep(float(os.environ.get(ENV_TOOL_SECONDS, "0.5")))
    return f"{tag} step {step} done"


agents = [
    Agent(
        name=AGENT,
        instructions="Do the steps, then answer.",
        model=ModelSpec(
            provider="openai",
            name=MODEL_NAME,
            base_url=f"{os.environ.get(ENV_MODEL_URL, 'http://127.0.0.1:9')}/v1",
            heartbeat_timeout_seconds=5.0,
            timeout_seconds=60,
        ),
        tools=[work],
    )
]


# --- the model: answers by rule, counts requests per (run, turn) -------------------------------


class CountingModel:
    """Task ``crash K TAG``: call ``work(TAG, i)`` for i = 1..K, one per turn, then answer."""

    def __init__(self, latency_s: float) -> None:
        self.latency_s = latency_s
        self.lock = threading.Lock()
        self.requests: collections.Counter[tuple[str, int]] = collections.Counter()

    def __call__(self, req: Any) -> Any:
        from relaykit.testing.scripted_server import call, text

        first = next(
            (m.get("content") for m in req.messages if m.get("role") == "user"), ""
        )
        _, k, tag = str(first).split()
        done = len(req.tool_results)
        with self.lock:
            self.requests[(tag, done)] += 1
        if done < int(k):
            return call("work", tag=tag, step=done + 1, delay=self.latency_s)
        return text(f"{tag} finished {k} steps", delay=self.latency_s)


# --- the driver ------------------------------------------------------------------------------


@dataclass
class Phase:
    name: str
    task_queue: str
    tool_log: Path
    workers: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[Any] = field(default_factory=list)
    log_paths: list[Path] = field(default_factory=list)
    started_at: list[float] = field(default_factory=list)
    kills: list[float] = field(default_factory=list)
    startup_s: list[float] = field(default_factory=list)
    """How long each replacement worker took from its start to serving."""
    wall: float = 0.0


def start_worker(phase: Phase, env: dict[str, str], tmp: Path) -> subprocess.Popen[bytes]:
    path = tmp / f"{phase.name}-worker-{len(phase.workers) + 1}.log"
    log = open(path, "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "worker", "bench.crash:agents",
         "--task-queue", phase.task_queue],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
    )
    phase.workers.append(proc)
    phase.logs.append(log)
    phase.log_paths.append(path)
    phase.started_at.append(time.monotonic())
    return proc


def serving(phase: Phase, index: int) -> bool:
    """Whether worker ``index`` is alive and has said it serves (just before it polls)."""
    proc = phase.workers[index]
    return proc.poll() is None and "worker on task queue" in phase.log_paths[index].read_text()


def wait_serving(tmp: Path, phase: Phase, count: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        ready = sum(
            "worker on task queue" in (tmp / f"{phase.name}-worker-{i + 1}.log").read_text()
            for i in range(count)
        )
        if ready == count:
            time.sleep(1.0)  # the line comes just before polling starts
            return
        time.sleep(0.1)
    raise RuntimeError(f"{phase.name}: workers did not start within {timeout:g}s")


async def run_phase(
    phase: Phase, client: Any, env: dict[str, str], tmp: Path, args: argparse.Namespace,
    kill_at: list[float],
) -> list[Any]:
    from relaykit import start_run

    for _ in range(args.workers):
        start_worker(phase, env, tmp)
    await asyncio.to_thread(wait_serving, tmp, phase, args.workers)
    started = time.monotonic()
    handles = [
        await start_run(
            client, AGENT, f"crash {args.turns} {phase.name}-{i}", task_queue=phase.task_queue,
            id=f"crash-{phase.name}-{i}-{uuid.uuid4().hex[:6]}", max_turns=args.turns + 5,
        )
        for i in range(args.runs)
    ]

    async def killer() -> None:
        for at in kill_at:
            await asyncio.sleep(max(0.0, started + at - time.monotonic()))
            # The oldest worker that serves (a crash hits a working process); if none serves
            # yet, the oldest alive one.
            alive = [i for i, p in enumerate(phase.workers) if p.poll() is None]
            victim = phase.workers[next((i for i in alive if serving(phase, i)), alive[0])]
            victim.send_signal(signal.SIGKILL)
            await asyncio.to_thread(victim.wait)
            phase.kills.append(round(time.monotonic() - started, 1))
            start_worker(phase, env, tmp)

    async def watch_starts() -> None:
        seen: set[int] = set(range(args.workers))
        while True:
            for i in range(len(phase.workers)):
                if i not in seen and serving(phase, i):
                    seen.add(i)
                    phase.startup_s.append(round(time.monotonic() - phase.started_at[i], 1))
            await asyncio.sleep(0.2)

    kills = asyncio.ensure_future(killer())
    starts = asyncio.ensure_future(watch_starts())
    results = await asyncio.gather(*(h.result() for h in handles))
    phase.wall = time.monotonic() - started
    await kills
    starts.cancel()
    for proc in phase.workers:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    for proc in phase.workers:
        try:
            await asyncio.to_thread(proc.wait, 30)
        except subprocess.TimeoutExpired:
            proc.kill()
    for log in phase.logs:
        log.close()
    return list(zip(handles, results))


async def check_phase(
    phase: Phase, runs: list[Any], model: CountingModel, turns: int
) -> dict[str, Any]:
    from temporalio.api.enums.v1 import EventType

    tool_runs = collections.Counter(phase.tool_log.read_text().splitlines())
    problems: list[str] = []
    retried_attempts = 0
    unknown = 0
    for handle, result in runs:
        tag = result.output.split()[0]
        if result.output != f"{tag} finished {turns} steps":
            problems.append(f"{tag}: wrong answer {result.output!r}")
        results = [m for m in result.transcript if m.role == "tool"]
        if len(results) != turns:
            problems.append(f"{tag}: {len(results)} tool results")
        for step, message in enumerate(results, start=1):
            if message.is_error and "unknown outcome" in message.content:
                unknown += 1  # in flight at a kill: a write is reported, never run again
            elif message.content != f"{tag} step {step} done":
                problems.append(f"{tag}: wrong result for step {step}")
        scheduled: dict[int, str] = {}
        attempts: dict[int, int] = {}
        async for event in handle.workflow.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                scheduled[event.event_id] = (
                    event.activity_task_scheduled_event_attributes.activity_type.name
                )
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
                attrs = event.activity_task_started_event_attributes
                attempts[attrs.scheduled_event_id] = attrs.attempt
        model_ids = [i for i, t in scheduled.items() if t == "relaykit.model_call"]
        tool_ids = [i for i, t in scheduled.items() if t == "work"]
        if len(model_ids) != turns + 1 or len(tool_ids) != turns:
            problems.append(f"{tag}: {len(model_ids)} model and {len(tool_ids)} tool activities")
        for turn, event_id in enumerate(model_ids):
            ran, allowed = model.requests[(tag, turn)], attempts.get(event_id, 1)
            retried_attempts += allowed - 1
            if ran > allowed:
                problems.append(f"{tag}: model call of turn {turn} ran {ran}x in {allowed} attempts")
        for step, event_id in enumerate(tool_ids, start=1):
            ran, allowed = tool_runs[f"{tag} {step}"], attempts.get(event_id, 1)
            retried_attempts += allowed - 1
            if ran > allowed:
                problems.append(f"{tag}: work({step}) ran {ran}x in {allowed} attempts")
            if ran > 1:  # work is a "write" (the default): it must never run twice
                problems.append(f"{tag}: the write work({step}) ran {ran}x")
    return {
        "wall_s": round(phase.wall, 1),
        "kills_at_s": phase.kills,
        "replacement_startup_s": phase.startup_s,
        "model_requests": sum(v for (t, _), v in model.requests.items() if t.startswith(phase.name + "-")),
        "tool_executions": sum(tool_runs.values()),
        "retried_attempts": retried_attempts,
        "unknown_outcomes": unknown,
        "problems": problems,
    }


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from relaykit.devserver import DevServer
    from relaykit.testing import scripted_server
    from relaykit.testing.scripted_server import ScriptedModelServer

    scripted_server._Handler.disable_nagle_algorithm = True
    scripted_server._HTTPServer.request_queue_size = 1024
    model = CountingModel(args.model_latency_ms / 1000.0)
    tmp = Path(tempfile.mkdtemp(prefix="relaykit-crash-bench-"))
    load_before = os.getloadavg()
    with DevServer(port=0, headless=True, in_memory=True) as server, ScriptedModelServer(
        fallback=model
    ) as models:
        client = await Client.connect(server.address, data_converter=pydantic_data_converter)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
        env.update(
            TEMPORAL_ADDRESS=server.address,
            TEMPORAL_NAMESPACE="default",
            PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
            PYTHONUNBUFFERED="1",
            RELAYKIT_TRANSCRIPT_DIR=str(tmp / "transcripts"),
        )
        env[ENV_MODEL_URL] = models.base_url
        env[ENV_TOOL_SECONDS] = str(args.tool_seconds)
        report: dict[str, Any] = {
            "runs": args.runs, "turns": args.turns, "kills": args.kills, "workers": args.workers,
            "rounds": [],
        }
        for n in range(args.rounds):
            base = Phase(f"base{n}", f"crash-base-{uuid.uuid4().hex[:6]}", tmp / f"base{n}-tools.log")
            base.tool_log.touch()
            runs = await run_phase(
                base, client, {**env, ENV_TOOL_LOG: str(base.tool_log)}, tmp, args, []
            )
            no_kills = await check_phase(base, runs, model, args.turns)
            spread = base.wall * 0.75
            kill_at = [spread * (i + 1) / (args.kills + 1) for i in range(args.kills)]
            crash = Phase(f"kill{n}", f"crash-kill-{uuid.uuid4().hex[:6]}", tmp / f"kill{n}-tools.log")
            crash.tool_log.touch()
            runs = await run_phase(
                crash, client, {**env, ENV_TOOL_LOG: str(crash.tool_log)}, tmp, args, kill_at
            )
            with_kills = await check_phase(crash, runs, model, args.turns)
            ratio = round(with_kills["wall_s"] / no_kills["wall_s"], 2)
            report["rounds"].append({"no_kills": no_kills, "with_kills": with_kills, "ratio": ratio})
            print(f"round {n + 1}: no kills {no_kills['wall_s']} s, {args.kills} kills "
                  f"{with_kills['wall_s']} s, ratio {ratio}, "
                  f"{with_kills['unknown_outcomes']} unknown outcomes", file=sys.stderr, flush=True)
    ratios = sorted(r["ratio"] for r in report["rounds"])
    report["ratio_median"] = ratios[len(ratios) // 2]
    report["ratio_max"] = ratios[-1]
    report["target_met"] = report["ratio_median"] <= 2.0 and not any(
        r["no_kills"]["problems"] or r["with_kills"]["problems"] for r in report["rounds"]
    )
    report["loadavg_before"] = [round(x, 1) for x in load_before]
    report["loadavg_after"] = [round(x, 1) for x in os.getloadavg()]
    report["logs"] = str(tmp)
    return report


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.crash", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--turns", type=int, default=24)
    parser.add_argument("--kills", type=int, default=6)
    parser.add_argument("--workers", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3, help="no-kill/kill pairs (median ratio)")
    parser.add_argument("--tool-seconds", type=float, default=0.5)
    parser.add_argument("--model-latency-ms", type=float, default=100.0)
    parser.add_argument("--json", default=None, help="also write the report to this file")
    args = parser.parse_args(argv)
    report = asyncio.run(main_async(args))
    text = json.dumps(report, indent=2)
    print(text)
    if args.json:
        Path(args.json).write_text(text)
    raise SystemExit(0 if report["target_met"] else 1)


if __name__ == "__main__":
    main()
