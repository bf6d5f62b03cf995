"""Handoffs: the conversation passes to another agent inside the same run.

Each agent gets a scripted model of its own, so every model request can be attributed to the
agent that made it (and to the system prompt it was built with).
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.api.sdk.v1 import WorkflowMetadata
from temporalio.client import Client

import relaykit
from relaykit import (
    Agent,
    Budget,
    ConfigurationError,
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    Message,
    RunFailed,
    ToolCall,
    start_run,
    tool,
)
from relaykit.graph import AgentGraph
from relaykit.names import MAX_TOOL_NAME, is_valid_tool_name, tool_name_for
from relaykit.search_attributes import RELAY_AGENT
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import (
    activity_summaries,
    history_events,
    scheduled_activities,
    scripted_model,
    serving,
)


@tool
def lookup_customer(email: str) -> str:
    """Find a customer's account.

    Args:
        email: The customer's e-mail address.
    """
    return f"{email}: plan pro, two charges of 49 EUR on 2025-03-02"


@tool
def refund_status(invoice_id: str) -> str:
    """Tell whether an invoice was refunded.

    Args:
        invoice_id: The invoice number.
    """
    return f"{invoice_id}: refund approved"


def agent(server: ScriptedModelServer, name: str, **options: Any) -> Agent:
    """An agent with a scripted model of its own."""
    return Agent(name=name, model=scripted_model(server), **options)


def model_name(some_agent: Agent) -> str:
    assert isinstance(some_agent.model, relaykit.ModelSpec)
    return some_agent.model.name


def tools_sent(request: Any) -> dict[str, dict[str, Any]]:
    return {t["function"]["name"]: t["function"] for t in request.body.get("tools") or []}


# --- names and graph validation (no server) ---------------------------------------------------


def test_tool_names_are_ascii_bounded_and_stable_with_a_digest_when_changed() -> None:
    # Provider-safe names: unchanged when already safe, else slug + a stable 8-hex digest.
    assert tool_name_for("transfer_to_", "billing") == "transfer_to_billing"
    chinese = tool_name_for("transfer_to_", "账单专家")
    assert re.fullmatch(r"transfer_to_agent_[0-9a-f]{8}", chinese)
    assert tool_name_for("transfer_to_", "账单专家") == chinese
    assert tool_name_for("transfer_to_", "客服专家") != chinese
    spaced = tool_name_for("transfer_to_", "Billing Team")
    assert re.fullmatch(r"transfer_to_billing_team_[0-9a-f]{8}", spaced)
    long_a, long_b = "x" * 100 + "a", "x" * 100 + "b"
    names = {tool_name_for("transfer_to_", long_a), tool_name_for("transfer_to_", long_b)}
    assert len(names) == 2
    assert all(len(n) <= MAX_TOOL_NAME and is_valid_tool_name(n) for n in names | {chinese})


def test_each_handoff_entry_becomes_a_tool_with_an_optional_reason() -> None:
    # Default name transfer_to_<slug>; the default description names the target and what it does.
    billing = Agent(name="billing", description="Refunds and invoices.")
    default = Handoff(target=billing).spec
    assert default.name == "transfer_to_billing"
    assert "billing" in default.description and "Refunds and invoices." in default.description
    assert default.parameters["properties"]["reason"]["type"] == "string"
    assert "reason" not in default.parameters.get("required", [])
    custom = Handoff(target=billing, name="to_money_people", description="Money questions.").spec
    assert (custom.name, custom.description) == ("to_money_people", "Money questions.")
    expert = Agent(name="账单专家")
    assert Handoff(target=expert).tool_name == tool_name_for("transfer_to_", "账单专家")


def test_invalid_custom_handoff_name_is_a_configuration_error() -> None:
    with pytest.raises(ConfigurationError):
        Handoff(target=Agent(name="billing"), name="转给账单")
    with pytest.raises(ConfigurationError):
        Handoff(target="billing")  # type: ignore[arg-type]


def plain(name: str, **options: Any) -> Agent:
    """An agent for graph checks (its model is never called)."""
    return Agent(name=name, model="m", **options)


def test_graph_rejects_two_agents_with_the_same_name() -> None:
    with pytest.raises(ConfigurationError, match="two different agents are named 'billing'"):
        AgentGraph.build([plain("triage", handoffs=[plain("billing")]), plain("billing")])


def test_graph_rejects_two_tools_with_the_same_name() -> None:
    @tool(name="refund_status")
    def other_refund_status(invoice_id: str) -> str:
        """Another tool of the same name."""
        return invoice_id

    with pytest.raises(ConfigurationError, match="two different tools are named 'refund_status'"):
        AgentGraph.build(
            [plain("a", tools=[refund_status]), plain("b", tools=[other_refund_status])]
        )
    with pytest.raises(ConfigurationError, match="agent 'a' has two tools named 'refund_status'"):
        AgentGraph.build([plain("a", tools=[refund_status, refund_status])])


def test_graph_rejects_handoff_name_collisions() -> None:
    # One tool name, one meaning: one target, one on_handoff, never also a function tool.
    billing, support = plain("billing"), plain("support")
    with pytest.raises(ConfigurationError, match="leads to two different agents"):
        AgentGraph.build(
            [
                plain("a", handoffs=[Handoff(billing, name="escalate")]),
                plain("b", handoffs=[Handoff(support, name="escalate")]),
            ]
        )
    with pytest.raises(ConfigurationError, match="two tools named 'escalate'"):
        AgentGraph.build(
            [
                plain(
                    "a",
                    handoffs=[Handoff(billing, name="escalate"), Handoff(support, name="escalate")],
                )
            ]
        )

    @tool(name="transfer_to_billing")
    def fake_transfer() -> str:
        """A function tool that takes a handoff's name."""
        return ""

    routing, faking = plain("a", handoffs=[billing]), plain("b", tools=[fake_transfer])
    for roots in ([routing, faking], [faking, routing]):  # whichever the graph meets first
        with pytest.raises(ConfigurationError, match="collides with a function tool"):
            AgentGraph.build(roots)
    with pytest.raises(ConfigurationError, match="two different on_handoff callbacks"):
        AgentGraph.build(
            [
                plain("a", handoffs=[Handoff(billing, on_handoff=lambda a, d: None)]),
                plain("b", handoffs=[Handoff(billing, on_handoff=lambda a, d: None)]),
            ]
        )
    # A plain handoff next to one with a callback is fine: the callback is what gets registered.
    audit = lambda args, data: None  # noqa: E731
    audited = plain("b", handoffs=[Handoff(billing, on_handoff=audit)])
    for roots in ([routing, audited], [audited, routing]):
        graph = AgentGraph.build(roots)
        assert graph.handoffs["transfer_to_billing"].on_handoff is audit


def test_for_context_rewrite_keeps_the_targets_own_messages() -> None:
    # In a cycle A -> B -> A, A's earlier words stay its own; only B's become user-side context.
    lookup = ToolCall(id="c1", name="lookup_customer", arguments='{"email": "a@b.c"}')
    history = [
        Message.user("hi"),
        Message.assistant("Let me check.", [lookup]).model_copy(update={"agent": "triage"}),
        Message.tool_result(lookup, "plan pro").model_copy(update={"agent": "triage"}),
        Message.assistant("Refund approved.").model_copy(update={"agent": "billing"}),
    ]
    data = HandoffInputData(source="billing", target="triage", history=history)
    out = relaykit.for_context_rewrite(data)
    assert out[:3] == history[:3]
    assert out[3] == Message.user("For context: [billing] said: Refund approved.")


# --- the switch --------------------------------------------------------------------------------


async def test_target_sees_the_whole_history_and_only_the_system_prompt_is_rebuilt(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # After the switch the target gets every message, call and result, under its own system
    # prompt, tools, handoffs and the run's extra instructions.
    billing = agent(
        model_server,
        "billing",
        instructions="You handle billing.",
        description="Refunds and invoices.",
        tools=[refund_status],
    )
    support = agent(model_server, "support", instructions="You fix things.")
    triage = agent(
        model_server,
        "triage",
        instructions="You route.",
        tools=[lookup_customer],
        handoffs=[billing, Handoff(support, name="escalate", description="Anything technical.")],
    )
    billing.handoffs = [triage]
    model_server.script(
        model_name(triage),
        [
            batch(
                call("lookup_customer", email="ann@example.com"),
                call("transfer_to_billing", reason="double charge"),
                text="Routing you.",
            ),
        ],
    )
    model_server.script(model_name(billing), [text("Your refund is on its way.")])
    async with serving(client, triage) as worker:
        handle = await start_run(
            client,
            triage,
            "I was charged twice",
            task_queue=worker.task_queue,
            extra_instructions="Be brief.",
        )
        result = await handle.result()
    assert (result.output, result.final_agent) == ("Your refund is on its way.", "billing")
    [first] = model_server.requests(model_name(triage))
    assert first.system == "You route.\n\nBe brief."
    sent = tools_sent(first)
    assert list(sent) == ["lookup_customer", "transfer_to_billing", "escalate"]
    assert "billing" in sent["transfer_to_billing"]["description"]
    assert "Refunds and invoices." in sent["transfer_to_billing"]["description"]
    assert sent["escalate"]["description"] == "Anything technical."
    [second] = model_server.requests(model_name(billing))
    assert second.system == "You handle billing.\n\nBe brief."
    assert second.tool_names == ["refund_status", "transfer_to_triage"]
    assert [m["role"] for m in second.messages] == ["system", "user", "assistant", "tool", "tool"]
    assert second.messages[2]["content"] == "Routing you."
    assert [c["function"]["name"] for c in second.messages[2]["tool_calls"]] == [
        "lookup_customer",
        "transfer_to_billing",
    ]
    assert second.tool_results == [
        "ann@example.com: plan pro, two charges of 49 EUR on 2025-03-02",
        '{"assistant": "billing"}',
    ]
    assert model_server.request_count(model_name(support)) == 0


async def test_non_ascii_agent_name_routes_through_its_digest_tool_name(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # `账单专家` becomes transfer_to_agent_<digest>; calling that name reaches the agent.
    expert = agent(model_server, "账单专家", instructions="你负责账单。")
    triage = agent(model_server, "triage", handoffs=[expert])
    tool_name = tool_name_for("transfer_to_", "账单专家")
    model_server.script(model_name(triage), [call(tool_name)])
    model_server.script(model_name(expert), [text("已退款。")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "我被重复扣款了。", task_queue=worker.task_queue)
        result = await handle.result()
    assert model_server.requests(model_name(triage))[0].tool_names == [tool_name]
    assert (result.output, result.final_agent) == ("已退款。", "账单专家")
    assert model_server.requests(model_name(expert))[0].system == "你负责账单。"


async def test_second_handoff_in_same_turn_is_rejected_before_its_on_handoff_runs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Only the first handoff of a turn executes; the second gets an error result, unrun.
    ran: list[str] = []
    billing = agent(model_server, "billing")
    support = agent(model_server, "support")
    triage = agent(
        model_server,
        "triage",
        handoffs=[
            Handoff(billing, on_handoff=lambda args, data: ran.append("billing")),
            Handoff(support, on_handoff=lambda args, data: ran.append("support")),
        ],
    )
    model_server.script(
        model_name(triage), [batch(call("transfer_to_billing"), call("transfer_to_support"))]
    )
    model_server.script(model_name(billing), [text("billing here")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "help", task_queue=worker.task_queue)
        result = await handle.result()
    assert ran == ["billing"]
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "transfer_to_billing",
        "relaykit.model_call",
    ]
    accepted, rejected = [m for m in result.transcript if m.role == "tool"]
    assert not accepted.is_error
    assert rejected.is_error and "only the first handoff" in rejected.content
    assert result.final_agent == "billing"
    assert model_server.request_count(model_name(support)) == 0
    assert model_server.requests(model_name(billing))[0].tool_results[1].startswith("Error")


async def test_handoff_runs_in_request_order_among_the_turns_calls_and_switches_at_turn_end(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # lovia's order: a handoff listed first runs (its on_handoff) before the call after it,
    # alone; results keep call order, and only the next model call goes to the target.
    order: list[str] = []

    @tool
    def check_account(email: str) -> str:
        """Check an account.

        Args:
            email: The customer's e-mail address.
        """
        order.append("tool")
        return "account ok"

    billing = agent(model_server, "billing", instructions="You handle billing.")
    triage = agent(
        model_server,
        "triage",
        tools=[check_account],
        handoffs=[
            Handoff(billing, on_handoff=lambda args, data: order.append("handoff")),
        ],
    )
    model_server.script(
        model_name(triage),
        [
            batch(
                call("transfer_to_billing", reason="refund"), call("check_account", email="a@b.c")
            ),
        ],
    )
    model_server.script(model_name(billing), [text("done")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund please", task_queue=worker.task_queue)
        result = await handle.result()
    assert order == ["handoff", "tool"]
    events = await history_events(handle.workflow)
    ids = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            ids[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
    completed = {
        ids[e.activity_task_completed_event_attributes.scheduled_event_id]: e.event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    }
    tool_scheduled = next(i for i, name in ids.items() if name == "check_account")
    assert completed["transfer_to_billing"] < tool_scheduled
    assert [m.name for m in result.transcript if m.role == "tool"] == [
        "transfer_to_billing",
        "check_account",
    ]
    assert model_server.request_count(model_name(triage)) == 1
    [next_request] = model_server.requests(model_name(billing))
    assert next_request.system == "You handle billing."
    assert next_request.tool_results == ['{"assistant": "billing"}', "account ok"]


async def test_hallucinated_handoff_gets_an_error_result_and_no_switch(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # transfer_to_support exists in the graph, but not for triage: an error result, no switch.
    support = agent(model_server, "support")
    billing = agent(model_server, "billing", handoffs=[support])
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(
        model_name(triage), [call("transfer_to_support"), text("I will help myself.")]
    )
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "help", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    assert (result.output, result.final_agent) == ("I will help myself.", "triage")
    [error] = [m for m in result.transcript if m.role == "tool"]
    assert error.is_error and "Unknown tool 'transfer_to_support'" in error.content
    assert "transfer_to_billing" in error.content
    assert model_server.request_count(model_name(support)) == 0
    assert model_server.request_count(model_name(billing)) == 0
    assert not [e for e in events if e.kind == "handoff"]


# --- one run, one budget ------------------------------------------------------------------------


async def test_usage_and_turns_add_up_across_agents_without_a_child_workflow(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A handoff is no nested run: one usage total, one turn count, no child workflow.
    billing = agent(model_server, "billing", tools=[refund_status])
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(model_name(triage), [call("transfer_to_billing")])
    model_server.script(
        model_name(billing), [call("refund_status", invoice_id="INV-1"), text("refunded")]
    )
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund?", task_queue=worker.task_queue)
        result = await handle.result()
        assert (await handle.state()).usage == result.usage
    assert result.turns == 3
    assert (result.usage.requests, result.usage.input_tokens, result.usage.output_tokens) == (
        3,
        30,
        15,
    )
    child_events = {
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED,
    }
    assert not [e for e in await history_events(handle.workflow) if e.event_type in child_events]


async def test_max_turns_and_budget_count_across_agents(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # max_turns=2: triage's turn and billing's first turn use it up; a 25-token budget is
    # exceeded by billing's first call (15 tokens each).
    for limits, failure_type in (
        ({"max_turns": 2}, "MaxTurnsExceeded"),
        ({"budget": Budget(max_total_tokens=25)}, "BudgetExceeded"),
    ):
        billing = agent(model_server, "billing", tools=[refund_status])
        triage = agent(model_server, "triage", handoffs=[billing])
        model_server.script(model_name(triage), [call("transfer_to_billing")])
        model_server.script(model_name(billing), [call("refund_status", invoice_id="INV-1")] * 3)
        async with serving(client, triage) as worker:
            handle = await start_run(
                client, triage, "refund?", task_queue=worker.task_queue, **limits
            )
            with pytest.raises(RunFailed) as failure:
                await handle.result()
        assert failure.value.type == failure_type
        assert model_server.request_count(model_name(triage)) == 1
        assert model_server.request_count(model_name(billing)) == 1


async def test_cycles_between_agents_are_legal_and_bounded_by_max_turns(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # triage -> billing -> triage finishes normally; endless ping-pong stops at max_turns.
    billing = agent(model_server, "billing")
    triage = agent(model_server, "triage", handoffs=[billing])
    billing.handoffs = [triage]
    model_server.script(model_name(triage), [call("transfer_to_billing"), text("back at triage")])
    model_server.script(model_name(billing), [call("transfer_to_triage", reason="not billing")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "hi", task_queue=worker.task_queue)
        result = await handle.result()
        handoffs = [
            (e.data["from"], e.data["to"]) for e in await handle.events() if e.kind == "handoff"
        ]
    assert (result.output, result.final_agent, result.turns) == ("back at triage", "triage", 3)
    assert handoffs == [("triage", "billing"), ("billing", "triage")]

    model_server.script(model_name(triage), [call("transfer_to_billing")] * 3)
    model_server.script(model_name(billing), [call("transfer_to_triage")] * 3)
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "ping", task_queue=worker.task_queue, max_turns=5)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "MaxTurnsExceeded"
    assert model_server.request_count(model_name(triage)) == 2 + 3
    assert model_server.request_count(model_name(billing)) == 1 + 2


# --- output types -------------------------------------------------------------------------------


class Refund(BaseModel):
    invoice_id: str
    approved: bool


class Ticket(BaseModel):
    queue: str
    summary: str


async def test_each_agent_uses_its_own_output_type_after_the_switch(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Without a run-level override the output constraint changes with the agent.
    billing = agent(model_server, "billing", output_type=Refund)
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(model_name(triage), [call("transfer_to_billing")])
    model_server.script(model_name(billing), [text('{"invoice_id": "INV-1", "approved": true}')])
    async with serving(client, triage) as worker:
        result = await (
            await start_run(client, triage, "refund?", task_queue=worker.task_queue)
        ).result()
    assert result.output == {"invoice_id": "INV-1", "approved": True}
    assert "response_format" not in model_server.requests(model_name(triage))[0].body
    schema = model_server.requests(model_name(billing))[0].body["response_format"]["json_schema"][
        "schema"
    ]
    assert schema["required"] == ["invoice_id", "approved"]


# Agents of the user workflow below: module-level and model-less, as in an application (the
# worker's default model serves them).
override_billing = Agent(
    name="override_billing", instructions="You handle billing.", output_type=Refund
)
override_triage = Agent(
    name="override_triage", instructions="You route.", handoffs=[override_billing]
)


@workflow.defn
class RouteToTicket:
    """A user workflow that runs an agent with a run-level output type."""

    @workflow.run
    async def run(self, prompt: str) -> Any:
        result = await relaykit.run_agent(override_triage, prompt, output_type=Ticket)
        return {"output": result.output, "final_agent": result.final_agent}


async def test_run_level_output_type_follows_the_run_across_handoffs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # run_agent(..., output_type=Ticket) constrains every agent the run reaches, overriding
    # billing's own Refund.
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("transfer_to_override_billing"),
            text('{"queue": "billing", "summary": "double charge"}'),
        ],
    )
    async with serving(
        client, override_triage, default_model=model, workflows=[RouteToTicket]
    ) as worker:
        outcome = await client.execute_workflow(
            RouteToTicket.run,
            "charged twice",
            id=f"route-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
        )
    assert outcome == {
        "output": {"queue": "billing", "summary": "double charge"},
        "final_agent": "override_billing",
    }
    triage_request, billing_request = model_server.requests(model.name)
    assert triage_request.system.startswith("You route.\n\n## Output format")
    assert billing_request.system.startswith("You handle billing.\n\n## Output format")
    for request in (triage_request, billing_request):
        assert request.body["response_format"]["json_schema"]["schema"]["required"] == [
            "queue",
            "summary",
        ]
        assert '"title":"Ticket"' in request.system  # the run's type is the one stated


# --- on_handoff and input_filter ----------------------------------------------------------------


async def test_on_handoff_runs_as_an_activity_named_after_the_handoff_tool(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The callback gets the model's reason and who hands over to whom, as an activity.
    seen: list[tuple[HandoffArgs, HandoffCallbackInput]] = []

    async def audit(args: HandoffArgs, data: HandoffCallbackInput) -> None:
        seen.append((args, data))

    billing = agent(model_server, "billing")
    triage = agent(
        model_server, "triage", handoffs=[Handoff(billing, name="to_billing", on_handoff=audit)]
    )
    model_server.script(model_name(triage), [call("to_billing", reason="charged twice")])
    model_server.script(model_name(billing), [text("ok")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "help", task_queue=worker.task_queue)
        await handle.result()
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "to_billing",
        "relaykit.model_call",
    ]
    [(args, data)] = seen
    assert args.reason == "charged twice"
    assert (data.source, data.target, data.reason, data.turn, data.workflow_id) == (
        "triage",
        "billing",
        "charged twice",
        1,
        handle.id,
    )
    assert (await activity_summaries(handle.workflow, client))[1] == "triage → billing"


async def test_failing_on_handoff_is_an_error_result_and_no_switch(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A callback that keeps failing cancels the handoff; the source agent reads why.
    attempts: list[int] = []

    def broken(args: HandoffArgs, data: HandoffCallbackInput) -> None:
        attempts.append(1)
        raise RuntimeError("audit log unavailable")

    billing = agent(model_server, "billing")
    triage = agent(model_server, "triage", handoffs=[Handoff(billing, on_handoff=broken)])
    model_server.script(model_name(triage), [call("transfer_to_billing"), text("I'll handle it.")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "help", task_queue=worker.task_queue)
        result = await handle.result()
    assert (result.output, result.final_agent) == ("I'll handle it.", "triage")
    [failed] = [m for m in result.transcript if m.role == "tool"]
    assert failed.is_error and "audit log unavailable" in failed.content
    assert attempts  # it ran (a bounded number of times)
    assert model_server.request_count(model_name(billing)) == 0
    assert "audit log unavailable" in model_server.requests(model_name(triage))[1].tool_results[0]


async def test_remove_tool_calls_filter_hides_calls_and_results_from_the_target(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The target sees what people and agents said, not the tool traffic.
    billing = agent(model_server, "billing", instructions="You handle billing.")
    triage = agent(
        model_server,
        "triage",
        tools=[lookup_customer],
        handoffs=[
            Handoff(billing, input_filter=relaykit.remove_tool_calls),
        ],
    )
    model_server.script(
        model_name(triage),
        [
            call("lookup_customer", email="ann@example.com"),
            batch(call("transfer_to_billing"), text="Ann has two charges; passing you to billing."),
        ],
    )
    model_server.script(model_name(billing), [text("refunded")])
    async with serving(client, triage) as worker:
        await (
            await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        ).result()
    [request] = model_server.requests(model_name(billing))
    assert [(m["role"], m["content"]) for m in request.messages[1:]] == [
        ("user", "charged twice"),
        ("assistant", "Ann has two charges; passing you to billing."),
    ]


async def test_for_context_rewrite_filter_turns_other_agents_words_into_context(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Eino's rewrite: "For context: [triage] said …", so billing does not take it as its own.
    billing = agent(model_server, "billing", instructions="You handle billing.")
    triage = agent(
        model_server,
        "triage",
        tools=[lookup_customer],
        handoffs=[
            Handoff(billing, input_filter=relaykit.for_context_rewrite),
        ],
    )
    model_server.script(
        model_name(triage),
        [
            batch(call("lookup_customer", email="ann@example.com"), text="Checking."),
            call("transfer_to_billing"),
        ],
    )
    model_server.script(model_name(billing), [text("refunded")])
    async with serving(client, triage) as worker:
        await (
            await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        ).result()
    [request] = model_server.requests(model_name(billing))
    assert [m["role"] for m in request.messages[1:]] == ["user"] * 6
    assert [m["content"] for m in request.messages[1:]] == [
        "charged twice",
        "For context: [triage] said: Checking.",
        "For context: [triage] called tool `lookup_customer` with arguments: "
        '{"email": "ann@example.com"}',
        "For context: [triage] `lookup_customer` tool returned result: "
        "ann@example.com: plan pro, two charges of 49 EUR on 2025-03-02",
        "For context: [triage] called tool `transfer_to_billing` with arguments: {}",
        "For context: [triage] `transfer_to_billing` tool returned result: "
        '{"assistant": "billing"}',
    ]


def _raising_filter(data: HandoffInputData) -> list[Message]:
    raise ValueError("no history for you")


def _dict_filter(data: HandoffInputData) -> list[Message]:
    return [{"role": "user", "content": "hi"}]  # type: ignore[list-item]


def _clock_filter(data: HandoffInputData) -> list[Message]:
    import datetime

    datetime.datetime.now()  # refused by the workflow sandbox: not deterministic
    return data.history


@pytest.mark.parametrize(
    ("input_filter", "problem"),
    [
        (_raising_filter, "raised ValueError: no history for you"),
        (_dict_filter, "returned a dict among its messages"),
        (_clock_filter, "raised RestrictedWorkflowAccessError"),
    ],
)
async def test_a_broken_input_filter_ends_the_run_with_a_typed_error(
    client: Client, model_server: ScriptedModelServer, input_filter: Any, problem: str
) -> None:
    # A bug in workflow code would fail every retry of the task alike: the run ends instead,
    # saying whose filter and what went wrong.
    billing = agent(model_server, "billing")
    triage = agent(model_server, "triage", handoffs=[Handoff(billing, input_filter=input_filter)])
    model_server.script(model_name(triage), [call("transfer_to_billing")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "help", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await asyncio.wait_for(handle.result(), timeout=30)
    assert failure.value.type == "HandoffFilterFailed"
    assert failure.value.message.startswith(
        f"the input_filter of handoff triage → billing {problem}"
    )
    assert model_server.request_count(model_name(billing)) == 0
    assert not [
        e
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


# --- durability and visibility ------------------------------------------------------------------


async def test_current_agent_shows_in_queries_search_attributes_events_and_details(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # While billing thinks, every window on the run names billing as its current agent.
    hold = threading.Event()
    billing = agent(model_server, "billing")
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(model_name(triage), [call("transfer_to_billing", reason="double charge")])
    model_server.script(model_name(billing), [text("refunded", hold=hold)])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        try:
            await asyncio.to_thread(model_server.wait_for_requests, model_name(billing), 1)
            assert await handle.workflow.query("current_agent") == "billing"
            snapshot = await handle.state()
            assert (snapshot.agent, snapshot.turn, snapshot.status) == ("billing", 2, "running")
            description = await handle.workflow.describe()
            assert description.typed_search_attributes.get(RELAY_AGENT) == "billing"
            metadata = await handle.workflow.query(
                "__temporal_workflow_metadata", result_type=WorkflowMetadata
            )
            assert "**agent:** billing" in metadata.current_details
            [handoff] = [e for e in await handle.events() if e.kind == "handoff"]
            assert handoff.data == {
                "from": "triage",
                "to": "billing",
                "reason": "double charge",
                "turn": 1,
            }
            assert handoff.agent == "triage"
        finally:
            hold.set()
        assert (await handle.result()).output == "refunded"


async def test_new_worker_continues_a_handed_over_run_with_the_target_agent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The current agent is in the run's state, not in a worker: after a restart the run goes on
    # with billing, and triage's model call is not made again.
    hold = threading.Event()
    billing = agent(model_server, "billing", instructions="You handle billing.")
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(model_name(triage), [call("transfer_to_billing")])
    model_server.script(
        model_name(billing), [text("lost with the first worker", hold=hold), text("refunded")]
    )
    task_queue = f"tq-{uuid.uuid4().hex[:10]}"
    async with serving(client, triage, task_queue=task_queue):
        handle = await start_run(client, triage, "charged twice", task_queue=task_queue)
        await asyncio.to_thread(model_server.wait_for_requests, model_name(billing), 1)
    # The first worker is gone, its model call cut off mid-request.
    async with serving(client, triage, task_queue=task_queue):
        hold.set()
        result = await handle.result()
    assert (result.output, result.final_agent) == ("refunded", "billing")
    assert model_server.request_count(model_name(triage)) == 1
    requests = model_server.requests(model_name(billing))
    assert len(requests) == 2
    assert requests[1].system == "You handle billing."


async def test_activity_summaries_name_the_agent_of_each_turn(
    client: Client, model_server: ScriptedModelServer
) -> None:
    billing = agent(model_server, "billing", tools=[refund_status])
    triage = agent(model_server, "triage", handoffs=[billing])
    model_server.script(model_name(triage), [call("transfer_to_billing")])
    model_server.script(
        model_name(billing), [call("refund_status", invoice_id="INV-1"), text("refunded")]
    )
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund?", task_queue=worker.task_queue)
        await handle.result()
    assert await activity_summaries(handle.workflow, client) == [
        f"triage · turn 1 · {model_name(triage)}",
        f"billing · turn 2 · {model_name(billing)}",
        "refund_status(invoice_id=INV-1)",
        f"billing · turn 3 · {model_name(billing)}",
    ]


# --- the example --------------------------------------------------------------------------------


async def test_triage_example_routes_to_billing_and_support_end_to_end(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # examples/triage.py, served as `relaykit worker examples.triage` would, with the scripted
    # stand-in for the worker's default model.
    from examples import triage as example
    from relaykit.loading import load_agents

    assert {a.name for a in load_agents("examples.triage")} == {"triage", "billing", "support"}
    model = scripted_model(model_server)
    model_server.respond(model.name, example.scripted_triage)
    async with serving(client, [example.triage], default_model=model) as worker:
        queue = worker.task_queue
        billing_run = await start_run(client, "triage", "I was charged twice", task_queue=queue)
        support_run = await start_run(
            client, "triage", "Login fails with error 500", task_queue=queue
        )
        billed, supported = await billing_run.result(), await support_run.result()
        support_events = await support_run.events()
    assert billed.final_agent == "billing"
    assert "INV-1042" in billed.output and "refund of 49.00 EUR approved" in billed.output
    assert await scheduled_activities(billing_run.workflow) == [
        "relaykit.model_call",
        "transfer_to_billing",
        "relaykit.model_call",
        "lookup_invoice",
        "relaykit.model_call",
        "refund_status",
        "relaykit.model_call",
    ]
    assert supported.final_agent == "support"
    assert "degraded" in supported.output
    assert [e.data["to"] for e in support_events if e.kind == "handoff"] == ["support"]


async def test_the_on_handoff_activity_result_reads_source_to_target_in_the_ui(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The Temporal UI shows the activity's result; it names the two agents instead of a
    # binary/null payload.
    billing = agent(model_server, "billing")
    triage = agent(
        model_server,
        "triage",
        handoffs=[
            Handoff(billing, on_handoff=lambda args, data: None),
        ],
    )
    model_server.script(model_name(triage), [call("transfer_to_billing", reason="refund")])
    model_server.script(model_name(billing), [text("done")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund please", task_queue=worker.task_queue)
        await handle.result()
    events = await history_events(handle.workflow)
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    [payload] = [
        e.activity_task_completed_event_attributes.result.payloads[0]
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        and scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
        == "transfer_to_billing"
    ]
    assert payload.metadata["encoding"] == b"json/plain"
    assert json.loads(payload.data) == {"handoff": "triage → billing"}
