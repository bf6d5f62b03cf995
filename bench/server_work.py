"""``python -m bench.server_work``: what the Temporal server does for a run, counted, not timed.

The throughput scenario's server CPU per turn is a share of a machine the server splits with the
worker: on two cores the two together use all of it in every round, so each one's CPU per turn
follows the round's speed (bench/README.md, "What the 200-run round measures"). The server's
own counters do not: this runs ``--runs`` runs of ``--turns`` turns (``--concurrency`` at once)
on a fresh worker of each system, reads the dev server's Prometheus metrics before and after,
and prints the requests per run by operation (the services' and the persistence's), beside the
cores each process used and the runs per second.

``--pin`` puts the server on the first CPU and the worker and model server on the second: a
reference for what each process does when it does not compete for the same core.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import re
import socket
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from bench.context import Bench, Settings, gather_limited, standalone_bench
from bench.procs import cpu_seconds
from bench.report import SYSTEMS

COUNTERS = ("service_requests", "persistence_requests", "visibility_persistence_requests")
_LINE = re.compile(r"^(\w+)\{(.*)\} ([0-9.e+]+)$")
_LABEL = re.compile(r'(\w+)="([^"]*)"')


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def scrape(url: str) -> dict[tuple[str, str], float]:
    """(counter, operation) -> its value, summed over the other labels (services, namespaces)."""
    counts: dict[tuple[str, str], float] = collections.defaultdict(float)
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    for line in text.splitlines():
        match = _LINE.match(line)
        if match is None or match.group(1) not in COUNTERS:
            continue
        labels = dict(_LABEL.findall(match.group(2)))
        counts[(match.group(1), labels.get("operation", "?"))] += float(match.group(3))
    return counts


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of ``pid`` on ``cpus`` (threads started later inherit it)."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except OSError:  # the thread ended
            continue


@dataclass
class Work:
    requests: dict[tuple[str, str], float]
    """(counter, operation) -> requests per run."""
    runs_per_second: float
    worker_ms: float
    server_ms: float
    worker_cores: float
    server_cores: float

    def rows(self) -> dict[str, float]:
        return {
            "runs per second": self.runs_per_second,
            "worker CPU per turn, ms": self.worker_ms,
            "server CPU per turn, ms": self.server_ms,
            "worker CPU, cores": self.worker_cores,
            "server CPU, cores": self.server_cores,
        }


async def measure(bench: Bench, system: str, metrics: str, args: argparse.Namespace) -> Work:
    worker = bench.start_worker(system)
    try:
        await bench.timed(bench.start_turns(worker, 2))  # warm-up: imports, caches, pollers
        if args.pin:
            pin(worker.pid, {1})
        await asyncio.sleep(1)  # the warm-up's last visibility writes
        pids = {"worker": worker.pid, "server": bench.server_pid or 0}
        cpu = {name: cpu_seconds(pid) for name, pid in pids.items()}
        before = scrape(metrics)
        began = time.perf_counter()
        handles = await gather_limited(
            lambda _: bench.start_turns(worker, args.turns), range(args.runs), args.concurrency
        )
        await gather_limited(bench.result, handles, args.concurrency)
        seconds = time.perf_counter() - began
        after = scrape(metrics)
        used = {name: cpu_seconds(pid) - cpu[name] for name, pid in pids.items()}
    finally:
        worker.stop()
    turns = args.runs * args.turns
    return Work(
        requests={k: (after[k] - before.get(k, 0.0)) / args.runs for k in after},
        runs_per_second=args.runs / seconds,
        worker_ms=used["worker"] * 1000 / turns,
        server_ms=used["server"] * 1000 / turns,
        worker_cores=used["worker"] / seconds,
        server_cores=used["server"] / seconds,
    )


async def main(args: argparse.Namespace) -> None:
    port = _free_port()
    settings = Settings(
        server_args=("--metrics-port", str(port)), model_on_run_queue=args.model_on_run_queue
    )
    metrics = f"http://127.0.0.1:{port}/metrics"
    async with standalone_bench(settings, "server-work") as bench:
        if args.pin:
            if (os.cpu_count() or 1) < 2 or bench.server_pid is None:
                raise SystemExit("--pin needs two CPUs and the server's process")
            pin(bench.server_pid, {0})
            pin(bench.model_pid, {1})
        found = {system: await measure(bench, system, metrics, args) for system in SYSTEMS}
    options = [f"{args.concurrency} at once"]
    options += ["pinned"] if args.pin else []
    options += ["model on the run queue"] if args.model_on_run_queue else []
    print(f"\n{args.runs} runs of {args.turns} turns, {', '.join(options)}\n")
    print("| per run | " + " | ".join(SYSTEMS) + " |")
    print("|---|" + "---|" * len(SYSTEMS))
    first = found[SYSTEMS[0]].requests
    keys = {k for work in found.values() for k, v in work.requests.items() if v >= 0.05}
    for key in sorted(keys, key=lambda k: (COUNTERS.index(k[0]), -first.get(k, 0.0))):
        cells = [f"{found[s].requests.get(key, 0.0):.1f}" for s in SYSTEMS]
        print(f"| {key[0]} {key[1]} | " + " | ".join(cells) + " |")
    for row in found[SYSTEMS[0]].rows():
        print(f"| {row} | " + " | ".join(f"{found[s].rows()[row]:.2f}" for s in SYSTEMS) + " |")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=100)
    parser.add_argument("--turns", type=int, default=10)
    parser.add_argument("--concurrency", type=int, default=100)
    parser.add_argument("--pin", action="store_true", help="server on CPU 0, the rest on CPU 1")
    parser.add_argument("--model-on-run-queue", action="store_true")
    asyncio.run(main(parser.parse_args()))


if __name__ == "__main__":
    cli()
