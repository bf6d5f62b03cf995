"""``python -m bench.run_list``: the first page of the runs list with 10,000 runs parked on
approvals, against the same page with 10.

An in-memory dev server (relaykit's search attributes registered) and the scripted model server;
one relaykit worker in this process with a bounded workflow cache parks ``--runs`` runs: each
one's first model call asks for a tool that needs approval, so the run waits (status
``waiting_approval``, ``RelayWaitingFor = 'approval'``). The worker then stops: listing needs
none (the page's descriptions and counts come from the server).

``--cheap`` parks them without a worker instead: each ``AgentRun`` starts on a queue nobody
polls with the search attributes a parked run has (what the list reads from visibility is the
same; a page's descriptions then show a first workflow task not yet taken instead of a run at
rest). It takes minutes where real runs take tens of minutes on a busy machine.

Measured, each the median of ``--reps`` (min and max too), when 10, 1,000, 5,000 and all runs
are parked (one JSON line each as it is measured, then the whole):

- ``list_runs_page``: the first page (``--page-size`` rows) with the counts per reason, as the
  console reads it;
- ``relaykit runs``: the command, as a person runs it (a new process: interpreter start, import,
  connect, the same page), next to ``relaykit --version`` (the process without the list).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import time
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes
from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit import Agent, ModelSpec, Worker, start_run, tool
from relaykit.devserver import DevServer
from relaykit.run_list import list_runs_page
from relaykit.runs import AGENT_RUN_WORKFLOW, RunInput
from relaykit.search_attributes import (
    RELAY_AGENT,
    RELAY_COST_USD,
    RELAY_LAST_ACTIVITY,
    RELAY_STATUS,
    RELAY_TOKENS,
    RELAY_WAITING_FOR,
)
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, call

QUEUE = "bench-run-list"
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@tool(needs_approval=True)
def refund(order_id: str) -> str:
    """Refund an order.

    Args:
        order_id: The order.
    """
    return f"refunded {order_id}"


def ask_for_approval(request: ScriptedRequest) -> Step:
    return call("refund", order_id="A1")


async def count_parked(client: Client) -> int:
    query = "ExecutionStatus = 'Running' AND RelayStatus = 'waiting_approval'"
    return (await client.count_workflows(query)).count


async def park(
    client: Client, agent: Agent, first: int, last: int, batch: int, cheap: bool
) -> None:
    """Start runs ``first``..``last - 1``, ``batch`` at a time, and wait until all are parked."""
    for start in range(first, last, batch):
        await asyncio.gather(
            *(
                start_cheap(client, agent, i)
                if cheap
                else start_run(client, agent, "refund A1", id=f"parked-{i:06d}", task_queue=QUEUE)
                for i in range(start, min(start + batch, last))
            )
        )
    while await count_parked(client) < last:
        await asyncio.sleep(0.5)


async def start_cheap(client: Client, agent: Agent, i: int) -> None:
    """An ``AgentRun`` nobody serves, with the search attributes of a run parked on approval."""
    attributes = TypedSearchAttributes(
        [
            SearchAttributePair(RELAY_AGENT, agent.name),
            SearchAttributePair(RELAY_STATUS, "waiting_approval"),
            SearchAttributePair(RELAY_WAITING_FOR, "approval"),
            SearchAttributePair(RELAY_TOKENS, 15),
            SearchAttributePair(RELAY_COST_USD, 0.0),
            SearchAttributePair(RELAY_LAST_ACTIVITY, datetime.now(UTC)),
        ]
    )
    await client.start_workflow(
        AGENT_RUN_WORKFLOW,
        RunInput(agent=agent.name, input="refund A1"),
        id=f"parked-{i:06d}",
        task_queue=f"{QUEUE}-nobody",
        search_attributes=attributes,
    )


def summary(samples: list[float]) -> dict[str, float]:
    return {
        "median_s": round(statistics.median(samples), 3),
        "min_s": round(min(samples), 3),
        "max_s": round(max(samples), 3),
    }


async def time_page(client: Client, page_size: int, reps: int) -> dict[str, Any]:
    """The first page with its counts, and the same page without them (the counts are the part
    that grows with the number of runs on a SQL visibility store)."""
    samples, bare = [], []
    rows = 0
    for _ in range(reps):
        started = time.perf_counter()
        page = await list_runs_page(client, page_size=page_size, counts=True)
        samples.append(time.perf_counter() - started)
        rows = len(page.rows)
        assert page.counts is not None
        started = time.perf_counter()
        await list_runs_page(client, page_size=page_size)
        bare.append(time.perf_counter() - started)
    return {
        **summary(samples),
        "rows": rows,
        "counts": page.counts,
        "without_counts": summary(bare),
    }


def time_command(address: str, reps: int, *args: str) -> dict[str, Any]:
    """``relaykit ARGS`` in a new process, as a person runs it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS=address, NO_COLOR="1", COLUMNS="200")
    samples = []
    for _ in range(reps):
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-m", "relaykit.cli", *args],
            cwd=REPO_ROOT,
            env=env,
            capture_output=True,
            text=True,
            check=False,
        )
        samples.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise RuntimeError(f"relaykit {' '.join(args)} failed: {done.stderr.strip()}")
    return summary(samples)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    with (
        DevServer(port=0, headless=True, in_memory=True) as temporal,
        ScriptedModelServer() as model_server,
    ):
        client = await Client.connect(
            temporal.address, namespace=temporal.namespace, data_converter=pydantic_data_converter
        )
        model = ModelSpec(provider="openai", name="parker", base_url=f"{model_server.base_url}/v1")
        model_server.respond(model.name, ask_for_approval)
        agent = Agent(name="parked", instructions="Refund.", model=model, tools=[refund])
        results: dict[str, Any] = {
            "runs": args.runs,
            "page_size": args.page_size,
            "cheap": args.cheap,
            "parked": {},
        }
        parking_started = time.perf_counter()
        async with Worker(
            client, [agent], task_queue=QUEUE, max_cached_workflows=args.max_cached_workflows
        ):
            parked = 0
            for checkpoint in sorted({min(n, args.runs) for n in (10, 1_000, 5_000, args.runs)}):
                await park(client, agent, parked, checkpoint, args.batch, args.cheap)
                parked = checkpoint
                measured = {
                    "parked": await count_parked(client),
                    "after_s": round(time.perf_counter() - parking_started, 1),
                    "list_runs_page": await time_page(client, args.page_size, args.reps),
                    "relaykit_runs": time_command(
                        temporal.address, args.reps, "runs", "--limit", str(args.page_size)
                    ),
                    # the same process start, import and exit without a list: what is not the list
                    "relaykit_version": time_command(temporal.address, args.reps, "--version"),
                    "load_average": [round(x, 1) for x in os.getloadavg()],
                }
                print(json.dumps(measured), file=sys.stderr, flush=True)
                results["parked"][str(checkpoint)] = measured
        return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10_000, help="runs to park (default 10000)")
    parser.add_argument("--page-size", type=int, default=50, help="rows of the first page")
    parser.add_argument("--reps", type=int, default=5, help="timings of each measurement")
    parser.add_argument("--batch", type=int, default=100, help="runs started at once")
    parser.add_argument(
        "--max-cached-workflows", type=int, default=200, help="the worker's workflow cache"
    )
    parser.add_argument(
        "--cheap", action="store_true", help="park runs without a worker (see above)"
    )
    parser.add_argument("--json", default=None, help="also write the results to this file")
    args = parser.parse_args()
    results = asyncio.run(measure(args))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as out:
            out.write(text + "\n")


if __name__ == "__main__":
    main()
