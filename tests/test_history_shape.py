"""What a new run writes to its history besides its activities: one setup marker, at most one
search-attribute upsert per workflow task with only what changed (none at the first task: the
run starts with its agent and status), and a plain tool turn at most two events more than a
bare Temporal workflow's (its model activity, its tool activity, the workflow tasks between)."""

from __future__ import annotations

import itertools
import uuid
from datetime import UTC, datetime
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import SearchAttributePair, TypedSearchAttributes

from relaykit import Agent, start_run, tool
from relaykit.runs import MODEL_ACTIVITY
from relaykit.search_attributes import (
    RELAY_AGENT,
    RELAY_COST_USD,
    RELAY_LAST_ACTIVITY,
    RELAY_PARENT_RUN,
    RELAY_STATUS,
    RELAY_TOKENS,
    RELAY_WAITING_CALLS,
    RELAY_WAITING_FOR,
    changed_only,
)
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.workflows.run_setup import SETUP_V6_IDS
from tests.support import eventually, history_events, new_namespace, scripted_model, serving

TURNS = 4
BARE_TEMPORAL_TURN = 12
"""Events of a turn of a hand-written workflow: model activity and tool activity (scheduled,
started, completed: 3 each) and the workflow task after each (scheduled, started, completed)."""


@tool(effect="read")
def stock(item: str) -> str:
    """How many are in stock.

    Args:
        item: The item.
    """
    return f"{item}: 3"


def _upserted(event: object) -> set[str]:
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes  # type: ignore[attr-defined]
    return set(fields.indexed_fields)


async def test_a_new_run_writes_one_setup_marker_and_a_tool_turn_costs_at_most_two_events_more(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(
        model.name, [*(call("stock", item=f"i{n}") for n in range(TURNS)), text("ok")]
    )
    agent = Agent(name="stocked", model=model, tools=[stock])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "count", task_queue=worker.task_queue)
        assert (await handle.result()).output == "ok"
        events = await history_events(handle.workflow)

    kinds = [e.event_type for e in events]
    patch_markers = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert len(patch_markers) == 1  # relaykit.run-setup.v6, search-attribute choices included
    # the test namespace has every attribute: all the choices are in that one marker's id
    recorded = patch_markers[0].marker_recorded_event_attributes.SerializeToString()
    assert SETUP_V6_IDS[(True, True, True, True)].encode() in recorded
    # a plain turn records no decision: no marker at all after the setup's
    markers = [e for e in events if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED]
    assert markers == patch_markers
    upserts = [
        i
        for i, k in enumerate(kinds)
        if k == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
    ]
    assert sum("TemporalChangeVersion" in _upserted(events[i]) for i in upserts) == 1
    # at most one upsert of the run's own attributes per workflow task
    task_of = [
        sum(k == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED for k in kinds[:i]) for i in upserts
    ]
    own = [
        t for i, t in zip(upserts, task_of, strict=True) if "RelayStatus" in _upserted(events[i])
    ]
    assert own and len(own) == len(set(own))
    # the run started with its agent and status, so it upserts them only when they change: once,
    # when it completes, without the agent it started with
    assert [_upserted(events[i]) for i in upserts if "RelayStatus" in _upserted(events[i])] == [
        {"RelayStatus", "RelayTokens", "RelayLastActivity"}
    ]
    started = events[0].workflow_execution_started_event_attributes.search_attributes
    assert {"RelayAgent", "RelayStatus", "RelayTokens"} <= set(started.indexed_fields)

    model_calls = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_ACTIVITY
    ]
    turns = [b - a for a, b in itertools.pairwise(model_calls)]
    assert len(turns) == TURNS
    assert all(events_of_turn <= BARE_TEMPORAL_TURN + 2 for events_of_turn in turns), turns
    assert min(turns) == BARE_TEMPORAL_TURN, turns  # a plain turn: what bare Temporal writes


async def test_runs_start_with_their_agent_and_status_so_a_child_writes_no_first_upsert(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # No worker polls this queue: what the run is listed with comes from its start request.
    waiting = await start_run(
        client,
        "nobody_serves_me",
        "hello",
        task_queue=f"tq-unserved-{uuid.uuid4().hex[:8]}",
        search_attributes=TypedSearchAttributes([SearchAttributePair(RELAY_TOKENS, 7)]),
    )
    attrs = (await waiting.workflow.describe()).typed_search_attributes
    assert attrs.get(RELAY_AGENT) == "nobody_serves_me"
    assert attrs.get(RELAY_STATUS) == "running"
    assert attrs.get(RELAY_TOKENS) == 7  # the caller's own attributes win
    await waiting.workflow.terminate("test over")

    child_model, parent_model = scripted_model(model_server), scripted_model(model_server)
    model_server.script(child_model.name, [text("noted")])
    model_server.script(parent_model.name, [call("ask_clerk", input="note it"), text("done")])
    clerk = Agent(name="clerk", model=child_model)
    boss = Agent(name="boss", model=parent_model, tools=[clerk.as_tool()])
    async with serving(client, boss) as worker:
        handle = await start_run(client, boss, "go", task_queue=worker.task_queue)
        assert (await handle.result()).output == "done"
        child_id = next(
            e.start_child_workflow_execution_initiated_event_attributes.workflow_id
            for e in await history_events(handle.workflow)
            if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
        )
        child = client.get_workflow_handle(child_id)
        child_events = await history_events(child)
        child_attrs = (await child.describe()).typed_search_attributes
    started = child_events[0].workflow_execution_started_event_attributes.search_attributes
    assert {"RelayAgent", "RelayStatus", "RelayParentRun"} <= set(started.indexed_fields)
    own = [
        _upserted(e)
        for e in child_events
        if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
        and "TemporalChangeVersion" not in _upserted(e)
    ]
    assert own == [{"RelayStatus", "RelayTokens", "RelayLastActivity"}]  # when it completed
    assert child_attrs.get(RELAY_AGENT) == "clerk"
    assert child_attrs.get(RELAY_STATUS) == "completed"
    assert child_attrs.get(RELAY_PARENT_RUN) == handle.id


_KEYS = [RELAY_AGENT, RELAY_STATUS, RELAY_TOKENS, RELAY_COST_USD, RELAY_WAITING_FOR]
_VALUES = {
    RELAY_AGENT: st.sampled_from(["a", "b"]),
    RELAY_STATUS: st.sampled_from(["running", "waiting_approval"]),
    RELAY_TOKENS: st.integers(0, 2),
    RELAY_COST_USD: st.sampled_from([0.0, 0.5]),
    RELAY_WAITING_FOR: st.sampled_from(["approval", "paused"]),
}


def _maybe(key: Any) -> st.SearchStrategy[Any]:
    return st.one_of(st.none(), _VALUES[key])


@settings(max_examples=300, deadline=None)
@given(
    current=st.fixed_dictionaries({key.name: _maybe(key) for key in _KEYS}),
    waiting=st.lists(st.sampled_from(["c1", "c2"]), unique=True),
    had_waiting=st.lists(st.sampled_from(["c1", "c2"]), unique=True),
    wanted=st.fixed_dictionaries({key.name: _maybe(key) for key in _KEYS}),
)
def test_an_upsert_of_only_what_changed_leaves_the_run_as_the_full_upsert_would(
    current: dict[str, Any], waiting: list[str], had_waiting: list[str], wanted: dict[str, Any]
) -> None:
    now = datetime(2026, 12, 3, tzinfo=UTC)
    keys = {key.name: key for key in _KEYS}
    pairs = [SearchAttributePair(keys[n], v) for n, v in current.items() if v is not None]
    if had_waiting:
        pairs.append(SearchAttributePair(RELAY_WAITING_CALLS, had_waiting))
    before = TypedSearchAttributes(pairs)
    full = [
        keys[n].value_set(v) if v is not None else keys[n].value_unset() for n, v in wanted.items()
    ]
    full += [
        RELAY_WAITING_CALLS.value_set(waiting) if waiting else RELAY_WAITING_CALLS.value_unset(),
        RELAY_LAST_ACTIVITY.value_set(now),
    ]

    def applied(updates: list[Any]) -> dict[str, Any]:
        state = {pair.key.name: pair.value for pair in before}
        for update in updates:
            state[update.key.name] = update.value
        return {n: v for n, v in state.items() if v not in (None, [])}

    changed = changed_only(full, before)
    after_full, after_changed = applied(full), applied(changed)
    after_full.pop("RelayLastActivity"), after_changed.pop("RelayLastActivity", None)
    assert after_changed == after_full  # what a list shows is the same
    moved = any(
        (before.get(keys[n]) if n in keys else None) != wanted[n]
        for n in ("RelayAgent", "RelayStatus", "RelayWaitingFor")
    )
    assert any(u.key == RELAY_LAST_ACTIVITY for u in changed) == moved
    assert len(changed) <= len(full)


async def test_a_relaykit_attribute_registered_with_another_type_counts_as_missing(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # RelayTokens registered as a Keyword: writing the run's token count there would fail every
    # start and upsert that sets it. Runs on that namespace start and finish without relaykit's
    # attributes instead of failing at the start or wedging at their first workflow task.
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import AddSearchAttributesRequest
    from temporalio.service import RPCError

    from relaykit import search_attributes

    mistyped = await new_namespace(client, "mistyped")
    namespace = mistyped.namespace
    wanted = {
        key.name: IndexedValueType.ValueType(
            int(
                IndexedValueType.INDEXED_VALUE_TYPE_KEYWORD
                if key == RELAY_TOKENS
                else key.indexed_value_type
            )
        )
        for key in search_attributes.ALL
    }

    async def registered() -> bool:
        try:  # a new namespace reaches the frontend's cache after a moment
            await mistyped.operator_service.add_search_attributes(
                AddSearchAttributesRequest(namespace=namespace, search_attributes=wanted)
            )
        except RPCError:
            return False
        return True

    await eventually(registered, "the namespace with a mistyped RelayTokens")
    names = await search_attributes.known(mistyped)
    assert "RelayStatus" in names and "RelayTokens" not in names
    assert await search_attributes.upsert_choices(mistyped) == (False, False, False, False)

    model = scripted_model(model_server)
    model_server.script(model.name, [text("fine")])
    agent = Agent(name="mistyped_ns", model=model)
    async with serving(mistyped, agent) as worker:
        handle = await start_run(mistyped, agent, "hi", task_queue=worker.task_queue)
        assert (await handle.result()).output == "fine"
    attrs = (await handle.workflow.describe()).typed_search_attributes
    assert attrs.get(RELAY_AGENT) is None and attrs.get(RELAY_STATUS) is None
