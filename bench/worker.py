"""A benchmark worker in a process of its own, so its memory and CPU can be read from ``/proc``.

``python -m bench.worker relaykit --address HOST:PORT --task-queue Q --model-url URL`` serves the
agents of :mod:`bench.agents` with :class:`relaykit.Worker`;
``python -m bench.worker floor --address HOST:PORT --task-queue Q [--latency-ms MS]`` serves the
floor's workflows (:mod:`bench.floor`) with a plain Temporal worker. Both use the default worker
options (``--max-cached-workflows`` overrides the sticky cache size of either) and the same data
converter, and both pass their own package through the workflow sandbox. Prints ``ready <pid>`` once polling; stops gracefully on SIGTERM.

With ``BENCH_TRACEMALLOC=<frames>`` in its environment the worker traces its Python allocations
from the start, and each SIGUSR1 writes a snapshot into ``BENCH_TRACEMALLOC_DIR`` (the current
directory by default): diffing two snapshots taken at N and 2N parked runs tells what a waiting
run holds in the Python heap.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
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


def _trace_allocations() -> None:
    frames = os.environ.get("BENCH_TRACEMALLOC")
    if not frames:
        return
    tracemalloc.start(int(frames))
    directory = Path(os.environ.get("BENCH_TRACEMALLOC_DIR", "."))
    taken = 0

    def dump(*_: object) -> None:
        nonlocal taken
        taken += 1
        tracemalloc.take_snapshot().dump(str(directory / f"{os.getpid()}-{taken}.snapshot"))

    signal.signal(signal.SIGUSR1, dump)


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
            activities=floor_activities(args.latency_ms / 1000.0),
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
        "--lean-runner",
        action="store_true",
        help="floor: relaykit's sandbox runner instead of the stock one",
    )
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
