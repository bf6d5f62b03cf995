"""lovia's semantics where relaykit once differed (issue 25): tool names, handoff arguments,
output repairs, the output schema in the system prompt, and call order around a handoff.

The expected names were measured against lovia 0.9.119 itself. Runs started before each change
keep the behaviour they began with; the last test starts a run from the state such a run
carries across a continue-as-new (``RunSetup`` without the new choices).
"""

from __future__ import annotations

import json
import re
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, Handoff, Message, ModelSpec, RunFailed, get_run, start_run, tool
from relaykit.graph import AgentGraph
from relaykit.names import MAX_TOOL_NAME, agent_tool_name, is_valid_tool_name, tool_name_for
from relaykit.runs import RunInput, RunSetup, RunState
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW
from tests.support import history_events, scheduled_activities, scripted_model, serving


def agent(server: ScriptedModelServer, name: str, **options: Any) -> Agent:
    return Agent(name=name, model=scripted_model(server), **options)


def model_of(some_agent: Agent) -> str:
    return some_agent.model.name  # type: ignore[union-attr]


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.body.get("tools") or []]


async def schedule_and_completion(handle: Any) -> tuple[dict[str, int], dict[str, int]]:
    """Activity type → event id of its (first) scheduling, and of its completion."""
    events = await history_events(handle)
    scheduled: dict[int, str] = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            scheduled[e.event_id] = e.activity_task_scheduled_event_attributes.activity_type.name
    completed: dict[str, int] = {}
    for e in events:
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            name = scheduled[e.activity_task_completed_event_attributes.scheduled_event_id]
            completed.setdefault(name, e.event_id)
    first: dict[str, int] = {}
    for event_id, name in scheduled.items():
        first.setdefault(name, event_id)
    return first, completed


# --- 1. tool names ------------------------------------------------------------------------------


def test_handoff_and_agent_tool_names_follow_lovias_rule_with_a_digest_only_when_they_must() -> (
    None
):
    # Capitals, spaces and hyphens need no digest; non-ASCII letters are dropped; punctuation
    # is dropped and each space or hyphen is one underscore (values measured with lovia).
    billing = Agent(name="Billing Team")
    assert Handoff(target=billing).tool_name == "transfer_to_billing_team"
    assert billing.as_tool().name == "ask_billing_team"
    assert Handoff(target=Agent(name="support-desk")).tool_name == "transfer_to_support_desk"
    assert agent_tool_name("transfer_to_", "Équipe Facturation") == "transfer_to_quipe_facturation"
    assert agent_tool_name("transfer_to_", "a - b") == "transfer_to_a___b"
    assert agent_tool_name("ask_", "Q&A (beta)") == "ask_qa_beta"
    # A digest only when the slug is empty or too long: stable, distinct, within 64 characters.
    chinese = agent_tool_name("transfer_to_", "账单专家")
    assert re.fullmatch(r"transfer_to_agent_[0-9a-f]{8}", chinese)
    assert chinese != agent_tool_name("transfer_to_", "客服专家")
    long_a, long_b = (
        agent_tool_name("ask_", "x" * 100 + "a"),
        agent_tool_name("ask_", "x" * 100 + "b"),
    )
    assert long_a != long_b and re.fullmatch(r"ask_x+_[0-9a-f]{8}", long_a)
    assert all(len(n) <= MAX_TOOL_NAME and is_valid_tool_name(n) for n in (chinese, long_a, long_b))
    # The earlier name stays known, for runs started with it.
    assert Handoff(target=billing).legacy_name == "transfer_to_billing_team_40edd973"
    assert billing.as_tool().legacy_name == "ask_billing_team_40edd973"
    assert Handoff(target=billing, name="to_billing").legacy_name == "to_billing"


def test_two_default_names_that_would_collide_in_one_agent_each_get_a_digest() -> None:
    # "Billing Team" and "billing-team" share lovia's slug: both get a digest of their own name;
    # a name given explicitly keeps its name.
    team, dashed = Agent(name="Billing Team"), Agent(name="billing-team")
    router = Agent(
        name="router", handoffs=[team, dashed], tools=[team.as_tool(), dashed.as_tool(name="ask_x")]
    )
    AgentGraph.build(
        [router], default_model=ModelSpec(provider="openai", name="m")
    )  # no clash left
    handoff_names = [
        (h if isinstance(h, Handoff) else Handoff(target=h)).tool_name for h in router.handoffs
    ]
    assert len(set(handoff_names)) == 2
    assert all(re.fullmatch(r"transfer_to_billing_team_[0-9a-f]{8}", n) for n in handoff_names)
    assert [t.name for t in router.tools] == ["ask_billing_team", "ask_x"]


async def test_a_new_run_offers_lovias_names_and_a_call_by_an_earlier_name_still_resolves(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The model sees transfer_to_billing_team / ask_research_desk; on_handoff runs as the
    # activity of that name; a call by the earlier, digested name still hands off.
    audited: list[str | None] = []
    research = agent(model_server, "Research Desk")
    billing = agent(model_server, "Billing Team")
    triage = agent(
        model_server,
        "lovia_names_triage",
        tools=[research.as_tool()],
        handoffs=[Handoff(billing, on_handoff=lambda args, data: audited.append(args.reason))],
    )
    model_server.script(model_of(research), [text("INV-7 was charged twice.")])
    model_server.script(
        model_of(triage),
        [
            call("ask_research_desk", input="What happened to INV-7?"),
            call("transfer_to_billing_team_40edd973", reason="double charge"),
        ],
    )
    model_server.script(model_of(billing), [text("Refunded.")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        result = await handle.result()
    first = model_server.requests(model_of(triage))[0]
    assert tool_names(first) == ["ask_research_desk", "transfer_to_billing_team"]
    assert model_server.requests(model_of(triage))[1].tool_results == ["INV-7 was charged twice."]
    assert (result.final_agent, result.output) == ("Billing Team", "Refunded.")
    assert audited == ["double charge"]
    assert "transfer_to_billing_team" in await scheduled_activities(handle.workflow)


# --- 2. handoff arguments -----------------------------------------------------------------------


async def test_handoff_with_extra_keys_and_a_non_string_reason_is_handed_off(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Extra keys are ignored; a reason of any JSON type reaches on_handoff as its JSON text.
    reasons: list[str | None] = []
    billing = agent(model_server, "lenient_billing")
    triage = agent(
        model_server,
        "lenient_triage",
        handoffs=[
            Handoff(
                billing,
                name="transfer_to_billing",
                on_handoff=lambda a, d: reasons.append(a.reason),
            ),
        ],
    )
    model_server.script(
        model_of(triage),
        [
            call("transfer_to_billing", reason={"code": 7, "text": "doppelt"}, priority="high"),
        ],
    )
    model_server.script(model_of(billing), [text("Refunded.")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    assert result.final_agent == "lenient_billing"
    assert model_server.request_count(model_of(triage)) == 1  # no turn spent on an error
    assert reasons == ['{"code": 7, "text": "doppelt"}']
    [switch] = [e for e in events if e.kind == "handoff"]
    assert switch.data["reason"] == '{"code": 7, "text": "doppelt"}'


# --- 3. output repairs --------------------------------------------------------------------------


class Answer(BaseModel):
    city: str
    temperature: float


async def test_agent_output_retries_sets_how_many_repairs_follow_an_invalid_answer(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # output_retries=2: two invalid answers are repaired and the third, valid one wins.
    structured = agent(model_server, "two_repairs", output_type=Answer, output_retries=2)
    model_server.script(
        model_of(structured),
        [
            text("no"),
            text('{"city": "Paris"}'),
            text('{"city": "Paris", "temperature": 14}'),
        ],
    )
    async with serving(client, structured) as worker:
        handle = await start_run(client, structured, "weather", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == {"city": "Paris", "temperature": 14.0}
    assert model_server.request_count(model_of(structured)) == 3


async def test_a_run_level_output_retries_overrides_the_agents_and_fails_typed(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # output_retries=0 for the run: the first invalid answer ends it with OutputValidationFailed.
    structured = agent(model_server, "no_repairs", output_type=Answer, output_retries=3)
    model_server.script(model_of(structured), [text("no"), text("unused")])
    async with serving(client, structured) as worker:
        handle = await start_run(
            client, structured, "weather", task_queue=worker.task_queue, output_retries=0
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "OutputValidationFailed"
    assert "after 0 repairs" in str(failure.value)
    assert model_server.request_count(model_of(structured)) == 1


# --- 4. where the output schema goes ------------------------------------------------------------


async def test_output_schema_is_stated_in_the_system_prompt_as_well_as_in_response_format(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A server that ignores response_format still shows the model the schema, after the
    # agent's instructions and the run's extra instructions.
    structured = agent(
        model_server, "schema_in_prompt", instructions="Report the weather.", output_type=Answer
    )
    model_server.script(model_of(structured), [text('{"city": "Oslo", "temperature": 3}')])
    async with serving(client, structured) as worker:
        handle = await start_run(
            client,
            structured,
            "weather",
            task_queue=worker.task_queue,
            extra_instructions="Be brief.",
        )
        await handle.result()
    [request] = model_server.requests(model_of(structured))
    schema = request.body["response_format"]["json_schema"]["schema"]
    head, _, stated = request.system.partition("## Output format\n")
    assert head.startswith("Report the weather.\n\nBe brief.")
    assert json.dumps(schema, separators=(",", ":")) in stated
    assert "only a JSON document" in stated


# --- 5. order inside a turn ---------------------------------------------------------------------


async def test_calls_before_a_handoff_finish_before_it_and_calls_after_it_start_after_it(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # tool, handoff, tool: the first tool completes before on_handoff starts, which completes
    # before the second tool starts; a second handoff is still refused unrun.
    @tool
    def note_before(text: str) -> str:
        """Note something before."""
        return "noted before"

    @tool
    def note_after(text: str) -> str:
        """Note something after."""
        return "noted after"

    billing = agent(model_server, "order_billing")
    support = agent(model_server, "order_support")
    triage = agent(
        model_server,
        "order_triage",
        tools=[note_before, note_after],
        handoffs=[
            Handoff(billing, name="transfer_to_billing", on_handoff=lambda a, d: None),
            Handoff(support, name="transfer_to_support", on_handoff=lambda a, d: None),
        ],
    )
    model_server.script(
        model_of(triage),
        [
            batch(
                call("note_before", text="a"),
                call("transfer_to_billing", reason="refund"),
                call("note_after", text="b"),
                call("transfer_to_support"),
            )
        ],
    )
    model_server.script(model_of(billing), [text("done")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund", task_queue=worker.task_queue)
        result = await handle.result()
    first, completed = await schedule_and_completion(handle.workflow)
    assert completed["note_before"] < first["transfer_to_billing"]
    assert completed["transfer_to_billing"] < first["note_after"]
    assert "transfer_to_support" not in first
    assert result.final_agent == "order_billing"
    assert [m.name for m in result.transcript if m.role == "tool"] == [
        "note_before",
        "transfer_to_billing",
        "note_after",
        "transfer_to_support",
    ]
    assert model_server.request_count(model_of(triage)) == 1  # the switch is at the turn's end


# --- runs started before keep what they began with ------------------------------------------------


async def test_a_run_continued_from_one_started_before_keeps_the_earlier_semantics(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A state without the new RunSetup choices (as a run started before carries it across a
    # continue-as-new): earlier names, strict handoff arguments, the handoff after the turn's
    # other calls, two repairs, and the schema only in response_format.
    order: list[str] = []

    @tool
    def check_account(email: str) -> str:
        """Check an account."""
        order.append("tool")
        return "ok"

    billing = agent(model_server, "Old Billing", output_type=Answer)
    triage = agent(
        model_server,
        "old_triage",
        tools=[check_account],
        handoffs=[
            Handoff(billing, on_handoff=lambda a, d: order.append("handoff")),
        ],
    )
    legacy = tool_name_for("transfer_to_", "Old Billing")
    model_server.script(
        model_of(triage),
        [
            call(legacy, reason="refund", priority="high"),
            batch(call(legacy, reason="refund"), call("check_account", email="a@b.c")),
        ],
    )
    model_server.script(
        model_of(billing),
        [
            text("no"),
            text("still no"),
            text('{"city": "Paris", "temperature": 14}'),
        ],
    )
    state = RunState(agent="old_triage", transcript=[Message.user("refund")], setup=RunSetup())
    run_id = f"old-run-{uuid.uuid4().hex[:8]}"
    async with serving(client, triage) as worker:
        await client.start_workflow(
            AGENT_RUN_WORKFLOW,
            RunInput(agent="old_triage", input="refund", state=state),
            id=run_id,
            task_queue=worker.task_queue,
        )
        handle = get_run(client, run_id)
        result = await handle.result()
    first, second = model_server.requests(model_of(triage))
    assert tool_names(first) == ["check_account", legacy]
    assert "priority" in second.tool_results[0]  # strict: the extra key was refused
    assert order == ["tool", "handoff"]
    assert legacy in await scheduled_activities(handle.workflow)
    assert result.output == {"city": "Paris", "temperature": 14.0}
    requests = model_server.requests(model_of(billing))
    assert len(requests) == 3
    assert "Output format" not in requests[0].system
