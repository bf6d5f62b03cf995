"""How fast the console's first page of runs renders with many runs parked on approvals.

    python -m bench.console                   # 10,000 runs waiting for a person
    python -m bench.console --runs 1000 --reps 5

One process holds the scripted model server and the console's application (called in process,
through httpx's ASGI transport: the figure is the console's own work plus Temporal's, without a
socket); the relaykit worker runs in a process of its own (in the same process, the starts of
10,000 runs starved its workflow tasks into the SDK's deadlock detector), and the Temporal dev
server in its own. Each run asks for one
tool call that needs approval and waits there. The figure is the wall time of ``GET /`` (the
runs list: one visibility page, the counts per reason, a ``describe`` and the pending approvals
of each row shown, the HTML), median and worst of ``--reps``, first with 10 runs parked, then
with ``--runs``: paging comes from visibility, so the two should be close.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import time
import uuid
from typing import Any

import httpx
from temporalio.client import Client

from relaykit import Agent, ModelSpec, Worker, start_run, tool
from relaykit.client import connect
from relaykit.console.app import console_app
from relaykit.console.people import People
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, call, text

START_CONCURRENCY = 64


@tool(needs_approval=True)
def refund(order: int) -> str:
    """Refund an order.

    Args:
        order: The order number.
    """
    return f"refunded {order}"


def console_agent(model_name: str, base_url: str) -> Agent:
    model = ModelSpec(name=model_name, base_url=base_url)
    return Agent(name="bench_console", model=model, tools=[refund])


async def serve(address: str, queue: str, model_name: str, base_url: str) -> None:
    """The worker's process (``--serve``): serves the runs until it is stopped."""
    client = await connect(address)
    async with Worker(client, [console_agent(model_name, base_url)], task_queue=queue):
        await asyncio.Event().wait()


async def parked(client: object, count: int) -> int:
    query = "RelayStatus = 'waiting_approval' AND ExecutionStatus = 'Running'"
    return (await client.count_workflows(query)).count  # type: ignore[attr-defined]


async def first_page(http: httpx.AsyncClient, reps: int) -> tuple[float, float]:
    seconds = []
    for _ in range(reps):
        began = time.perf_counter()
        response = await http.get("/")
        seconds.append(time.perf_counter() - began)
        assert response.status_code == 200, response.text[:300]
        assert "Approve" in response.text
    return statistics.median(seconds), max(seconds)


async def main(runs: int, reps: int) -> None:
    with (
        DevServer(port=0, headless=True, in_memory=True) as server,
        ScriptedModelServer() as models,
    ):
        model_name = f"bench-{uuid.uuid4().hex[:6]}"
        models.respond(
            model_name,
            lambda req: text("done") if req.tool_results else call("refund", order=1),
        )
        agent = console_agent(model_name, f"{models.base_url}/v1")
        client = await connect(server.address)
        queue = f"bench-console-{uuid.uuid4().hex[:6]}"
        app = console_app(client, People(local_user="bench"))
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "bench.console",
                "--serve",
                server.address,
                queue,
                model_name,
                f"{models.base_url}/v1",
            ],
            env=os.environ.copy(),
        )
        try:
            await pages(client, agent, queue, app, runs, reps)
        finally:
            worker.terminate()
            worker.wait(30)


async def pages(client: Client, agent: Agent, queue: str, app: Any, runs: int, reps: int) -> None:
    """Park ``runs`` runs on approvals (10 first) and time the first page after each."""
    transport = httpx.ASGITransport(app=app)
    gate = asyncio.Semaphore(START_CONCURRENCY)

    async def start_one(_: int) -> None:
        async with gate:
            await start_run(client, agent, "refund order 1", task_queue=queue)

    async with (
        httpx.AsyncClient(transport=transport, base_url="http://127.0.0.1", timeout=60) as http,
    ):
        started = 0
        for target in (10, runs):
            began = time.perf_counter()
            await asyncio.gather(*(start_one(i) for i in range(target - started)))
            started = target
            while await parked(client, target) < target:
                await asyncio.sleep(1.0)
            took = time.perf_counter() - began
            median, worst = await first_page(http, reps)
            print(
                f"{target:>6} runs parked (in {took:.0f} s): first page median "
                f"{median * 1000:.0f} ms, worst {worst * 1000:.0f} ms of {reps}",
                flush=True,
            )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=10_000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--serve", nargs=4, metavar=("ADDRESS", "QUEUE", "MODEL", "URL"))
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(*args.serve))
    else:
        asyncio.run(main(args.runs, args.reps))
