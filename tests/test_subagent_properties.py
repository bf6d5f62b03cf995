"""Property-based: whatever a model writes as arguments of the subagent tools (and of an agent
tool), the run finishes and no workflow task fails.

Each example is a real run on the Temporal dev server the tests share: the scripted lead first
spawns one task (so ids can refer to something), then calls the tools with generated arguments in
one turn, then answers. Generated arguments mix plausible values with wrong types, odd shapes,
NaN/Infinity, huge numbers, non-JSON text and JSON that is not an object. One worker serves all
examples, so CI pays about half a minute.

"No workflow task fails" excludes one cause: a completion the server turns down because a
signal arrived meanwhile (``UnhandledCommand``, e.g. a task's report racing the run's end). That
is Temporal's normal way of handing the workflow the new event, not a failure of its code.

CI runs 25 examples. For a longer run, raise the count with an environment variable::

    RELAYKIT_PROPERTY_EXAMPLES=500 pytest tests/test_subagent_properties.py -p no:cacheprovider
"""

from __future__ import annotations

import asyncio
import itertools
import json
import os
from collections.abc import AsyncIterator
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client

from relaykit import Agent, Subagents, Worker, start_run
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    batch,
    call,
    text,
)
from tests.support import history_events, scripted_model, serving

UNHANDLED_COMMAND = WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
EXAMPLES = int(os.environ.get("RELAYKIT_PROPERTY_EXAMPLES", "25"))

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats(allow_nan=True, allow_infinity=True)
    | st.sampled_from([0, 0.0, 0.001, 1, 600, 600.0001, 1e8, 1e300, -1, "soon", "60", "", " "])
    | st.text(max_size=12)
    | st.sampled_from(["task-1", "task-2", "task-99", "researcher", "nobody"])
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)
FIELDS = {
    "spawn_subagent": ["prompt", "agent"],
    "wait_subagents": ["ids", "timeout_seconds"],
    "cancel_subagent": ["id"],
    "send_to_subagent": ["id", "message"],
    "ask_clerk": ["input"],
}


@st.composite
def raw_arguments(draw: Any, tool_name: str) -> str:
    """What a model might write: an object with the tool's fields (and maybe others), or
    something else entirely."""
    shape = draw(st.sampled_from(["object", "object", "object", "other-json", "text"]))
    if shape == "text":
        return draw(st.text(max_size=30))
    if shape == "other-json":
        return json.dumps(draw(json_values))
    names = draw(st.lists(st.sampled_from([*FIELDS[tool_name], "extra"]), max_size=3, unique=True))
    return json.dumps({name: draw(json_values) for name in names})  # NaN/Infinity included


tool_calls = st.lists(
    st.sampled_from(sorted(FIELDS)).flatmap(
        lambda name: raw_arguments(name).map(lambda raw: (name, raw))
    ),
    min_size=1,
    max_size=4,
)

_counter = itertools.count()
_plans: dict[str, list[tuple[str, str]]] = {}


def _lead(request: ScriptedRequest) -> Step:
    """The lead's scripted model: spawn one task, then this example's calls, then answer."""
    prompt = next(m["content"] for m in request.messages if m["role"] == "user")
    if not request.tool_results:
        return call("spawn_subagent", prompt="background work")
    if len(request.tool_results) == 1:
        return batch(*(call(name, raw_arguments=raw) for name, raw in _plans[prompt]))
    return text("done")


@pytest.fixture(scope="module")
async def lead_worker(client: Client, model_server: ScriptedModelServer) -> AsyncIterator[Worker]:
    clerk_model = scripted_model(model_server)
    model_server.respond(clerk_model.name, lambda req: text("clerk report"))
    lead_model = scripted_model(model_server)
    model_server.respond(lead_model.name, _lead)
    clerk = Agent(name="clerk", model=clerk_model)
    lead = Agent(
        name="lead",
        model=lead_model,
        tools=[clerk.as_tool(max_turns=3)],
        subagents=Subagents([clerk], max_concurrent=2, max_turns=3),
    )
    async with serving(client, lead) as worker:
        yield worker


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(calls=tool_calls)
async def test_any_arguments_to_the_subagent_tools_leave_the_run_finishing_without_a_failed_task(
    client: Client, lead_worker: Worker, calls: list[tuple[str, str]]
) -> None:
    prompt = f"example {next(_counter)}"
    _plans[prompt] = calls
    handle = await start_run(client, "lead", prompt, task_queue=lead_worker.task_queue)
    result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == "done"
    assert len([m for m in result.transcript if m.role == "tool"]) == 1 + len(calls)
    # A completion the server turns down because a signal (a task's report) arrived meanwhile
    # is Temporal's normal race, answered by a new workflow task; any other cause is a failure.
    failed = [
        e.workflow_task_failed_event_attributes.failure.message
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause != UNHANDLED_COMMAND
    ]
    assert failed == []
