"""No agent name, run id or operator's text, whatever its length or script, wedges a run.

Property: names and ids.

Agent names are free text, and a run id may be up to 1,000 bytes of any script. Each reaches
Temporal and the store in several shapes: the ids of the run's children, the ``RelayAgent`` and
``RelayParentRun`` attributes, the store's folder, the worker's model queues. Before, each shape
had a length past which the server refused a command (and the run's workflow task failed again
at every retry) or the file system refused a file name (and the model call was retried without
end). Hypothesis generates the names of three agents (the run's, a handoff target and an agent
tool) and the run's id; a real worker runs each on the dev server. A run either is refused when
it is started, with a typed error, or ends with the target's answer and no failed workflow task.

The number of examples is bounded for CI (``max_examples=8``, plus the extremes named by
``@example``); set ``RELAYKIT_PROPERTY_EXAMPLES`` for a longer search.
"""

from __future__ import annotations

import asyncio
import json
import os
import uuid
from datetime import timedelta
from typing import Any

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError

from relaykit import (
    Agent,
    Handoff,
    Subagents,
    TextTooLong,
    Worker,
    answer_waiting,
    start_run,
)
from relaykit.client import MAX_TEXT_BYTES
from relaykit.errors import ConfigurationError
from relaykit.retention import collect_garbage
from relaykit.run_ids import MAX_RUN_ID_BYTES, child_run_id, run_id_fits
from relaykit.search_attributes import MAX_VALUE_BYTES, RELAY_AGENT, keyword
from relaykit.storage import (
    MAX_SCOPE_CHARS,
    Store,
    long_id_start,
    run_id_of_scope,
    run_prefix,
    scope_for,
)
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.workflows.agent_tools import _child_name
from tests.support import history_events, scripted_model, serving
from tests.test_approvals import eventually, make_refund_tool, waiting_for_approval
from tests.wedge import BENIGN, cause_name

EXAMPLES = int(os.environ.get("RELAYKIT_PROPERTY_EXAMPLES", "8"))
RUN_TIMEOUT = 60.0

any_text = st.characters(codec="utf-8")


def _repeated(short: st.SearchStrategy[str], most: int) -> st.SearchStrategy[str]:
    """Long text made by repeating a short one (drawing 900 characters one by one fills
    hypothesis's buffer and gives up the example)."""
    return st.builds(lambda s, n: (s * n)[:most], short, st.integers(1, most))


names = st.one_of(
    st.text(any_text, min_size=1, max_size=30),
    _repeated(st.text(any_text, min_size=1, max_size=6), 3000),
    st.sampled_from(["账", "a", "🙂", "é "]).map(lambda c: c * 700),
    st.sampled_from(["a/b c", "..", "Billing Team"]),
).filter(str.strip)
run_ids = st.one_of(
    st.none(),
    st.text(any_text, min_size=1, max_size=40),
    _repeated(st.text(any_text, min_size=1, max_size=6), 1001),
    st.sampled_from([("r", 995), ("r", 1000), ("r", 1001), ("账", 333)]).map(lambda p: p[0] * p[1]),
    st.sampled_from(["a/b", ".."]),
)


def _distinct(three: tuple[str, str, str]) -> tuple[str, str, str]:
    own, target, helper = three
    target = target if target != own else f"{target} (target)"
    helper = helper if helper not in (own, target) else f"{helper} (helper)"
    return own, target, helper


def failed_tasks(events: list[Any]) -> list[str]:
    """Workflow task failures other than Temporal's normal protocol (``tests/wedge.py``): a
    child's report or result can reach a run while it completes a task (``UnhandledCommand``),
    and the task then runs again with it in view."""
    return [
        name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and (name := cause_name(e.workflow_task_failed_event_attributes.cause)) not in BENIGN
    ]


def _utf8(value: str) -> int:
    return len(value.encode("utf-8", "surrogatepass"))


# --- the rules, without a server ------------------------------------------------------------


@given(value=st.text(any_text, max_size=3000) | st.sampled_from(["账" * 700, "🙂" * 400]))
def test_a_keyword_value_fits_and_stays_what_it_was_when_it_could(value: str) -> None:
    written = keyword(value)
    assert len(json.dumps(written)) <= MAX_VALUE_BYTES  # as the SDK encodes it
    if len(json.dumps(value)) <= MAX_VALUE_BYTES:
        assert written == value
    else:
        assert written != keyword(value + "x")  # the digest tells long values apart
        assert value.startswith(written[: written.rindex("…")])


@given(run_id=st.text(any_text, min_size=1, max_size=1000))
def test_a_run_folder_is_a_short_safe_name_for_any_id(run_id: str) -> None:
    scope = scope_for(run_id)
    root = run_id.split("/", 1)[0]
    assert len(scope) <= MAX_SCOPE_CHARS and "/" not in scope and scope not in (".", "..")
    assert not scope.startswith(".")
    if root:
        assert run_id_of_scope(scope) in (root, None)
        assert root.startswith(long_id_start(scope) or root)
        assert scope != scope_for(root + "x")


@given(parent=st.text(any_text, min_size=1, max_size=1000), segment=st.text(max_size=80))
def test_a_child_id_starts_with_its_root_and_fits_when_the_root_leaves_room(
    parent: str, segment: str
) -> None:
    child = child_run_id(parent, segment)
    root = parent.split("/", 1)[0]
    assert child.startswith(root + "/")
    if _utf8(f"{parent}/{segment}") <= MAX_RUN_ID_BYTES:
        assert child == f"{parent}/{segment}"  # unchanged from earlier releases
    elif _utf8(root) <= MAX_RUN_ID_BYTES - 33:
        assert run_id_fits(child)


async def test_a_worker_refuses_a_task_queue_the_server_would_refuse(client: Client) -> None:
    agent = Agent(name="queues", model="openai:gpt-4.1-mini")
    with pytest.raises(ConfigurationError, match=r"model queue of this worker .* is 1003 bytes"):
        Worker(client, agent, task_queue="q" * 990)  # its model queue: + ".model.openai"
    with pytest.raises(ConfigurationError, match="the worker's task_queue is 1002 bytes"):
        Worker(client, agent, task_queue="账" * 334)
    with pytest.raises(ConfigurationError, match="the worker's task_queue is empty"):
        Worker(client, agent, task_queue="")


async def test_start_run_refuses_a_queue_or_id_the_server_would_refuse(client: Client) -> None:
    cases: list[tuple[dict[str, Any], str]] = [
        ({"task_queue": "q" * 1001}, "task_queue is 1001 bytes"),
        ({"task_queue": ""}, "task_queue is empty"),
        ({"id": "账" * 334}, "the run id is 1002 bytes"),
    ]
    for options, words in cases:
        with pytest.raises(ConfigurationError, match=words):
            await start_run(client, "anyone", "hello", **options)


# --- runs on the dev server -----------------------------------------------------------------


def _agents(server: ScriptedModelServer, names: tuple[str, str, str]) -> tuple[Agent, Agent]:
    """The run's agent, which asks the helper (an agent tool) and then hands off to the target;
    the target answers ``done``."""
    own, target_name, helper_name = names
    own_model, target_model, helper_model = (scripted_model(server) for _ in range(3))
    helper = Agent(name=helper_name, model=helper_model)
    target = Agent(name=target_name, model=target_model)
    agent = Agent(name=own, model=own_model, tools=[helper.as_tool()], handoffs=[Handoff(target)])
    ask, transfer = agent.tools[0].name, agent.handoffs[0].tool_name  # type: ignore[union-attr]

    def own_turns(request: Any) -> Any:
        said = sum(m.get("role") == "assistant" for m in request.messages)
        return call(ask, input="look it up") if said == 0 else call(transfer)

    server.respond(own_model.name, own_turns)
    server.respond(helper_model.name, lambda request: text("helped"))
    server.respond(target_model.name, lambda request: text("done"))
    return agent, target


@settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    agent_names=st.tuples(names, names, names).map(_distinct),
    run_id=run_ids,
)
@example(agent_names=("main", "账" * 700, "helper"), run_id=None)  # RelayAgent over 2 kB
@example(agent_names=("a" * 3000, "target", "helper"), run_id=None)  # the default id's slug
@example(agent_names=("main", "target", "helper"), run_id="r" * 990)  # the folder's name
@example(agent_names=("main", "target", "helper"), run_id="r" * 1000)  # no room for a child
@example(agent_names=("main", "target", "helper"), run_id="🙂" * 240)  # RelayParentRun: 2,882 B
@pytest.mark.asyncio(loop_scope="session")
async def test_generated_names_and_ids_never_wedge_a_run(
    client: Client,
    model_server: ScriptedModelServer,
    agent_names: tuple[str, str, str],
    run_id: str | None,
) -> None:
    agent, target = _agents(model_server, agent_names)
    async with serving(client, agent) as worker:
        try:
            handle = await start_run(
                client,
                agent,
                f"example {uuid.uuid4().hex}",
                task_queue=worker.task_queue,
                id=run_id,
            )
        except (ConfigurationError, RPCError):
            assert run_id is not None  # refused at its start: only for an id the server refuses
            event("refused at its start")
            return
        result = await asyncio.wait_for(handle.result(), RUN_TIMEOUT)
        described = await handle.workflow.describe()
    assert result.output == "done" and result.final_agent == target.name
    events = await history_events(handle.workflow)
    assert not failed_tasks(events)
    asked = next(m.content for m in result.transcript if m.role == "tool")
    child = child_run_id(handle.id, f"{_child_name(agent_names[2])}-1")
    if run_id_fits(child):
        assert asked == "helped"
        event("ran, with its agent tool's child")
    else:
        event("ran, its agent tool refused")
        assert "leaves no room for a child run's id" in asked, asked
    assert described.typed_search_attributes.get(RELAY_AGENT) == keyword(target.name)
    store = worker.store
    assert [o async for o in store.list(run_prefix(scope_for(handle.id)))]


async def test_a_long_ids_folder_is_kept_and_named_by_its_run(
    client: Client, model_server: ScriptedModelServer, tmp_path: Any
) -> None:
    """``relaykit gc`` finds the run of a folder whose name keeps only the id's beginning."""
    agent, _ = _agents(model_server, ("main", "target", "helper"))
    long_id = f"{uuid.uuid4().hex}-" + "账" * 300
    async with serving(client, agent, transcript_dir=str(tmp_path)) as worker:
        handle = await start_run(client, agent, "hello", task_queue=worker.task_queue, id=long_id)
        await asyncio.wait_for(handle.result(), RUN_TIMEOUT)
        query = f"RelayParentRun = '{keyword(long_id)}'"
        for _ in range(100):  # visibility catches up a moment after the child starts
            children = [w.id async for w in client.list_workflows(query)]
            if children:
                break
            await asyncio.sleep(0.1)
    assert children and all(child.startswith(long_id + "/") for child in children)
    store = Store(tmp_path)
    report = await collect_garbage(store, client, retention=timedelta(days=1), dry_run=True)
    assert report.kept[long_id].startswith("closed"), report
    report = await collect_garbage(store, client, retention=timedelta(0))
    assert report.deleted[long_id] > 0
    assert not [o async for o in store.list(run_prefix(scope_for(long_id)))]


@pytest.mark.parametrize("run_id", ["r" * 980, "r" * 1000])
async def test_a_subagent_of_a_run_with_a_long_id_runs_or_is_refused_in_words(
    client: Client, model_server: ScriptedModelServer, run_id: str
) -> None:
    """``<id>/task-1`` fits for a 980-byte id; a 1,000-byte one leaves no room, even for
    ``<root>/<digest>``: the spawn is an error result, and the run goes on."""
    lead_model, helper_model = scripted_model(model_server), scripted_model(model_server)
    helper = Agent(name="helper", model=helper_model)
    model_server.respond(helper_model.name, lambda request: text("helped"))
    model_server.script(
        lead_model.name,
        [call("spawn_subagent", prompt="look"), call("wait_subagents"), text("done")],
    )
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([helper]))
    async with serving(client, lead) as worker:
        handle = await start_run(client, lead, "go", task_queue=worker.task_queue, id=run_id)
        result = await asyncio.wait_for(handle.result(), RUN_TIMEOUT)
    spawned = next(m.content for m in result.transcript if m.role == "tool")
    if run_id_fits(f"{run_id}/task-1"):
        assert (
            '"status": "running"' in spawned and len(model_server.requests(helper_model.name)) == 1
        )
    else:
        assert "Could not start the task: this run's root id is 1000 bytes long" in spawned
        assert not model_server.requests(helper_model.name)
    assert result.output == "done"
    events = await history_events(handle.workflow)
    assert not failed_tasks(events)


# --- texts an operator sends ----------------------------------------------------------------


async def test_a_text_too_long_for_a_run_is_refused_before_it_is_sent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    """An update's input comes back in the worker's answer accepting it, and the SDK refuses to
    send an answer over 2 MB: a 3 MB approval reason failed the run's workflow task at every
    retry. A text within the bound reaches the model."""
    model = scripted_model(model_server)
    model_server.script(model.name, [call("refund", id="call_long", order_id="L1", amount=1)])
    model_server.respond(model.name, lambda request: text("done"))
    refunds: list[str] = []
    agent = Agent(name="long_texts", model=model, tools=[make_refund_tool(refunds)])
    near = "y" * (MAX_TEXT_BYTES - 100)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund L1", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        over = "z" * (MAX_TEXT_BYTES + 1)
        for send in (
            lambda: handle.approve("call_long", reason=over),
            lambda: handle.approve("call_long", reason=over, wait=False),
            lambda: handle.send_message(over),
            lambda: handle.steer(over),
            lambda: handle.resume("\x00" * (MAX_TEXT_BYTES // 6 + 1)),  # six bytes each in JSON
            lambda: answer_waiting(client, run_ids=[handle.id], reason=over),
        ):
            with pytest.raises(TextTooLong, match="over the 1,048,576 a run takes"):
                await send()
        assert await handle.send_message(near) == 1
        await handle.approve("call_long", reason="fine")

        async def finished() -> bool:  # its result holds the long text: read the history
            status = (await handle.workflow.describe()).status
            return status == WorkflowExecutionStatus.COMPLETED

        await eventually(finished, "the run's end")
    events = await history_events(handle.workflow)
    assert not failed_tasks(events)
    assert refunds == ["L1:1"]
    said = [m for r in model_server.requests(model.name) for m in r.messages]
    assert any(m.get("content") == near for m in said)
