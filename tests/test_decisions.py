"""What a run decided about its tool calls and answers is recorded at a bounded cost (nothing
for a plain turn; a patch marker for each of a run's first ``MARKER_BOUND`` decisions that are
not "run it", then one local-activity marker per turn with tool calls, per call admitted after
an approval wait, per checked answer), and the recorded decisions stand when the run replays
under edited agent definitions."""

from __future__ import annotations

import asyncio
import uuid

from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from relaykit import Agent, registry, start_run, tool
from relaykit.graph import AgentGraph
from relaykit.runs import RECORD_DECISIONS_ACTIVITY
from relaykit.sandbox import sandbox_runner
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from relaykit.workflows.agent_run import AgentRun
from relaykit.workflows.call_record import MARKER_BOUND
from tests.support import history_events, scripted_model, serving

REFUSALS = 500
MARKER = EventType.EVENT_TYPE_MARKER_RECORDED
UPSERT = EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
MODEL_SCHEDULED = EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED


@tool(name="order_status")
def order_status(order_id: str) -> str:
    """Status of an order.

    Args:
        order_id: The order id.
    """
    return f"order {order_id}: shipped"


def _changes_patches(event: object) -> bool:
    fields = event.upsert_workflow_search_attributes_event_attributes.search_attributes  # type: ignore[attr-defined]
    return "TemporalChangeVersion" in fields.indexed_fields


async def replay_failure(
    client: Client, history: WorkflowHistory, agent: Agent
) -> Exception | None:
    """What replaying ``history`` with ``agent`` as today's definition fails with, if anything."""
    graph = AgentGraph.build([agent])
    queue = f"replay-{uuid.uuid4().hex[:8]}"
    registry.register(queue, graph)
    try:
        replayed = await Replayer(
            workflows=[AgentRun],
            data_converter=client.data_converter,
            workflow_runner=sandbox_runner(),
            build_id=queue.removeprefix("replay-"),
        ).replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(queue, graph)
    return replayed.replay_failure


def _records_decisions(event: object) -> bool:
    details = event.marker_recorded_event_attributes.details  # type: ignore[attr-defined]
    return RECORD_DECISIONS_ACTIVITY.encode() in b"".join(
        p.SerializeToString() for payloads in details.values() for p in payloads.payloads
    )


async def test_500_refused_calls_add_a_bounded_number_of_patches_then_one_small_marker_each(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A model stuck for 500 turns: every other turn it calls a tool the agent does not have,
    # in between it repeats a call the loop guard refuses (max_repeated_calls=1). The first
    # MARKER_BOUND refusals write a patch marker each (and Core's upsert of every patch id so
    # far); every tool turn after them costs one local-activity marker of a few hundred bytes,
    # so TemporalChangeVersion stays small whatever the run does (before bounds: one marker and
    # one upsert per refusal, each upsert carrying every patch id so far).
    model = scripted_model(model_server)
    steps = [call("order_status", order_id="A-1")]
    for turn in range(REFUSALS):
        if turn % 2:
            steps.append(call("order_status", order_id="A-1"))
        else:
            steps.append(call("cancel_order", order_id="A-1"))
    model_server.script(model.name, [*steps, text("done")])
    agent = Agent(name="stuck500", model=model, tools=[order_status], max_repeated_calls=1)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "Where is A-1?", task_queue=worker.task_queue, max_turns=REFUSALS + 5
        )
        result = await asyncio.wait_for(handle.result(), timeout=600)
    assert result.output == "done"
    results = [m for m in result.transcript if m.role == "tool"]
    assert len(results) == REFUSALS + 1
    assert sum("Unknown tool 'cancel_order'" in r.content for r in results) == REFUSALS // 2
    assert sum("not run again" in r.content for r in results) == REFUSALS // 2

    events = await history_events(handle.workflow)
    first_call = next(i for i, e in enumerate(events) if e.event_type == MODEL_SCHEDULED)
    patch_updates = [
        i for i, e in enumerate(events) if e.event_type == UPSERT and _changes_patches(e)
    ]
    before = [i for i in patch_updates if i < first_call]
    assert len(before) == 1  # the run's setup: one marker for its choices
    assert len(patch_updates) - len(before) == MARKER_BOUND
    assert max(events[i].ByteSize() for i in patch_updates) < 2_000
    markers = [e for e in events[first_call:] if e.event_type == MARKER]
    recordings = [e for e in markers if _records_decisions(e)]
    # turn 1 ran its call (nothing to record), the next MARKER_BOUND turns wrote a patch each,
    # and every turn with tool calls after them a local-activity marker
    assert len(markers) - len(recordings) == MARKER_BOUND
    assert len(recordings) == REFUSALS - MARKER_BOUND
    per_refusal = sum(e.ByteSize() for e in recordings) / len(recordings)
    assert per_refusal < 600, per_refusal
    assert sum(e.ByteSize() for e in events) / REFUSALS < 6_000

    # Replayed by code that would decide none of it so (cancel_order exists, no loop guard),
    # the run crosses the bound where it did and reads its decisions back: no task failure.
    @tool(name="cancel_order")
    def cancel_order(order_id: str) -> str:
        """Cancel an order.

        Args:
            order_id: The order id.
        """
        return f"cancelled {order_id}"

    history = await handle.workflow.fetch_history()
    for edited in (agent, Agent(name="stuck500", model=model, tools=[order_status, cancel_order])):
        assert await replay_failure(client, history, edited) is None


class Ticket(BaseModel):
    title: str


def _agent(model: object, edit: str = "") -> Agent:
    """The agent as first deployed; ``edited``: ``wire`` no longer needs approval, ``lookup``
    is gone, a tool now answers ``cancel_order`` (unknown when the run called it), the loop
    guard allows any number of repeats, and there is no output type; ``asks``: ``lookup``
    needs approval too."""

    @tool(name="wire", needs_approval=edit != "edited")
    def wire(amount: int) -> str:
        """Wire money.

        Args:
            amount: How much.
        """
        return f"wired {amount}"

    @tool(name="lookup", needs_approval=edit == "asks")
    def lookup(q: str) -> str:
        """Look something up.

        Args:
            q: What.
        """
        return f"found {q}"

    @tool(name="cancel_order")
    def cancel_order(order_id: str) -> str:
        """Cancel an order.

        Args:
            order_id: The order.
        """
        return f"cancelled {order_id}"

    if edit == "edited":
        return Agent(name="edited_decisions", model=model, tools=[wire, cancel_order])  # type: ignore[arg-type]
    return Agent(
        name="edited_decisions",
        model=model,  # type: ignore[arg-type]
        tools=[wire, lookup],
        max_repeated_calls=1,
        output_type=Ticket,
        approval_order="parallel" if edit == "parallel" else "request_order",
    )


async def test_a_run_replays_under_edited_definitions_as_its_decisions_were_recorded(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Turn 1: wire waits for a person, lookup waits for that decision (request order); turn 2 an
    # unknown tool; turn 3 a repeat the guard refuses; then an answer the output type rejects,
    # and one it accepts. Replayed with the same definitions, with ones that decide all of it
    # otherwise, and with lookup needing approval too, the run replays without a workflow task
    # failure.
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(call("wire", amount=5, id="call_wire"), call("lookup", q="x")),
            call("cancel_order", order_id="A-1"),
            call("lookup", q="x"),
            text("not json"),
            text('{"title": "done"}'),
        ],
    )
    agent = _agent(model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        for _ in range(200):
            if await handle.pending_approvals():
                break
            await asyncio.sleep(0.05)
        await handle.approve("call_wire")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == {"title": "done"}
    tools = [m.content for m in result.transcript if m.role == "tool"]
    assert tools[:2] == ["wired 5", "found x"]
    assert tools[2].startswith("Unknown tool 'cancel_order'")
    assert "not run again" in tools[3]
    events = await history_events(handle.workflow)
    first_call = next(i for i, e in enumerate(events) if e.event_type == MODEL_SCHEDULED)
    # a marker for each decision that is not "run it": wire asks a person, lookup waits for
    # that decision, cancel_order is unknown, the repeat is refused, the first answer rejected
    patches = [e for e in events[first_call:] if e.event_type == UPSERT and _changes_patches(e)]
    assert len(patches) == 5
    assert not [e for e in events if e.event_type == MARKER and _records_decisions(e)]

    history = await handle.workflow.fetch_history()
    for edit in ("", "edited", "asks", "parallel"):
        assert await replay_failure(client, history, _agent(model, edit)) is None
