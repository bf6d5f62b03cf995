"""``python -m bench.parked_memory``: what one parked run holds in a worker's Python heap, by
where it was allocated, relaykit beside the floor.

For each system, one fresh worker traces its allocations (``BENCH_TRACEMALLOC`` in
``bench/worker.py``): a warm-up run is parked and answered, ``--runs`` runs are parked and the
worker writes a snapshot, ``--runs`` more are parked and it writes another. The difference
between the two snapshots, divided by ``--runs``, is what a parked run adds; each allocation is
counted under the first group of :data:`GROUPS` its stack shows (``--frames`` deep).

Then a second fresh worker, which traces nothing, parks the same runs, and at both moments reads
its RSS and ``malloc``'s own count of the bytes in use (glibc's ``mallinfo2``). That count less
Python's blocks over 512 bytes (Python takes them from ``malloc``; the traced worker tells their
size) is what the rest of the process holds per parked run: mostly Core's Rust side, its copy
of each cached run (Python's few small raw allocations, ``PyMem_RawMalloc``, also count there:
an approximation). Tracing's own records come from ``malloc`` too, so the untraced worker gives
these two figures. ``python -m bench --scenarios idle`` remains the figure for RSS.
``--floor-extra`` makes the floor's runs issue one more kind of command before their wait (a
marker, a local activity, a large summary), to tell what Core keeps per command.

Prints a markdown table and one JSON line (the figures, the load average, the commit).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import json
import os
import re
import signal
import tempfile
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

from bench.context import Bench, Settings, Worker, gather_limited, side_by_side
from bench.floor import APPROVAL_EXTRAS
from bench.scenarios import _wait_parked

#: (group, test on the allocation's frames as "file:line" texts); the first that matches counts.
GROUPS: list[tuple[str, Callable[[list[str]], bool]]] = [
    (
        "payload conversion (converters, type adapters)",
        lambda f: _any(f, "converter", "payload_conversion"),
    ),
    (
        "relaykit's models (state, events, input, messages)",
        lambda f: _any(f, "pydantic/", "relaykit/runs.py", "relaykit/messages.py"),
    ),
    ("relaykit's workflow code", lambda f: _any(f, "relaykit/workflows/")),
    (
        "relaykit's activity side (transcripts, model client)",
        lambda f: _any(
            f,
            "relaykit/activities/",
            "relaykit/transcripts",
            "relaykit/models/",
            "httpx",
            "httpcore",
        ),
    ),
    ("relaykit, other", lambda f: _any(f, "relaykit/")),
    ("Temporal SDK: workflow instance and sandbox", lambda f: _any(f, "temporalio/worker/")),
    ("Temporal SDK: other", lambda f: _any(f, "temporalio/")),
    ("other", lambda f: True),
]


def _any(frames: list[str], *needles: str) -> bool:
    return any(needle in frame for frame in frames for needle in needles)


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    raise RuntimeError(f"no VmRSS for {pid}")


#: Python takes blocks over this size from ``malloc``, smaller ones from its own arenas.
SMALL_REQUEST_THRESHOLD = 512


async def _snapshot(
    worker: Worker, directory: Path, taken: int, traced: bool
) -> tuple[tracemalloc.Snapshot | None, dict[str, int]]:
    """The worker writes its snapshot (if it traces) and then its malloc count."""
    os.kill(worker.pid, signal.SIGUSR1)
    stem = directory / f"{worker.pid}-{taken}"
    malloc = Path(f"{stem}.malloc.json")
    for _ in range(600):
        await asyncio.sleep(0.1)
        if malloc.exists():
            snapshot = tracemalloc.Snapshot.load(f"{stem}.snapshot") if traced else None
            return snapshot, json.loads(malloc.read_text())
    raise TimeoutError(f"the worker wrote no snapshot {stem.name}")


def _python_large(snapshot: tracemalloc.Snapshot) -> int:
    """Bytes of Python's blocks that came from ``malloc``."""
    return sum(trace.size for trace in snapshot.traces if trace.size > SMALL_REQUEST_THRESHOLD)


def _malloc_total(malloc: dict[str, int]) -> int | None:
    return malloc["heap"] + malloc["mmapped"] if malloc else None


async def _park(bench: Bench, worker: Worker, n: int, total: int) -> None:
    await gather_limited(lambda _: bench.start_approval(worker), range(n), 50)
    await _wait_parked(bench, worker, total)
    await asyncio.sleep(2.0)  # the last workflow tasks complete, the cache settles


async def _park_twice(
    bench: Bench, system: str, runs: int, frames: int
) -> tuple[list[tuple[tracemalloc.Snapshot | None, dict[str, int]]], list[int]]:
    """A fresh worker (tracing ``frames`` deep, or not at all): a warm-up run, then ``runs``
    parked runs and a snapshot, ``runs`` more and another."""
    directory = Path(tempfile.mkdtemp(prefix="relaykit-bench-heap-", dir=bench.workdir))
    os.environ["BENCH_TRACEMALLOC"] = str(frames)
    os.environ["BENCH_TRACEMALLOC_DIR"] = str(directory)
    try:
        worker = bench.start_worker(system)
    finally:
        del os.environ["BENCH_TRACEMALLOC"], os.environ["BENCH_TRACEMALLOC_DIR"]
    snapshots, rss = [], []
    try:
        warm = await bench.start_approval(worker)
        await _wait_parked(bench, worker, 1)
        await bench.answer_approval(system, warm)
        await bench.result(warm)
        for taken in (1, 2):
            await _park(bench, worker, runs, taken * runs)
            snapshots.append(await _snapshot(worker, directory, taken, traced=frames > 0))
            rss.append(rss_kb(worker.pid))
    finally:
        worker.stop()
    return snapshots, rss


def _site(frames: list[str]) -> str:
    """Where an allocation was made, as a person would look for it: the innermost relaykit
    frame (tracemalloc lists the innermost frame last), else the innermost frame."""
    for text in reversed(frames):
        if "relaykit/" in text:
            return text[text.index("relaykit/") :]
    if not frames:
        return "?"
    innermost = frames[-1].rsplit("site-packages/", 1)[-1]
    return re.sub(r"^.*/lib/python3\.\d+/", "", innermost)  # the standard library's, by name


async def measure_system(
    bench: Bench, system: str, runs: int, frames: int, top: int = 0
) -> dict[str, Any]:
    traced, _ = await _park_twice(bench, system, runs, frames)
    first, second = traced[0][0], traced[1][0]
    assert first is not None and second is not None
    groups = dict.fromkeys((name for name, _ in GROUPS), 0.0)
    sites: collections.Counter[str] = collections.Counter()
    for stat in second.compare_to(first, "traceback"):
        texts = [
            f"{frame.filename}:{frame.lineno}"
            for frame in stat.traceback
            if not frame.filename.endswith("relaykit/sandbox.py")  # forwards the SDK's calls
        ]
        name = next(name for name, test in GROUPS if test(texts))
        groups[name] += stat.size_diff
        sites[_site(texts)] += stat.size_diff
    per_run = {name: size / runs / 1000 for name, size in groups.items()}
    python_large = (_python_large(second) - _python_large(first)) / runs / 1000
    # Untraced: tracing's own records come from malloc too, and inflate the RSS.
    untraced, rss = await _park_twice(bench, system, runs, 0)
    before, after = (_malloc_total(malloc) for _, malloc in untraced)
    outside = (
        None if before is None or after is None else (after - before) / runs / 1000 - python_large
    )
    return {
        "heap_kb_per_run": per_run,
        "sites_kb_per_run": {
            site: round(size / runs / 1000, 2) for site, size in sites.most_common(top)
        },
        "heap_kb_per_run_total": sum(per_run.values()),
        "outside_python_kb_per_run": outside,
        "rss_kb_per_run": (rss[1] - rss[0]) * 1.024 / runs,
        "gc_tracked_per_run": _tracked_per_run(untraced, runs),
    }


def _tracked_per_run(
    dumps: list[tuple[tracemalloc.Snapshot | None, dict[str, int]]], runs: int
) -> float | None:
    """Objects the garbage collector tracks per parked run: what its full collections walk."""
    counts = [malloc.get("gc_tracked") for _, malloc in dumps]
    if None in counts:
        return None
    return (counts[1] - counts[0]) / runs


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    return await side_by_side(
        "parked-memory",
        lambda b, s: measure_system(b, s, args.runs, args.frames, args.sites),
        Settings(floor_extra=args.floor_extra),
        floor_extra=args.floor_extra,
        runs=args.runs,
        frames=args.frames,
    )


def table(result: dict[str, Any]) -> str:
    relaykit, floor = result["relaykit"], result["floor"]
    lines = [
        "| Python heap per parked run, kB | relaykit | floor |",
        "|---|---|---|",
    ]
    for name, _ in GROUPS:
        mine, theirs = relaykit["heap_kb_per_run"][name], floor["heap_kb_per_run"][name]
        lines.append(f"| {name} | {mine:.1f} | {theirs:.1f} |")
    lines.append(
        f"| **Python heap in all** | **{relaykit['heap_kb_per_run_total']:.1f}** | "
        f"**{floor['heap_kb_per_run_total']:.1f}** |"
    )
    mine, theirs = relaykit["outside_python_kb_per_run"], floor["outside_python_kb_per_run"]
    if mine is not None and theirs is not None:
        lines.append(
            "| outside the Python heap (malloc in use, less Python's blocks: Core) | "
            f"{mine:.1f} | {theirs:.1f} |"
        )
    mine, theirs = relaykit.get("gc_tracked_per_run"), floor.get("gc_tracked_per_run")
    if mine is not None and theirs is not None:
        lines.append(
            f"| objects the garbage collector tracks, per parked run | {mine:.0f} | {theirs:.0f} |"
        )
    lines.append(
        "| RSS per parked run (VmRSS growth, a worker that traces nothing) | "
        f"{relaykit['rss_kb_per_run']:.1f} | "
        f"{floor['rss_kb_per_run']:.1f} |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100, help="runs parked per snapshot")
    parser.add_argument("--frames", type=int, default=8, help="frames kept per allocation")
    parser.add_argument(
        "--sites", type=int, default=0, help="also list the largest N allocation sites per system"
    )
    parser.add_argument(
        "--floor-extra",
        choices=APPROVAL_EXTRAS,
        default="",
        help="one kind of command the floor's runs add before their wait (bench/floor.py)",
    )
    result = asyncio.run(measure(parser.parse_args()))
    print(table(result))
    for system in ("relaykit", "floor"):
        for site, kb in result[system]["sites_kb_per_run"].items():
            print(f"{system}: {kb:6.2f} kB  {site}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
