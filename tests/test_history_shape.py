"""What a new run writes to its history besides its activities: one setup marker, at most one
search-attribute upsert per workflow task, and a plain tool turn at most two events more than a
bare Temporal workflow's (its model activity, its tool activity, the workflow tasks between)."""

from __future__ import annotations

import itertools

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, start_run, tool
from relaykit.runs import MODEL_ACTIVITY
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.workflows.run_setup import SETUP_V4_IDS
from tests.support import history_events, scripted_model, serving

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
    assert len(patch_markers) == 1  # relaykit.run-setup.v4, search-attribute choices included
    # the test namespace has every attribute: all the choices are in that one marker's id
    recorded = patch_markers[0].marker_recorded_event_attributes.SerializeToString()
    assert SETUP_V4_IDS[(True, True, True, True)].encode() in recorded
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

    model_calls = [
        i
        for i, e in enumerate(events)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_ACTIVITY
    ]
    turns = [b - a for a, b in itertools.pairwise(model_calls)]
    assert len(turns) == TURNS
    assert all(events_of_turn <= BARE_TEMPORAL_TURN + 2 for events_of_turn in turns), turns
