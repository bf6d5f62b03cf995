"""A fleet sharing its model providers: provider queues and their limits, on the real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, start_run
from relaykit.runs import MODEL_ACTIVITY
from relaykit.testing.scripted_server import ScriptedModelServer, text
from tests.support import history_events, scripted_model, serving


async def model_call_queues(handle: object) -> list[str]:
    """The task queue of every model call the run scheduled, from its history."""
    return [
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in await history_events(handle)  # type: ignore[arg-type]
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_ACTIVITY
    ]


async def test_model_calls_run_on_their_providers_queue_served_by_the_same_worker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    derived = scripted_model(model_server)
    named = scripted_model(model_server, task_queue=f"gpu-{uuid.uuid4().hex[:8]}")
    model_server.script(derived.name, [text("one")])
    model_server.script(named.name, [text("two")])
    first = Agent(name="first", model=derived)
    second = Agent(name="second", model=named)
    async with serving(client, [first, second]) as worker:
        one = await start_run(client, first, "hi", task_queue=worker.task_queue)
        two = await start_run(client, second, "hi", task_queue=worker.task_queue)
        assert (await one.result()).output == "one"
        assert (await two.result()).output == "two"
    assert await model_call_queues(one.workflow) == [f"{worker.task_queue}.model.openai"]
    assert await model_call_queues(two.workflow) == [named.task_queue]


async def test_a_worker_limit_of_two_never_has_more_than_two_requests_in_flight(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text(f"answer {i}", delay=0.4) for i in range(6)])
    agent = Agent(name="limited", model=model)
    async with serving(client, agent, model_limits={"openai": "2"}) as worker:
        handles = [
            await start_run(client, agent, f"q{i}", task_queue=worker.task_queue) for i in range(6)
        ]
        results = await asyncio.gather(*(h.result() for h in handles))
    assert sorted(r.output for r in results) == [f"answer {i}" for i in range(6)]
    assert model_server.peak_in_flight(model.name) == 2


WORKER_COMMAND = (sys.executable, "-m", "relaykit.cli", "worker", "tests.fleet_agents")


def _worker_process(
    address: str, server: ScriptedModelServer, model: str, queue: str, tmp: Path, *args: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        TEMPORAL_NAMESPACE="default",
        FLEET_MODEL_URL=server.base_url,
        FLEET_MODEL_NAME=model,
        RELAYKIT_STORE=(tmp / "store").as_uri(),  # shared: model calls read transcripts by ref
        RELAYKIT_MODEL_LIMITS="openai=2/s",
        PYTHONUNBUFFERED="1",
    )
    log = open(tmp / f"worker-{uuid.uuid4().hex[:6]}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        [*WORKER_COMMAND, "--task-queue", queue, *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def test_a_cluster_rate_limit_holds_across_two_worker_processes(
    client: Client, model_server: ScriptedModelServer, temporal_server: Any, tmp_path: Path
) -> None:
    # Two processes poll the provider queue (one of them a dedicated model worker): each could
    # send every call at once, but the server dispatches 2 a second across both.
    model = f"fleet-{uuid.uuid4().hex[:10]}"
    queue = f"fleet-{uuid.uuid4().hex[:10]}"
    model_server.script(model, [text(f"answer {i}") for i in range(8)])
    args = (temporal_server.address, model_server, model, queue, tmp_path)
    procs = [_worker_process(*args), _worker_process(*args, "--models-only")]
    try:
        handles = [
            await start_run(client, "fleet_agent", f"q{i}", task_queue=queue) for i in range(8)
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout=90)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    assert sorted(r.output for r in results) == [f"answer {i}" for i in range(8)]
    arrivals = sorted(r.at for r in model_server.requests(model))
    assert len(arrivals) == 8
    # 8 calls at 2 a second (a burst of a couple allowed) take well over two seconds
    assert arrivals[-1] - arrivals[0] >= 2.0, arrivals
    assert all(b - a >= 1.0 for a, b in zip(arrivals, arrivals[3:], strict=False)), arrivals
    assert await model_call_queues(handles[0].workflow) == [f"{queue}.model.openai"]
