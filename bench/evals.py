"""``python -m bench.evals``: what a replay evaluation costs (docs/evals.md).

Records ``--runs`` runs (default 200) of the benchmark's ``looper`` with ``--turns`` tool-calling
turns each (default 10, so 11 model calls a run), then evaluates the same agent on them with
``relaykit eval`` in a process of its own: one worker (the command's), ``--concurrency``
candidates at once. Every tool call of a candidate matches the recording, so no tool runs; what
is left is the model (the scripted server, in its own process, each answer delayed by
``--latency-ms``) and relaykit: the ``RelayEval`` workflow, reading each recorded history, the
candidate runs, scoring.

Printed: the evaluation's wall time and the worker's CPU time; the model's share, i.e. the model
latency summed over every candidate call divided by ``--concurrency``, against the wall time; and
per candidate run, its wall time against its model time (``11 x latency``). relaykit's own overhead
is the rest. The machine may be loaded by other work: say so next to any figure.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
RECORD_WAVE = 20
"""Recorded runs in flight at once while recording."""


async def record(address: str, model_url: str, runs: int, turns: int, store: str) -> list[str]:
    from bench.agents import build_agents, turns_task
    from relaykit import Worker, connect, start_run

    client = await connect(address)
    ids: list[str] = []
    async with Worker(client, build_agents(model_url), task_queue="bench-recorded", store=store):
        for wave in range(0, runs, RECORD_WAVE):  # a bounded load: recording is not measured
            handles = [
                await start_run(client, "looper", turns_task(turns), task_queue="bench-recorded")
                for _ in range(min(RECORD_WAVE, runs - wave))
            ]
            await asyncio.gather(*(handle.result() for handle in handles))
            ids += [handle.id for handle in handles]
    return ids


def evaluate(address: str, model_url: str, ids: list[str], concurrency: int, folder: str) -> dict:
    """Run ``relaykit eval`` as a process; its report, wall time and CPU time."""
    report = Path(folder) / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        BENCH_MODEL_URL=model_url,
        RELAYKIT_STORE=Path(folder, "store").as_uri(),
        PYTHONPATH=str(ROOT),
    )
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    options = ["--runs", ",".join(ids), "--concurrency", str(concurrency), "--json", str(report)]
    options += ["--report", str(Path(folder) / "report.md")]
    subprocess.run(
        [sys.executable, "-m", "relaykit.cli", "eval", "bench.eval_candidate", *options],
        cwd=ROOT,
        env=env,
        check=True,
    )
    wall = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"report": json.loads(report.read_text()), "wall": wall, "cpu": cpu}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m bench.evals", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=8)
    args = parser.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop the servers on the way out

    from bench.procs import Child
    from relaykit.devserver import DevServer

    latency = args.latency_ms / 1000
    with (
        DevServer(port=0, headless=True, in_memory=True) as server,
        Child("model", ["-m", "bench.model_server", "--latency-ms", str(args.latency_ms)]) as model,
        tempfile.TemporaryDirectory(prefix="bench-evals-") as folder,
    ):
        model_url = model.info
        started = time.monotonic()
        ids = asyncio.run(
            record(server.address, model_url, args.runs, args.turns, str(Path(folder, "rec")))
        )
        recorded = time.monotonic() - started
        measured = evaluate(server.address, model_url, ids, args.concurrency, folder)
    report, wall, cpu = measured["report"], measured["wall"], measured["cpu"]
    runs = report["runs"]
    calls = args.turns + 1
    model_total = len(runs) * calls * latency
    model_share = model_total / args.concurrency / wall
    per_run = [r["candidate_seconds"] for r in runs if r["candidate_seconds"] is not None]
    run_model = calls * latency
    totals = report["totals"]
    lines = [
        f"recorded {args.runs} runs of {args.turns} turns in {recorded:.1f} s",
        f"evaluation: {totals['passed']} passed, {totals['failed']} failed, "
        f"{totals['skipped']} skipped; calls matched: {sum(r['matched'] for r in runs)}, "
        f"blocked: {totals['blocked']}",
        f"wall time: {wall:.1f} s for {len(runs)} runs at concurrency {args.concurrency} "
        f"({wall / len(runs) * 1000:.0f} ms a run); worker process CPU: {cpu:.1f} s",
        f"model time ({calls} calls x {args.latency_ms:.0f} ms a run, / concurrency): "
        f"{model_total / args.concurrency:.1f} s = {model_share:.0%} of the wall time; "
        f"relaykit's overhead: {1 - model_share:.0%}",
        f"candidate run wall time: median {statistics.median(per_run):.2f} s, "
        f"max {max(per_run):.2f} s, against {run_model:.2f} s of model time "
        f"(overhead share of a run: {1 - run_model / statistics.median(per_run):.0%})",
    ]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
