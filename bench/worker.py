"""A benchmark worker in a process of its own, so its memory and CPU can be read from ``/proc``.

``python -m bench.worker relaykit --address HOST:PORT --task-queue Q --model-url URL`` serves the
agents of :mod:`bench.agents` with :class:`relaykit.Worker`;
``python -m bench.worker floor --address HOST:PORT --task-queue Q [--latency-ms MS]
[--http-model --model-url URL]`` serves the floor's workflows (:mod:`bench.floor`) with a plain Temporal worker. Both use the default worker
options (``--max-cached-workflows`` overrides the sticky cache size of either) and the same data
converter, and both pass their own package through the workflow sandbox. Prints ``ready <pid>`` once polling; stops gracefully on SIGTERM.

With ``BENCH_TRACEMALLOC=<frames>`` in its environment the worker traces its Python allocations
from the start, and each SIGUSR1 writes a snapshot into ``BENCH_TRACEMALLOC_DIR`` (the current
directory by default): diffing two snapshots taken at N and 2N parked runs tells what a waiting
run holds in the Python heap. Beside each snapshot it writes ``malloc``'s own count of the bytes in
use (``<pid>-<n>.malloc.json``), which also counts what Core's Rust side holds; with
``BENCH_TRACEMALLOC=0`` it writes only that count, from a worker that traces nothing (tracing's
own records are ``malloc``'s too), and with it the number of objects Python's garbage collector
tracks once it has collected.

With ``BENCH_GC_LOG=<path>`` the worker counts its garbage collections and the time they took,
per generation, and writes them to ``<path>.<pid>`` as JSON when it stops.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import ctypes
import gc
import json
import os
import signal
import time
import tracemalloc
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Worker as TemporalWorker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions


def floor_runner(lean: bool = False) -> SandboxedWorkflowRunner:
    """The stock sandboxed runner, or (``lean``) relaykit's (``relaykit/sandbox.py``)."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules("bench")
    if lean:
        from relaykit.sandbox import LeanSandboxRunner

        return LeanSandboxRunner(restrictions=restrictions)
    return SandboxedWorkflowRunner(restrictions=restrictions)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def malloc_in_use() -> dict[str, int]:
    """glibc's own count of the bytes ``malloc`` has handed out and not got back: Core's Rust
    allocations and Python's blocks over 512 bytes (Python's small objects live in arenas of
    their own, which tracemalloc sees). Empty where glibc has no ``mallinfo2``."""
    try:
        mallinfo2 = ctypes.CDLL("libc.so.6").mallinfo2
    except (OSError, AttributeError):
        return {}
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {"heap": info.uordblks, "mmapped": info.hblkhd}


def _trace_allocations() -> None:
    frames = os.environ.get("BENCH_TRACEMALLOC")
    if not frames:
        return
    if int(frames) > 0:
        tracemalloc.start(int(frames))
    directory = Path(os.environ.get("BENCH_TRACEMALLOC_DIR", "."))
    taken = 0

    def dump(*_: object) -> None:
        nonlocal taken
        taken += 1
        stem = directory / f"{os.getpid()}-{taken}"
        if tracemalloc.is_tracing():
            tracemalloc.take_snapshot().dump(f"{stem}.snapshot.part")
            os.replace(f"{stem}.snapshot.part", f"{stem}.snapshot")
        counts: dict[str, int] = malloc_in_use()
        gc.collect()  # after the malloc count, which it would change
        counts["gc_tracked"] = len(gc.get_objects())
        Path(f"{stem}.malloc.part").write_text(json.dumps(counts))
        os.replace(f"{stem}.malloc.part", f"{stem}.malloc.json")

    signal.signal(signal.SIGUSR1, dump)


def _log_collections() -> None:
    path = os.environ.get("BENCH_GC_LOG")
    if not path:
        return
    collections = {generation: {"count": 0, "seconds": 0.0} for generation in range(3)}
    started = 0.0

    def timed(phase: str, info: dict[str, int]) -> None:
        nonlocal started
        if phase == "start":
            started = time.perf_counter()
            return
        entry = collections[info["generation"]]
        entry["count"] += 1
        entry["seconds"] += time.perf_counter() - started

    gc.callbacks.append(timed)
    atexit.register(lambda: Path(f"{path}.{os.getpid()}").write_text(json.dumps(collections)))


async def serve(args: argparse.Namespace) -> None:
    client = await Client.connect(args.address, data_converter=pydantic_data_converter)
    options: dict[str, Any] = {}
    if args.max_cached_workflows is not None:
        options["max_cached_workflows"] = args.max_cached_workflows
    worker: Any
    if args.system == "relaykit":
        import relaykit
        from bench.agents import build_agents

        if not args.model_url:
            raise SystemExit("--model-url is required for the relaykit worker")
        model_queue = args.task_queue if args.model_on_run_queue else None
        worker = relaykit.Worker(
            client, build_agents(args.model_url, model_queue), task_queue=args.task_queue, **options
        )
    else:
        from bench.floor import FLOOR_WORKFLOWS, floor_activities

        worker = TemporalWorker(
            client,
            task_queue=args.task_queue,
            workflows=FLOOR_WORKFLOWS,
            activities=floor_activities(
                args.latency_ms / 1000.0,
                args.model_url if args.http_model else None,
                args.response_bytes,
            ),
            workflow_runner=floor_runner(args.lean_runner),
            **options,
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    async with worker:
        print(f"ready {os.getpid()}", flush=True)
        await stop.wait()


def main(argv: list[str] | None = None) -> None:
    _log_collections()
    _trace_allocations()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("system", choices=["relaykit", "floor"])
    parser.add_argument("--address", required=True)
    parser.add_argument("--task-queue", required=True)
    parser.add_argument("--model-url", default=None)
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--max-cached-workflows", type=int, default=None)
    parser.add_argument(
        "--model-on-run-queue",
        action="store_true",
        help="relaykit: the model's calls on the run queue instead of its provider queue",
    )
    parser.add_argument(
        "--http-model",
        action="store_true",
        help="floor: the model activity makes relaykit's HTTP call to --model-url",
    )
    parser.add_argument("--response-bytes", type=int, default=100)
    parser.add_argument(
        "--lean-runner",
        action="store_true",
        help="floor: relaykit's sandbox runner instead of the stock one",
    )
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
