"""How fast the console's first page of runs renders with many runs parked on approvals.

    python -m bench.console                   # 10,000 runs waiting for a person
    python -m bench.console --runs 1000 --reps 5

One process holds a relaykit worker, the scripted model server and the console's application
(called in process, through httpx's ASGI transport: the figure is the console's own work plus
Temporal's, without a socket); the Temporal dev server runs in its own. Each run asks for one
tool call that needs approval and waits there. The figure is the wall time of ``GET /`` (the
runs list: one visibility page, the counts per reason, a ``describe`` and the pending approvals
of each row shown, the HTML), median and worst of ``--reps``, first with 10 runs parked, then
with ``--runs``: paging comes from visibility, so the two should be close.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid

import httpx

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
        model = ModelSpec(name=f"bench-{uuid.uuid4().hex[:6]}", base_url=f"{models.base_url}/v1")
        models.respond(
            model.name,
            lambda req: text("done") if req.tool_results else call("refund", order=1),
        )
        agent = Agent(name="bench_console", model=model, tools=[refund])
        client = await connect(server.address)
        queue = f"bench-console-{uuid.uuid4().hex[:6]}"
        app = console_app(client, People(local_user="bench"))
        transport = httpx.ASGITransport(app=app)
        gate = asyncio.Semaphore(START_CONCURRENCY)

        async def start_one(_: int) -> None:
            async with gate:
                await start_run(client, agent, "refund order 1", task_queue=queue)

        async with (
            Worker(client, [agent], task_queue=queue),
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
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.reps))
