"""``python -m bench``: run the scenarios against relaykit and the bare-Temporal floor.

Starts an in-memory, headless Temporal dev server on a free port (relaykit's ``DevServer``) and
the scripted model server, runs the chosen scenarios (each one round-robin between the two
systems), prints a markdown table and writes ``bench/results/latest.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import os
import platform
import subprocess
import sys
import time
import traceback
from pathlib import Path
from typing import Any

RESULTS_PATH = Path(__file__).resolve().parent / "results" / "latest.json"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    from bench.scenarios import SCENARIOS

    parser = argparse.ArgumentParser(
        prog="python -m bench", description="relaykit orchestration overhead vs bare Temporal"
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (a smoke run)")
    parser.add_argument(
        "--scenarios",
        default=",".join(SCENARIOS),
        help=f"comma-separated subset of: {', '.join(SCENARIOS)} (default: all)",
    )
    parser.add_argument("--latency-ms", type=float, default=0.0, help="model latency (default 0)")
    parser.add_argument(
        "--response-bytes", type=int, default=100,
        help="assistant text in each tool-calling model answer (default 100)",
    )
    parser.add_argument(
        "--idle-runs", type=int, default=None,
        help="runs parked in the idle scenario (default 1000, or 100 with --quick)",
    )
    parser.add_argument(
        "--throughput-runs", type=int, default=None,
        help="concurrent runs in the throughput scenario (default 100)",
    )
    parser.add_argument(
        "--reps", type=int, default=None, help="repetitions of every scenario (overrides defaults)"
    )
    parser.add_argument(
        "--max-cached-workflows", type=int, default=None,
        help="sticky cache size of both workers (default: the SDK's, 1000)",
    )
    parser.add_argument(
        "--floor-lean-runner", action="store_true",
        help="the floor's worker on relaykit's sandbox runner instead of the stock one (a "
        "reference: what that runner alone saves a bare workflow)",
    )
    parser.add_argument(
        "--floor-http", action="store_true",
        help="the floor's model activity makes relaykit's HTTP call to the scripted model server "
        "instead of returning at once (a reference: what the model call itself costs)",
    )
    parser.add_argument(
        "--model-on-run-queue", action="store_true",
        help="relaykit's model calls on the run's own task queue (ModelSpec.task_queue) instead "
        "of the provider queue (a reference: what the provider queue costs)",
    )
    parser.add_argument("--json", type=Path, default=RESULTS_PATH, help="where to write JSON")
    args = parser.parse_args(argv)
    args.scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if args.throughput_runs is not None and args.throughput_runs < 1:
        parser.error(f"--throughput-runs must be at least 1, got {args.throughput_runs}")
    unknown = [name for name in args.scenarios if name not in SCENARIOS]
    if unknown:
        parser.error(f"unknown scenario(s): {', '.join(unknown)}")
    return args


def machine_info() -> dict[str, Any]:
    import temporalio

    from relaykit.devserver import find_temporal_cli

    try:
        cli = subprocess.run(
            [find_temporal_cli(), "--version"], capture_output=True, text=True, timeout=30
        ).stdout.strip()
    except Exception as exc:  # noqa: BLE001 - informational only
        cli = f"unknown ({exc})"
    mem_total = ""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemTotal"):
                    mem_total = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
    except OSError:
        pass
    cpu_model = ""
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    cpu_model = line.partition(":")[2].strip()
                    break
    except OSError:
        pass
    return {
        "python": platform.python_version(),
        "temporalio": temporalio.__version__,
        "temporal_cli": cli,
        "cpus": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count(),
        "cpu_model": cpu_model,
        "memory": mem_total,
        "platform": platform.platform(),
    }


def source_info() -> dict[str, Any]:
    """The commit measured, and whether relaykit's files differ from it."""
    from bench.procs import ROOT

    def git(*argv: str) -> str:
        try:
            return subprocess.run(
                ["git", *argv], cwd=ROOT, capture_output=True, text=True, timeout=30
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    changed = git("status", "--porcelain", "--", "relaykit")
    return {
        "commit": git("rev-parse", "--short", "HEAD"),
        "relaykit_uncommitted_changes": len(changed.splitlines()) if changed else 0,
    }


async def run(args: argparse.Namespace) -> int:
    from bench.context import Settings, standalone_bench
    from bench.procs import leftover_children
    from bench.report import Results, markdown_table, targets_table, write_json
    from bench.scenarios import SCENARIOS, THROUGHPUT_RUNS

    settings = Settings(
        quick=args.quick,
        latency_ms=args.latency_ms,
        response_bytes=args.response_bytes,
        idle_runs=args.idle_runs,
        throughput_runs=args.throughput_runs,
        reps=args.reps,
        max_cached_workflows=args.max_cached_workflows,
        floor_lean_runner=args.floor_lean_runner,
        floor_http=args.floor_http,
        model_on_run_queue=args.model_on_run_queue,
    )
    results = Results()
    results.meta = {
        "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "options": {
            "quick": args.quick,
            "scenarios": args.scenarios,
            "latency_ms": args.latency_ms,
            "response_bytes": args.response_bytes,
            "idle_runs": settings.idle_n,
            "throughput_runs": settings.throughput_runs or THROUGHPUT_RUNS,
            "reps": args.reps,
            "max_cached_workflows": args.max_cached_workflows,
            "floor_lean_runner": args.floor_lean_runner,
            "floor_http": args.floor_http,
            "model_on_run_queue": args.model_on_run_queue,
        },
        "machine": machine_info(),
        "relaykit": source_info(),
    }
    began = time.monotonic()
    async with standalone_bench(settings, "main", results) as bench:
        for name in args.scenarios:
            print(f"== {name}", file=sys.stderr, flush=True)
            started = time.monotonic()
            load_before = os.getloadavg()[0]
            try:
                await SCENARIOS[name](bench)
            except Exception as exc:  # noqa: BLE001 - report it, run the others
                results.failures[name] = "".join(
                    traceback.format_exception_only(type(exc), exc)
                ).strip()
                traceback.print_exc()
            results.meta.setdefault("scenarios", {})[name] = {
                "seconds": round(time.monotonic() - started, 1),
                "load_average_before": load_before,
                "load_average_after": os.getloadavg()[0],
            }
    left = leftover_children()
    results.meta["seconds"] = round(time.monotonic() - began, 1)
    results.meta["leftover_processes"] = [f"{pid} {name}" for pid, name in left]
    write_json(results, args.json)

    opts = results.meta["options"]
    print(
        f"\n## relaykit vs bare-Temporal floor (latency {opts['latency_ms']:g} ms, "
        f"response {opts['response_bytes']} B{', quick' if args.quick else ''})\n"
    )
    print(markdown_table(results.rows))
    print("\n### Targets\n")
    print(targets_table(results.rows))
    if results.failures:
        print("\n### Failed scenarios\n")
        for name, error in results.failures.items():
            print(f"- {name}: {error}")
    print(f"\nprocesses left behind: {len(left)}; took {results.meta['seconds']:.0f} s; "
          f"JSON: {args.json}")
    return 1 if results.failures or left else 0


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sys.exit(asyncio.run(run(args)))


if __name__ == "__main__":
    main()
