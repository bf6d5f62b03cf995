"""Where a worker's CPU goes per turn: the throughput workload under py-spy, for both systems.

``python -m bench.profile [--runs 100] [--turns 10]`` starts the same servers as ``python -m
bench``, runs ``--runs`` concurrent runs of ``--turns`` turns on a fresh worker of each system
while ``py-spy record --gil`` samples it (only samples that hold the GIL, i.e. Python CPU time),
and prints a table of milliseconds per turn by category. The raw stacks are kept in
``bench/results/profile-<system>.txt`` (py-spy's collapsed format, for flame graph tools).

py-spy is not a relaykit dependency: ``pip install py-spy``. It needs permission to ptrace the
worker (root, or ``kernel.yama.ptrace_scope=0``). Sampling slows the worker down, so the figures
are larger than the unprofiled CPU times ``python -m bench`` reports; compare the two systems'
columns with each other, not with those.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from bench.report import SYSTEMS

RESULTS_DIR = Path(__file__).resolve().parent / "results"

#: (category, test on the ";"-joined stack); the first category that matches gets the sample.
CATEGORIES: list[tuple[str, Callable[[str], bool]]] = [
    (
        "model activity: HTTP client (httpx, httpcore, aiohttp)",
        lambda s: "httpx/" in s or "httpcore/" in s or "aiohttp/" in s,
    ),
    (
        "model activity: transcript store and asyncio.to_thread hops",
        lambda s: "relaykit/transcripts" in s or "to_thread (asyncio/threads.py" in s,
    ),
    (
        "model activity: other relaykit code (providers, wire format)",
        lambda s: "relaykit/activities/model_call" in s or "relaykit/models/" in s,
    ),
    ("tool activity: tool body", lambda s: "relaykit/activities/tool_activities" in s
     or "Tool.invoke" in s),
    ("workflow code: relaykit (turn loop, run shell)", lambda s: "relaykit/" in s),
    ("workflow code: floor", lambda s: "bench/floor.py" in s),
    (
        "Temporal SDK: payload conversion and visiting",
        lambda s: "_visitor" in s or "converter" in s or "get_serialization_context" in s
        or "get_external_store" in s or "pydantic" in s,
    ),
    (
        "Temporal SDK: workflow activation and sandbox",
        lambda s: "temporalio/worker/_workflow" in s or "workflow_sandbox" in s,
    ),
    ("Temporal SDK: activity worker", lambda s: "temporalio/worker/_activity" in s),
    ("Temporal SDK: bridge to Core (protobuf)", lambda s: "temporalio/bridge/" in s),
    ("event loop, threads, other", lambda s: True),
]
DETAILS: list[tuple[str, str]] = [
    ("of which Tool.spec (JSON schema built again each turn)", "Tool.spec ("),
]


def find_py_spy() -> str | None:
    beside = Path(sys.executable).parent / "py-spy"
    return str(beside) if beside.exists() else shutil.which("py-spy")


SANDBOX_GLUE = re.compile(r"[^;]* \(relaykit/sandbox\.py:\d+\)(;|$)")
"""relaykit's runner forwards the SDK's sandbox calls (``relaykit/sandbox.py``): its frames are
left out, so those samples count where the SDK's own would."""


def categorize(path: Path) -> tuple[collections.Counter[str], int]:
    counts: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, raw = line.rpartition(" ")
        if not raw.isdigit():
            continue
        n = int(raw)
        total += n
        stack = SANDBOX_GLUE.sub("", stack)
        for name, test in CATEGORIES:
            if test(stack):
                counts[name] += n
                break
        for name, marker in DETAILS:
            if marker in stack:
                counts[name] += n
    return counts, total


async def profile(args: argparse.Namespace) -> int:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from relaykit.devserver import DevServer

    from bench.context import Bench, Settings, gather_limited
    from bench.procs import Child
    from bench.report import Results

    py_spy = find_py_spy()
    if py_spy is None:
        print("py-spy is not installed: pip install py-spy", file=sys.stderr)
        return 2
    RESULTS_DIR.mkdir(parents=True, exist_ok=True)
    workdir = tempfile.mkdtemp(prefix="relaykit-bench-")
    model = Child("model-server", ["-m", "bench.model_server"])
    outputs: dict[str, Path] = {}
    try:
        async with DevServer(port=0, headless=True, in_memory=True) as server:
            model.start()
            client = await Client.connect(server.address, data_converter=pydantic_data_converter)
            bench = Bench(Settings(), client, server.address, model.info, None, model.pid,
                          Results(), workdir)
            for system in SYSTEMS:
                worker = bench.start_worker(system)
                spy: subprocess.Popen[bytes] | None = None
                try:
                    await bench.timed(bench.start_turns(worker, 2))  # warm-up
                    out = RESULTS_DIR / f"profile-{system}.txt"
                    spy = subprocess.Popen(
                        [py_spy, "record", "--pid", str(worker.pid), "--gil", "--nonblocking",
                         "--rate", str(args.rate), "--format", "raw", "--output", str(out)],
                        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                    )
                    await asyncio.sleep(1.0)  # let py-spy attach
                    handles = await gather_limited(
                        lambda _: bench.start_turns(worker, args.turns), range(args.runs), 100
                    )
                    await gather_limited(bench.result, handles, 200)
                    spy.send_signal(signal.SIGINT)
                    _, err = spy.communicate(timeout=60)
                    if spy.returncode not in (0, -signal.SIGINT) and not out.exists():
                        print(err.decode(errors="replace"), file=sys.stderr)
                        return 1
                    outputs[system] = out
                finally:
                    if spy is not None and spy.poll() is None:
                        spy.kill()
                        spy.wait()
                    worker.stop()
    finally:
        model.stop()
        shutil.rmtree(workdir, ignore_errors=True)

    turns = args.runs * args.turns
    counted = {system: categorize(path) for system, path in outputs.items()}

    def ms(system: str, name: str) -> str:
        counts, _ = counted[system]
        return f"{counts[name] / args.rate / turns * 1000:.2f}"

    print(f"\nPython CPU (GIL held) per turn, {args.runs} concurrent runs x {args.turns} turns, "
          f"py-spy at {args.rate} Hz\n")
    print("| where | relaykit ms/turn | floor ms/turn |\n|---|---|---|")
    for name, _ in CATEGORIES:
        print(f"| {name} | {ms('relaykit', name)} | {ms('floor', name)} |")
    for name, _ in DETAILS:
        print(f"| ({name}) | {ms('relaykit', name)} | {ms('floor', name)} |")
    totals = {s: counted[s][1] / args.rate / turns * 1000 for s in counted}
    print(f"| **total** | **{totals['relaykit']:.2f}** | **{totals['floor']:.2f}** |")
    print("\nraw stacks: " + ", ".join(f"bench/results/{p.name}" for p in outputs.values()))
    return 0


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.profile", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--rate", type=int, default=200, help="py-spy samples per second")
    sys.exit(asyncio.run(profile(parser.parse_args(argv))))


if __name__ == "__main__":
    main()
