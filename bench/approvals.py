"""``python -m bench.approvals``: 1,000 approvals answered by relaykit's bulk path and by the
floor's bare signals at the same moment, on the same server.

``python -m bench --scenarios idle`` answers each system's parked runs in its own round, minutes
apart; on a shared machine the load between the two rounds changes the times more than either
system does. Here both systems park ``--runs`` runs at once (one worker each, one in-memory dev
server, the scripted model server), then:

- ``listing``: the visibility listing the bulk path starts with (the waiting runs and their
  ``RelayWaitingCalls``), timed alone, answering nothing;
- ``answer all``: relaykit's ``answer_waiting`` (a listing, then a signal per call) and the
  floor's signals (one per run, its handles known) start together, ``--concurrency`` in flight
  each; each system's time is until its last signal is accepted.

Prints one JSON line with the figures, the load average before and after, and the commit.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from datetime import UTC, datetime
from typing import Any

from bench.context import Bench, Settings, Worker, gather_limited, standalone_bench
from bench.procs import commit
from bench.scenarios import _wait_parked
from relaykit.bulk_approvals import ANSWERED, answer_waiting, waiting_runs_query
from relaykit.search_attributes import RELAY_WAITING_CALLS


async def _park(bench: Bench, worker: Worker, n: int) -> list[Any]:
    warm = await bench.start_approval(worker)  # connections, sandbox imports
    await _wait_parked(bench, worker, 1)
    await bench.answer_approval(worker.system, warm)
    await bench.result(warm)
    return await gather_limited(lambda _: bench.start_approval(worker), range(n), 100)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    async with standalone_bench(Settings(), "approvals") as bench:
        client = bench.client
        relaykit, floor = bench.worker("relaykit"), bench.worker("floor")
        await _park(bench, relaykit, args.runs)
        handles = await _park(bench, floor, args.runs)
        for worker in (relaykit, floor):
            await _wait_parked(bench, worker, args.runs)
        await asyncio.sleep(2.0)
        query = f"TaskQueue = '{relaykit.task_queue}'"
        began = time.perf_counter()
        listed = [
            execution.typed_search_attributes.get(RELAY_WAITING_CALLS)
            async for execution in client.list_workflows(waiting_runs_query(query))
        ]
        listing = time.perf_counter() - began
        if len(listed) != args.runs:
            raise RuntimeError(f"listed {len(listed)} of {args.runs} parked runs")

        async def bulk() -> float:
            began = time.perf_counter()
            answers = await answer_waiting(
                client, query, by="bench", concurrency=args.concurrency
            )
            answered = sum(answer.status == ANSWERED for answer in answers)
            if answered != args.runs:
                raise RuntimeError(f"answered {answered} of {args.runs} parked runs")
            return time.perf_counter() - began

        async def signals() -> float:
            began = time.perf_counter()
            await gather_limited(
                lambda h: bench.answer_approval("floor", h), handles, args.concurrency
            )
            return time.perf_counter() - began

        load_before = os.getloadavg()[0]
        relaykit_s, floor_s = await asyncio.gather(bulk(), signals())
        load_after = os.getloadavg()[0]
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "runs": args.runs,
        "concurrency": args.concurrency,
        "listing_s": round(listing, 2),
        "relaykit_answer_all_s": round(relaykit_s, 2),
        "floor_answer_all_s": round(floor_s, 2),
        "ratio": round(relaykit_s / floor_s, 2),
        "load_average_before": round(load_before, 1),
        "load_average_after": round(load_after, 1),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=1000, help="runs parked per system")
    parser.add_argument("--concurrency", type=int, default=100, help="signals in flight each")
    args = parser.parse_args()
    print(json.dumps(asyncio.run(measure(args))))


if __name__ == "__main__":
    main()
