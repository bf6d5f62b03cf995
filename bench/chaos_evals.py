"""``python -m bench.chaos_evals``: a seeded fuzzer of evaluations killed at random moments.

Records ``--recorded`` runs of the benchmark's ``looper`` once (``--turns`` tool calls each; the
model server answers each call after ``--latency-ms``), then for each seed runs ``relaykit eval
bench.chaos_eval_candidate`` over them (the same agent, so every call matches its recording, and a
scorer that takes :data:`SCORE_SECONDS`, as a model judging the answers would) with a drawn
``--concurrency``, SIGKILLs the command, and the worker in it, at one to three drawn moments after
it started its evaluation, runs the same command again after each kill, and lets the last one
finish. A kill may land anywhere: while a recorded run is read, a candidate's model call is in
flight, a candidate is scored or the report is written. Checks, per seed:

- the last command ends within :data:`SETTLE_SECONDS` with exit status 0: a killed worker's work
  is picked up once its heartbeat or sticky timeout passes, never at an activity's whole time
  limit;
- its report lists every recorded run in order, each passed with every call answered from its
  recording (none blocked, none run live), as an evaluation nobody killed would;
- no workflow task failed in the evaluation's workflow or in any candidate run (except
  Temporal's own concurrency, :data:`bench.chaos_checks.BENIGN_TASK_FAILURES`).

A failing seed prints what broke and ``python -m bench.chaos_evals --runs 1 --seed SEED``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from bench import chaos_checks as checks
from bench.procs import ROOT

SETTLE_SECONDS = 60.0
"""How long the last command may take: a model call's heartbeat timeout (30 s), the worker's
start and the evaluation's remaining work, on a loaded machine."""
LATENCY_MS = 100.0
"""The model's delay per answer: an evaluation of 6 runs then lasts about as long as the drawn
moments reach (2.5 s), so most kills land while it works."""
SCORE_SECONDS = 0.4
"""How long the candidate module's scorer takes per recorded run."""
START_SECONDS = 120.0
"""How long a command may take to start its evaluation (imports, the worker)."""


@dataclass
class Plan:
    """What one seed draws."""

    seed: int
    concurrency: int
    kills: list[float]
    """Seconds after each command started its evaluation, one per killed command."""

    @staticmethod
    def draw(seed: int) -> Plan:
        rng = random.Random(seed)
        kills = [round(rng.uniform(0.0, 2.5), 2) for _ in range(rng.randint(1, 3))]
        return Plan(seed=seed, concurrency=rng.randint(1, 4), kills=kills)


@dataclass
class Outcome:
    plan: Plan
    problems: list[str] = field(default_factory=list)
    settle_seconds: float | None = None
    killed: int = 0
    """Commands that were still running when their kill came (the others had finished)."""

    @property
    def failed(self) -> bool:
        return bool(self.problems)

    def report(self) -> str:
        lines = [f"seed {self.plan.seed}: {self.plan}", *(f"  - {p}" for p in self.problems)]
        lines.append(f"  again: python -m bench.chaos_evals --runs 1 --seed {self.plan.seed}")
        return "\n".join(lines)


def command_env(address: str, model_url: str, folder: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        BENCH_MODEL_URL=model_url,
        CHAOS_SCORE_SECONDS=str(SCORE_SECONDS),
        RELAYKIT_STORE=(folder / "store").as_uri(),
        PYTHONPATH=str(ROOT),
    )
    return env


async def start_command(
    env: dict[str, str], ids: list[str], eval_id: str, plan: Plan, report: Path
) -> asyncio.subprocess.Process:
    """``relaykit eval`` in a process of its own, once it printed that its evaluation started."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "relaykit.cli", "eval", "bench.chaos_eval_candidate",
        "--runs", ",".join(ids), "--eval-id", eval_id,
        "--concurrency", str(plan.concurrency), "--json", str(report),
        cwd=ROOT, env=env, stdin=asyncio.subprocess.DEVNULL,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )  # fmt: skip
    assert proc.stdout is not None
    await asyncio.wait_for(proc.stdout.readline(), START_SECONDS)  # "evaluation <id>"
    return proc


async def run_seed(
    client: object, address: str, model_url: str, ids: list[str], seed: int, folder: Path
) -> Outcome:
    plan = Plan.draw(seed)
    outcome = Outcome(plan)
    eval_id = f"chaos-eval-{seed}-{os.urandom(3).hex()}"
    report = folder / f"{eval_id}.json"
    env = command_env(address, model_url, folder)
    for delay in plan.kills:
        proc = await start_command(env, ids, eval_id, plan, report)
        try:
            await asyncio.wait_for(proc.wait(), delay)
        except TimeoutError:
            proc.send_signal(signal.SIGKILL)
            outcome.killed += 1
        await proc.wait()
    report.unlink(missing_ok=True)  # the last command writes it again
    began = time.monotonic()
    proc = await start_command(env, ids, eval_id, plan, report)
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), SETTLE_SECONDS)
    except TimeoutError:
        proc.send_signal(signal.SIGKILL)
        await proc.wait()
        outcome.problems.append(f"the last command did not end within {SETTLE_SECONDS:.0f} s")
    else:
        outcome.settle_seconds = round(time.monotonic() - began, 1)
        if proc.returncode != 0:
            tail = out.decode(errors="replace").strip().splitlines()[-5:]
            outcome.problems.append(f"the last command exited {proc.returncode}: {tail}")
        else:
            outcome.problems += report_problems(json.loads(report.read_text()), ids)
    tree = await checks.workflow_tree(client, eval_id, None)  # type: ignore[arg-type]
    wedges, _ = checks.task_failures(tree)
    outcome.problems += [f"workflow task failed: {line}" for line in wedges]
    return outcome


def report_problems(report: dict, ids: list[str]) -> list[str]:
    runs = report["runs"]
    problems = []
    if [r["recorded_run"] for r in runs] != ids:
        problems.append(f"the report lists {[r['recorded_run'] for r in runs]}, not {ids}")
    for r in runs:
        if r["verdict"] != "passed" or r["blocked"] or r["live"]:
            problems.append(
                f"{r['recorded_run']}: {r['verdict']}, {len(r['blocked'])} blocked, "
                f"{r['live']} live: {r['reason']!r}"
            )
    return problems


async def run_seeds(
    address: str, model_url: str, ids: list[str], seeds: list[int], folder: Path, concurrency: int
) -> list[Outcome]:
    from relaykit import connect

    client = await connect(address)
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> Outcome:
        async with gate:
            return await run_seed(client, address, model_url, ids, seed, folder)

    return list(await asyncio.gather(*(one(seed) for seed in seeds)))


def table(outcomes: list[Outcome]) -> str:
    lines = ["| seed | concurrency | kills drawn (s) | killed | last command (s) | result |"]
    lines.append("|---|---|---|---|---|---|")
    for o in outcomes:
        settle = "-" if o.settle_seconds is None else f"{o.settle_seconds:.1f}"
        result = "ok" if not o.failed else f"FAILED ({len(o.problems)})"
        lines.append(
            f"| {o.plan.seed} | {o.plan.concurrency} | {o.plan.kills} | {o.killed} | {settle} "
            f"| {result} |"
        )
    return "\n".join(lines)


async def record_runs(
    address: str, model_url: str, runs: int, turns: int, folder: Path
) -> list[str]:
    from bench.evals import record

    return await record(address, model_url, runs, turns, str(folder / "recorded"))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos_evals", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=10, help="seeds")
    parser.add_argument("--seed", type=int, default=1, help="the first seed")
    parser.add_argument("--recorded", type=int, default=6, help="recorded runs evaluated")
    parser.add_argument("--turns", type=int, default=3, help="tool calls per recorded run")
    parser.add_argument("--concurrency", type=int, default=2, help="seeds at once")
    parser.add_argument(
        "--latency-ms", type=float, default=LATENCY_MS, help="each model answer's delay"
    )
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out

    from bench.procs import Child
    from relaykit.devserver import DevServer

    seeds = list(range(args.seed, args.seed + args.runs))
    with (
        DevServer(port=0, headless=True, in_memory=True) as server,
        Child("model", ["-m", "bench.model_server", "--latency-ms", str(args.latency_ms)]) as model,
        tempfile.TemporaryDirectory(prefix="bench-chaos-evals-") as name,
    ):
        folder = Path(name)

        async def go() -> list[Outcome]:
            ids = await record_runs(server.address, model.info, args.recorded, args.turns, folder)
            return await run_seeds(server.address, model.info, ids, seeds, folder, args.concurrency)

        outcomes = asyncio.run(go())
    print(table(outcomes))
    failing = [o.report() for o in outcomes if o.failed]
    if failing:
        print("\n\n".join(failing))
        sys.exit(1)


if __name__ == "__main__":
    main()
