"""A fleet sharing its model providers: provider queues and their limits, on the real server."""

from __future__ import annotations

import asyncio
import uuid

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
