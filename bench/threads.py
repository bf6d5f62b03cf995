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
from pathlib import Path
from typing import Any

from bench.context import gather_limited, side_by_side

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
    return await side_by_side(
        "threads",
        lambda b, s: measure_system(b, s, args.runs, args.turns),
        runs=args.runs,
        turns=args.turns,
    )


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
    result = asyncio.run(measure(parser.parse_args()))
    print(table(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
