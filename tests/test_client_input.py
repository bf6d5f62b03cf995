"""What a client sends to start a run always has an outcome: a malformed ``AgentRun`` input (from
the ``temporal`` CLI, another SDK, a hand-written JSON) fails the run with ``InvalidRunInput``; it
never fails workflow tasks forever with the run stuck in RUNNING."""

from __future__ import annotations

import asyncio
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.exceptions import ApplicationError

from relaykit import Agent
from relaykit.testing.scripted_server import ScriptedModelServer, text
from tests.support import history_events, scripted_model, serving

NO_INPUT = object()
BAD_INPUTS: dict[str, Any] = {
    "a bare string": "hello",
    "a number": 42,
    "no input at all": NO_INPUT,
    "an agent name that is not a string": {"agent": 5},
    "no agent": {"input": "hi"},
    "max_turns below one": {"agent": "steady", "input": "hi", "max_turns": 0},
    "a budget of the wrong type": {
        "agent": "steady",
        "input": "hi",
        "budget": {"max_total_tokens": "lots"},
    },
    "a forged continue-as-new state": {
        "agent": "steady",
        "input": "hi",
        "state": {"context_ref": "../x"},
    },
    "a conversation with an unknown role": {"agent": "steady", "input": [{"role": "bogus"}]},
}


@pytest.mark.parametrize("case", list(BAD_INPUTS))
async def test_a_malformed_start_input_fails_the_run_with_invalid_run_input(
    client: Client, model_server: ScriptedModelServer, case: str
) -> None:
    model = scripted_model(model_server)
    model_server.respond(model.name, lambda request: text("ok"))
    agent = Agent(name="steady", model=model)
    bad = BAD_INPUTS[case]
    async with serving(client, agent) as worker:
        args: tuple[Any, ...] = () if bad is NO_INPUT else (bad,)
        handle = await client.start_workflow(
            "AgentRun", *args, id=f"bad-input-{uuid.uuid4().hex[:8]}", task_queue=worker.task_queue
        )
        with pytest.raises(WorkflowFailureError) as failure:
            await asyncio.wait_for(handle.result(), 30)
    cause = failure.value.cause
    assert isinstance(cause, ApplicationError) and cause.type == "InvalidRunInput"
    assert cause.non_retryable and "not a valid AgentRun input" in cause.message
    kinds = [event.event_type for event in await history_events(handle)]
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in kinds
    assert model_server.request_count(model.name) == 0


async def test_a_valid_input_written_by_hand_still_runs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.respond(model.name, lambda request: text("fine"))
    agent = Agent(name="steady", model=model)
    async with serving(client, agent) as worker:
        result = await client.execute_workflow(
            "AgentRun",
            {"agent": "steady", "input": "hi", "max_turns": 3},
            id=f"good-input-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert result["output"] == "fine"
