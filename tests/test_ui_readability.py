"""What a person sees of a run in the Temporal UI, read back from the server: the run's static
summary, a summary on every model and tool call, current details while it waits for a person,
one event group per turn, and relaykit's search attributes (also on a child run)."""

from __future__ import annotations

import asyncio
import time

from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client, WorkflowHandle

from relaykit import Agent, RunHandle, start_run, tool
from relaykit.search_attributes import RELAY_AGENT, RELAY_PARENT_RUN, RELAY_STATUS, RELAY_TOKENS
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import history_events, scripted_model, serving


@tool
def lookup(invoice: str) -> str:
    """Look an invoice up."""
    return f"{invoice}: 40 EUR, paid twice"


@tool(needs_approval=True)
def refund(invoice: str, amount: int) -> str:
    """Refund part of an invoice.

    Args:
        invoice: The invoice.
        amount: Euros.
    """
    return f"refunded {amount} on {invoice}"


async def current_details(handle: WorkflowHandle) -> str:  # type: ignore[type-arg]
    metadata = await handle.query("__temporal_workflow_metadata", result_type=WorkflowMetadata)
    return metadata.current_details


async def waiting_for_a_person(handle: RunHandle) -> str:
    deadline = time.monotonic() + 15
    while not await handle.pending_approvals():
        assert time.monotonic() < deadline, "no approval was requested"
        await asyncio.sleep(0.05)
    return (await handle.pending_approvals())[0].call_id


async def summaries(client: Client, handle: WorkflowHandle) -> list[tuple[str, str | None]]:  # type: ignore[type-arg]
    """(activity type, summary) of every scheduled activity."""
    out = []
    for e in await history_events(handle):
        if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            continue
        name = e.activity_task_scheduled_event_attributes.activity_type.name
        summary = None
        if e.user_metadata.HasField("summary"):
            [summary] = await client.data_converter.decode([e.user_metadata.summary])
        out.append((name, summary))
    return out


async def turn_groups(handle: WorkflowHandle) -> list[tuple[str, list[str]]]:  # type: ignore[type-arg]
    """(command event, event groups) of every activity and child run the run started."""
    commands = {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED: "activity",
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED: "child",
    }
    return [
        (commands[e.event_type], [m.label.id for m in e.event_group_markers])
        for e in await history_events(handle)
        if e.event_type in commands
    ]


async def test_a_finished_run_reads_well_in_the_temporal_ui(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: every model and tool call has a summary, waiting runs say what they wait for,
    # and runs can be found by agent, status, tokens and parent.
    billing_model = scripted_model(model_server)
    support_model = scripted_model(model_server)
    model_server.script(
        billing_model.name,
        [
            call("lookup", invoice="INV-7"),
            call("refund", invoice="INV-7", amount=40),
            text("Refunded 40."),
        ],
    )
    model_server.script(
        support_model.name,
        [call("ask_billing", input="Refund the double charge on INV-7"), text("Done.")],
    )
    billing = Agent(name="billing", model=billing_model, tools=[lookup, refund])
    support = Agent(name="support", model=support_model, tools=[billing.as_tool()])
    async with serving(client, support, search_attributes=True, event_groups=True) as worker:
        handle = await start_run(
            client, support, "I was charged twice", task_queue=worker.task_queue
        )
        call_id = await waiting_for_a_person(handle)
        child = client.get_workflow_handle(
            next(e.data["workflow_id"] for e in await handle.events() if e.kind == "tool_call")
        )
        root_waiting = await current_details(handle.workflow)
        child_waiting = await current_details(child)
        await handle.approve(call_id)
        result = await handle.result()
        root_done = await current_details(handle.workflow)

    assert result.output == "Done."
    assert (
        "waiting_approval" in root_waiting
        and f"waiting for approval: `refund` (call `{call_id}`)" in root_waiting
    )
    assert "**agent:** billing" in child_waiting and "`refund`" in child_waiting
    assert "**status:** completed" in root_done and "waiting for approval" not in root_done

    root_description = await handle.workflow.describe()
    assert await root_description.static_summary() == "support: I was charged twice"
    child_description = await child.describe()
    assert (await child_description.static_summary()).startswith(
        "billing (asked by support): Refund the double charge"
    )

    assert await summaries(client, handle.workflow) == [
        ("relaykit.model_call", f"support · turn 1 · {support_model.name}"),
        ("relaykit.model_call", f"support · turn 2 · {support_model.name}"),
    ]
    assert await summaries(client, child) == [
        ("relaykit.model_call", f"billing · turn 1 · {billing_model.name}"),
        ("lookup", "lookup(invoice=INV-7)"),
        ("relaykit.model_call", f"billing · turn 2 · {billing_model.name}"),
        ("refund", "refund(invoice=INV-7, amount=40)"),
        ("relaykit.model_call", f"billing · turn 3 · {billing_model.name}"),
    ]

    # Each turn's commands form one event group (the child's `refund` waited for a person and
    # still belongs to turn 2).
    assert await turn_groups(handle.workflow) == [
        ("activity", ["turn-1"]),
        ("child", ["turn-1"]),
        ("activity", ["turn-2"]),
    ]
    assert await turn_groups(child) == [
        ("activity", ["turn-1"]),
        ("activity", ["turn-1"]),
        ("activity", ["turn-2"]),
        ("activity", ["turn-2"]),
        ("activity", ["turn-3"]),
    ]

    root_attrs = root_description.typed_search_attributes
    assert root_attrs.get(RELAY_AGENT) == "support"
    assert root_attrs.get(RELAY_STATUS) == "completed"
    assert root_attrs.get(RELAY_TOKENS) == result.usage.total_tokens == 75
    assert root_attrs.get(RELAY_PARENT_RUN) is None
    child_attrs = child_description.typed_search_attributes
    assert child_attrs.get(RELAY_AGENT) == "billing"
    assert child_attrs.get(RELAY_STATUS) == "completed"
    assert child_attrs.get(RELAY_TOKENS) == 45
    assert child_attrs.get(RELAY_PARENT_RUN) == handle.id
