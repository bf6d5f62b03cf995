"""``python -m bench.threads``: a worker's CPU per turn by thread, relaykit beside the floor.

``python -m bench`` counts a worker process's CPU seconds; ``python -m bench.profile`` samples
only Python code holding the GIL. Between the two is the CPU the worker spends outside Python:
Temporal's Core SDK (Rust threads: gRPC, protobuf, the workflow state machines) and the kernel.
This runs the throughput workload (``--runs`` concurrent runs of ``--turns`` turns) on a fresh
worker of each system and reads, from ``/proc/<pid>/task/*/stat``, the user and system CPU of
each thread before and after; threads are grouped (the Python main thread, the SDK's threads
that run workflow activations and any thread pool, Core's Rust threads).

Prints a markdown table and one JSON line (the figures, the load average, the commit).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import statistics
from pathlib import Path
from typing import Any

from bench.context import gather_limited, side_by_side
from bench.report import SYSTEMS

TICKS = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float, float]]:
    """Per thread id: (name, user seconds, system seconds)."""
    threads = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            stat = (task / "stat").read_text()
        except OSError:  # the thread ended
            continue
        name = stat[stat.index("(") + 1 : stat.rindex(")")]
        fields = stat[stat.rindex(")") + 2 :].split()
        threads[int(task.name)] = (name, int(fields[11]) / TICKS, int(fields[12]) / TICKS)
    return threads


def group(name: str, tid: int, pid: int) -> str:
    """Python does not name its threads for the OS, so they carry the process's name."""
    if tid == pid:
        return "Python main thread (event loop: activities, payload conversion, polling)"
    if name.startswith(("tokio", "workflow-proces")):
        return "Core SDK (Rust: gRPC, protobuf, workflow state machines)"
    if name == "python":
        return "other Python threads (workflow activations, thread pools)"
    return f"other ({name})"


async def measure_system(bench: Any, system: str, runs: int, turns: int) -> dict[str, Any]:
    worker = bench.start_worker(system)
    pid = worker.pid
    try:
        await bench.result(await bench.start_turns(worker, 2))  # warm-up
        before = thread_cpu(pid)
        handles = await gather_limited(lambda _: bench.start_turns(worker, turns), range(runs), 100)
        await gather_limited(bench.result, handles, 200)
        after = thread_cpu(pid)
    finally:
        worker.stop()
    used: dict[str, list[float]] = collections.defaultdict(lambda: [0.0, 0.0])
    for tid, (name, user, system_s) in after.items():
        _, user0, system0 = before.get(tid, (name, 0.0, 0.0))
        key = group(name, tid, pid)
        used[key][0] += user - user0
        used[key][1] += system_s - system0
    done = runs * turns
    return {key: [u / done * 1000, s / done * 1000] for key, (u, s) in used.items()}


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    result = await side_by_side(
        "threads",
        lambda b, s: measure_system(b, s, args.runs, args.turns),
        reps=args.reps,
        runs=args.runs,
        turns=args.turns,
    )
    if args.reps == 1:
        return result
    # Each system's figures are its median round (by CPU per turn, all threads); every round's
    # total and ratio are kept beside them, since one round's ratio says little.
    totals = {system: [_total(figures) for figures in result[system]] for system in SYSTEMS}
    ratios = [
        mine / theirs for mine, theirs in zip(totals["relaykit"], totals["floor"], strict=True)
    ]
    for system in SYSTEMS:
        rounds_ = result[system]
        result[system] = rounds_[totals[system].index(statistics.median_low(totals[system]))]
    result["rounds"] = {
        **{f"{system}_ms_per_turn": [round(t, 2) for t in totals[system]] for system in SYSTEMS},
        "ratio": [round(r, 2) for r in ratios],
        "median_ratio": round(statistics.median(ratios), 2),
    }
    return result


def _total(figures: dict[str, list[float]]) -> float:
    return sum(user + system for user, system in figures.values())


def table(result: dict[str, Any]) -> str:
    lines = [
        "| worker CPU per turn, ms (user + system) | relaykit | floor |",
        "|---|---|---|",
    ]
    names = sorted({*result["relaykit"], *result["floor"]})
    totals = {"relaykit": 0.0, "floor": 0.0}
    for name in names:
        cells = []
        for system in ("relaykit", "floor"):
            user, system_s = result[system].get(name, [0.0, 0.0])
            totals[system] += user + system_s
            cells.append(f"{user + system_s:.2f} ({user:.2f} + {system_s:.2f})")
        lines.append(f"| {name} | {cells[0]} | {cells[1]} |")
    lines.append(f"| **all threads** | **{totals['relaykit']:.2f}** | **{totals['floor']:.2f}** |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument(
        "--reps",
        type=int,
        default=1,
        help="rounds per system, alternating which goes first; the table shows each system's "
        "median round, and every round's ratio is printed under it",
    )
    args = parser.parse_args()
    if args.reps < 1:
        parser.error(f"--reps must be at least 1, got {args.reps}")
    result = asyncio.run(measure(args))
    print(table(result))
    if "rounds" in result:
        rounds_ = result["rounds"]
        print(f"\nratio per round: {rounds_['ratio']}, median {rounds_['median_ratio']}x")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
