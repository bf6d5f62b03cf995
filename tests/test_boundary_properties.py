"""Property: nothing a model writes wedges a run.

Hypothesis generates turns of tool calls (names, call ids, raw argument text) and a scripted model
sends them to a real worker on the real dev server: duplicate, empty, very long and non-ASCII call
ids; arguments that are valid, mistyped, not an object, not JSON, ``NaN``, nested too deep; user
tools, a tool whose approval predicate may raise, handoffs (one with ``on_handoff``), unknown
tools. Every run must finish, its history must hold no ``WorkflowTaskFailed``, and what goes back
to the provider must be well-formed: unique ids in a turn, arguments that are JSON objects.

The number of examples is bounded for CI (``max_examples=25``). For a longer search, set
``RELAYKIT_PROPERTY_EXAMPLES``, e.g. ``RELAYKIT_PROPERTY_EXAMPLES=500 pytest
tests/test_boundary_properties.py``.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, Handoff, RunHandle, Worker, get_run, tool
from relaykit.names import is_valid_tool_name
from relaykit.runs import RunInput
from relaykit.testing.scripted_server import ScriptedModelServer, Step, batch, call, text
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW
from tests.support import history_events, scripted_model, serving

EXAMPLES = int(os.environ.get("RELAYKIT_PROPERTY_EXAMPLES", "25"))
RUN_TIMEOUT = 60.0


@tool
def echo(text: str, n: int = 0) -> str:
    """Say it back.

    Args:
        text: What to say.
        n: A number.
    """
    return f"{text}:{n}"


def _guard(args: dict[str, Any]) -> bool:
    if args["text"].startswith("!"):
        raise ValueError("the predicate does not like exclamations")
    return len(args["text"]) % 2 == 0


@tool(needs_approval=_guard)
def guarded(text: str) -> str:
    """Do something a person may have to approve.

    Args:
        text: What to do.
    """
    return f"did {text}"


TOOL_NAMES = ["echo", "guarded", "transfer_to_target", "transfer_to_other", "nope", "", "工具"]

json_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**20), max_value=10**20),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=20),
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3), st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
raw_arguments = st.one_of(
    st.builds(
        json.dumps,
        st.dictionaries(
            st.sampled_from(["text", "n", "reason", "extra", ""]), json_values, max_size=3
        ),
    ),
    st.builds(json.dumps, json_values),
    st.text(max_size=40),
    st.sampled_from(["", "{", "null", "[" * 3000 + "]" * 3000, '{"text": "' + "é" * 5000 + '"}']),
)
call_ids = st.one_of(
    st.just("dup"),
    st.just(""),
    st.text(min_size=1, max_size=12),
    st.text(alphabet="é中🙂 ", min_size=1, max_size=5),
    st.just("x" * 500),
    st.from_regex(r"call_[a-z0-9]{6}", fullmatch=True),
)
turns = st.lists(
    st.tuples(st.sampled_from(TOOL_NAMES), call_ids, raw_arguments), min_size=1, max_size=4
)


class Setup:
    """One worker for every example; each example is one run, found by its prompt."""

    def __init__(self, server: ScriptedModelServer, worker: Worker, agent: Agent) -> None:
        self.server = server
        self.worker = worker
        self.agent = agent
        self.turns: dict[str, Step] = {}
        self.handoffs: list[str] = []


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def setup(client: Client, model_server: ScriptedModelServer) -> AsyncIterator[Setup]:
    main_model, target_model = scripted_model(model_server), scripted_model(model_server)
    target = Agent(name="prop_target", model=target_model)
    other = Agent(name="prop_other", model=target_model)
    audited: list[str] = []
    agent = Agent(
        name="prop_main",
        model=main_model,
        tools=[echo, guarded],
        handoffs=[
            Handoff(target, name="transfer_to_target"),
            Handoff(
                other, name="transfer_to_other", on_handoff=lambda a, d: audited.append(d.target)
            ),
        ],
    )
    async with serving(client, agent) as worker:
        state = Setup(model_server, worker, agent)
        state.handoffs = audited

        def first_turn_then_answer(request: Any) -> Step:
            if not any(m.get("role") == "assistant" for m in request.messages):
                return state.turns.get(request.last_user_text, text("no script"))
            return text("done")

        model_server.respond(main_model.name, first_turn_then_answer)
        model_server.respond(target_model.name, lambda request: text("done"))
        yield state


async def _answer_approvals(handle: RunHandle) -> None:
    """A person who answers every approval, alternately yes and no."""
    answered = 0
    while True:
        for pending in await handle.pending_approvals():
            try:
                await handle.approve(pending.call_id, approved=answered % 2 == 0, reason="checked")
            except Exception:  # noqa: BLE001 - answered meanwhile, or the run moved on
                pass
            answered += 1
        await asyncio.sleep(0.05)


def _check_well_formed(request: Any) -> None:
    for message in request.messages:
        calls = message.get("tool_calls") or []
        ids = [c["id"] for c in calls]
        assert len(set(ids)) == len(ids) and all(ids), ids
        for c in calls:
            assert isinstance(json.loads(c["function"]["arguments"]), dict), c
            assert is_valid_tool_name(c["function"]["name"]), c


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(turn=turns)
@pytest.mark.asyncio(loop_scope="session")
async def test_generated_tool_calls_never_wedge_a_run(
    setup: Setup, client: Client, turn: list[tuple[str, str, str]]
) -> None:
    prompt = f"example {uuid.uuid4().hex}"
    setup.turns[prompt] = batch(*(call(name, raw_arguments=raw, id=cid) for name, cid, raw in turn))
    workflow_id = f"prop-{uuid.uuid4().hex[:12]}"
    await client.start_workflow(
        AGENT_RUN_WORKFLOW,
        RunInput(agent=setup.agent.name, input=prompt, max_turns=4),
        id=workflow_id,
        task_queue=setup.worker.task_queue,
    )
    handle = get_run(client, workflow_id)
    approver = asyncio.ensure_future(_answer_approvals(handle))
    try:
        result = await asyncio.wait_for(handle.result(), RUN_TIMEOUT)
    finally:
        approver.cancel()
    assert result.output == "done"
    events = await history_events(handle.workflow)
    assert not any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in events)
    for message in result.transcript:
        if message.tool_calls:
            ids = [c.id for c in message.tool_calls]
            assert len(set(ids)) == len(ids)
            assert all(isinstance(json.loads(c.arguments), dict) for c in message.tool_calls)
    for request in setup.server.requests():
        if request.last_user_text == prompt:
            _check_well_formed(request)
