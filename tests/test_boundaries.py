"""The turn loop's boundaries: whatever a model writes gets a defined outcome (docs/boundaries.md).

Repeated, empty and unsafe call ids; arguments that are not a JSON object; handoffs with invalid
arguments; approval predicates that raise; the order of a turn's calls around an approval; the
run path of handoff events; and choices recorded once per run so that a worker configured the
other way still replays it. Real dev server, scripted model over HTTP.
"""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from typing import Any

from pydantic import BaseModel, field_validator
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from relaykit import Agent, Handoff, RunHandle, registry, start_run, tool
from relaykit.graph import AgentGraph
from relaykit.messages import Message, ToolCall
from relaykit.model_output import check_calls
from relaykit.sandbox import sandbox_runner
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from relaykit.workflows.agent_run import AgentRun
from tests.support import eventually, history_events, scheduled_activities, scripted_model, serving
from tests.test_approvals import waiting_for_approval


def make_refund(invocations: list[str], **options: Any) -> Any:
    @tool(needs_approval=True, **options)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order (a person approves first).

        Args:
            order_id: The order.
            amount: Euros.
        """
        invocations.append(f"refund {order_id}")
        return f"refunded {amount} for {order_id}"

    return refund


def make_notify(invocations: list[str]) -> Any:
    @tool
    def notify(order_id: str) -> str:
        """Tell the customer about their order.

        Args:
            order_id: The order.
        """
        invocations.append(f"notify {order_id}")
        return f"notified about {order_id}"

    return notify


RUN_TIMEOUT = 60.0
"""A run these tests start ends within seconds; one that does not is wedged (a failure, not a
hang of the whole test run)."""


async def finished(handle: RunHandle) -> Any:
    return await asyncio.wait_for(handle.result(), RUN_TIMEOUT)


async def workflow_task_failures(handle: RunHandle) -> int:
    return sum(
        e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        for e in await history_events(handle.workflow)
    )


def sent_calls(request: Any) -> list[dict[str, Any]]:
    """The assistant tool calls an OpenAI-shaped request sends back, in order."""
    return [
        c
        for m in request.messages
        if m.get("role") == "assistant"
        for c in m.get("tool_calls") or []
    ]


# --- call ids -----------------------------------------------------------------------------------


def test_call_ids_become_unique_and_safe_within_a_turn_and_arguments_json_objects() -> None:
    message = Message.assistant(
        tool_calls=[
            ToolCall(id="dup", name="a", arguments='{"x": 1}'),
            ToolCall(id="dup", name="a", arguments="{bad"),
            ToolCall(id="", name="b", arguments=""),
            ToolCall(id="呼叫", name="b", arguments="[1, 2]"),
            ToolCall(id="x" * 300, name="b", arguments='{"v": NaN}'),
            ToolCall(id="rk_3_1", name="c"),  # a provider id that looks like a replacement
            ToolCall(id="call_7", name="工具"),  # no provider accepts that name back
        ]
    )
    checked = check_calls(message, turn=3)
    assert (
        check_calls(message, turn=3, run_key="run-a").calls[1].id
        != check_calls(message, turn=3, run_key="run-b").calls[1].id
    )
    ids = [c.id for c in checked.calls]
    assert ids[0] == "dup" and len(set(ids)) == len(ids)
    assert all(
        c.id == r.id for c, r in zip(checked.calls, checked.recorded.tool_calls, strict=True)
    )
    assert [c.arguments for c in checked.calls] == [c.arguments for c in message.tool_calls]
    recorded = [json.loads(c.arguments) for c in checked.recorded.tool_calls]
    assert all(isinstance(r, dict) for r in recorded)
    assert recorded[1] == {"invalid_arguments": "{bad"} and recorded[2] == {}
    assert checked.ids_changed and checked.arguments_changed
    assert checked.calls[6].name == "工具"  # runs as written: the model reads "unknown tool"
    assert re.fullmatch(r"invalid_tool_name_[0-9a-f]{8}", checked.recorded.tool_calls[6].name)
    # Well-formed input passes through untouched (and is the very same message).
    clean = Message.assistant(tool_calls=[ToolCall(id="call_1", name="a", arguments="{}")])
    assert check_calls(clean, turn=1).recorded is clean


async def test_two_calls_with_one_id_both_needing_approval_are_answered_one_by_one(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The provider repeats an id: the second call gets a unique one, both wait for a person in
    # turn, and the transcript sent back pairs each call with its own result.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("refund", id="call_same", order_id="A1", amount=1),
                call("refund", id="call_same", order_id="B2", amount=2),
            ),
            text("done"),
        ],
    )
    agent = Agent(name="dup_ids", model=model, tools=[make_refund(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund both", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        (first,) = await handle.pending_approvals()
        assert first.call_id == "call_same"
        await handle.approve("call_same")

        async def second_pending() -> bool:
            return [p.call_id for p in await handle.pending_approvals()] != ["call_same"]

        await eventually(second_pending, "the second call's approval")
        (second_call,) = await handle.pending_approvals()
        assert re.fullmatch(r"rk_[0-9a-f]{6}_1_1", second_call.call_id)
        await handle.approve(second_call.call_id, approved=False, reason="only one refund")
        result = await finished(handle)
    assert result.output == "done" and refunds == ["refund A1"]
    assert await workflow_task_failures(handle) == 0
    [_, second] = model_server.requests(model.name)
    assert [c["id"] for c in sent_calls(second)] == ["call_same", second_call.call_id]
    results = [m for m in second.messages if m.get("role") == "tool"]
    assert [m["tool_call_id"] for m in results] == ["call_same", second_call.call_id]
    assert "only one refund" in results[1]["content"]


async def test_empty_and_non_ascii_call_ids_get_ids_every_provider_accepts(
    client: Client, model_server: ScriptedModelServer
) -> None:
    seen: list[str] = []
    model = scripted_model(model_server, provider="anthropic")
    model_server.script(
        model.name,
        [
            batch(call("notify", id="", order_id="A1"), call("notify", id="呼叫 1", order_id="B2")),
            text("told them"),
        ],
    )
    agent = Agent(name="odd_ids", model=model, tools=[make_notify(seen)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "notify", task_queue=worker.task_queue)
        result = await finished(handle)
    assert result.output == "told them" and sorted(seen) == ["notify A1", "notify B2"]
    [assistant] = [m for m in result.transcript if m.role == "assistant" and m.tool_calls]
    ids = [c.id for c in assistant.tool_calls]
    assert [re.sub(r"^rk_[0-9a-f]{6}_", "rk_", i) for i in ids] == ["rk_1_0", "rk_1_1"]
    second = model_server.requests(model.name)[1]
    uses = [
        b["id"]
        for m in second.messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b.get("type") == "tool_use"
    ]
    assert uses == ids


# --- arguments ----------------------------------------------------------------------------------


async def test_arguments_that_are_not_a_json_object_get_an_error_and_go_back_as_json(
    client: Client, model_server: ScriptedModelServer
) -> None:
    seen: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("notify", raw_arguments='{"order_id": "A1"'),
                call("notify", raw_arguments='["A1"]'),
                call("notify", raw_arguments='{"order_id": NaN}'),
            ),
            call("notify", order_id="A1"),
            text("told them"),
        ],
    )
    agent = Agent(name="bad_json", model=model, tools=[make_notify(seen)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "notify", task_queue=worker.task_queue)
        result = await finished(handle)
    assert result.output == "told them" and seen == ["notify A1"]
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "relaykit.model_call",
        "notify",
        "relaykit.model_call",
    ]
    second = model_server.requests(model.name)[1]
    sent = [json.loads(c["function"]["arguments"]) for c in sent_calls(second)]
    assert sent == [
        {"invalid_arguments": '{"order_id": "A1"'},
        {"invalid_arguments": '["A1"]'},
        {"invalid_arguments": '{"order_id": NaN}'},
    ]
    errors = second.tool_results
    assert "not valid JSON" in errors[0] and "must be a JSON object, not an array" in errors[1]
    assert "not valid JSON" in errors[2]
    assert all("call it again" in e for e in errors)


async def test_a_raising_approval_predicate_becomes_an_error_result(
    client: Client, model_server: ScriptedModelServer
) -> None:
    def risky(args: dict[str, Any]) -> bool:
        return 100 / args["amount"] > 1  # amount 0 raises ZeroDivisionError

    refunds: list[str] = []
    refund = make_refund(refunds)
    refund.needs_approval = risky
    model = scripted_model(model_server)
    model_server.script(model.name, [call("refund", order_id="A1", amount=0), text("could not")])
    agent = Agent(name="raising_predicate", model=model, tools=[refund])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund", task_queue=worker.task_queue)
        result = await finished(handle)
    assert result.output == "could not" and refunds == []
    [outcome] = [m for m in result.transcript if m.role == "tool"]
    assert outcome.is_error and "ZeroDivisionError" in outcome.content
    assert await workflow_task_failures(handle) == 0


async def test_an_output_validator_raising_any_exception_sends_the_answer_back_for_a_retry(
    client: Client, model_server: ScriptedModelServer
) -> None:
    class Verdict(BaseModel):
        label: str

        @field_validator("label")
        @classmethod
        def known(cls, value: str) -> str:
            return {"ok": "ok", "bad": "bad"}[value]  # KeyError: pydantic does not wrap it

    model = scripted_model(model_server)
    model_server.script(model.name, [text('{"label": "maybe"}'), text('{"label": "ok"}')])
    agent = Agent(name="raising_validator", model=model, output_type=Verdict)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "judge", task_queue=worker.task_queue)
        result = await finished(handle)
    assert result.output == {"label": "ok"}
    assert "did not match" in model_server.requests(model.name)[1].last_user_text
    assert await workflow_task_failures(handle) == 0


# --- handoffs -----------------------------------------------------------------------------------


async def test_handoff_whose_arguments_are_not_a_json_object_does_not_switch_agents(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Cut-off JSON and a JSON array are error results the model reads; no callback, no switch.
    # (Extra keys and a non-string reason are accepted, as lovia does: test_lovia_semantics.)
    audited: list[str] = []
    billing = Agent(name="billing_b", model=scripted_model(model_server))
    triage_model = scripted_model(model_server)
    triage = Agent(
        name="triage_b",
        model=triage_model,
        handoffs=[
            Handoff(
                billing,
                name="transfer_to_billing",
                on_handoff=lambda args, data: audited.append(str(args.reason)),
            ),
        ],
    )
    model_server.script(
        triage_model.name,
        [
            call("transfer_to_billing", raw_arguments='{"reason": "double charge"'),
            call("transfer_to_billing", raw_arguments='["double charge"]'),
            text("I will handle it myself."),
        ],
    )
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        result = await finished(handle)
        events = await handle.events()
    assert (result.final_agent, result.output) == ("triage_b", "I will handle it myself.")
    assert audited == []
    assert "transfer_to_billing" not in await scheduled_activities(handle.workflow)
    assert [e.kind for e in events].count("handoff") == 0
    last = model_server.requests(triage_model.name)[-1]
    results = last.tool_results
    assert all(r.startswith("Error") or "did not happen" in r for r in results)
    assert "not valid JSON" in results[0]
    assert "JSON object" in results[1]
    for sent in sent_calls(last):
        assert isinstance(json.loads(sent["function"]["arguments"]), dict)


async def test_handoff_event_carries_the_run_path_of_the_agent_that_handed_over(
    client: Client, model_server: ScriptedModelServer
) -> None:
    billing_model, triage_model = scripted_model(model_server), scripted_model(model_server)
    billing = Agent(name="billing_p", model=billing_model)
    triage = Agent(name="triage_p", model=triage_model, handoffs=[billing])
    model_server.script(triage_model.name, [call("transfer_to_billing_p", reason="refund")])
    model_server.script(billing_model.name, [text("refunded")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund", task_queue=worker.task_queue)
        await finished(handle)
        events = await handle.events()
    [handoff] = [e for e in events if e.kind == "handoff"]
    assert (handoff.agent, handoff.run_path) == ("triage_p", ["triage_p"])
    final = next(e for e in events if e.kind == "final")
    assert (final.agent, final.run_path) == ("billing_p", ["triage_p", "billing_p"])


async def test_a_watcher_attributes_the_targets_streamed_text_to_the_target_after_a_handoff(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The handoff event has the source's path; the stream still knows that what follows is the
    # target's (its deltas carry [triage, billing], as its own events do).
    billing_model = scripted_model(model_server, stream=True)
    triage_model = scripted_model(model_server, stream=True)
    billing = Agent(name="billing_s", model=billing_model)
    triage = Agent(name="triage_s", model=triage_model, handoffs=[billing])
    model_server.script(triage_model.name, [call("transfer_to_billing_s")])
    model_server.script(billing_model.name, [text("Your refund of 49 EUR is on its way to you.")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "refund", task_queue=worker.task_queue)
        items = [item async for item in handle.stream()]
        await finished(handle)
    [handoff] = [i for i in items if i.kind == "handoff"]
    assert handoff.run_path == ["triage_s"]
    after = items[items.index(handoff) + 1 :]
    deltas = [i for i in after if i.is_delta]
    assert deltas and all(
        (i.agent, i.run_path) == ("billing_s", ["triage_s", "billing_s"]) for i in deltas
    )


# --- approval order (lovia) ---------------------------------------------------------------------


async def test_calls_after_an_approval_wait_for_its_decision_and_run_even_after_a_rejection(
    client: Client, model_server: ScriptedModelServer
) -> None:
    done: list[str] = []
    started = threading.Event()

    @tool
    def look_up(order_id: str) -> str:
        """Look an order up.

        Args:
            order_id: The order.
        """
        done.append(f"look_up {order_id}")
        started.set()
        return "paid"

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("look_up", order_id="A1"),
                call("refund", id="call_r", order_id="A1", amount=3),
                call("notify", order_id="A1"),
            ),
            text("done"),
        ],
    )
    agent = Agent(
        name="ordered", model=model, tools=[look_up, make_refund(done), make_notify(done)]
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund and tell", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        assert await asyncio.to_thread(started.wait, 10)  # the earlier call ran meanwhile

        async def look_up_done() -> bool:
            return "look_up" in await scheduled_activities(handle.workflow) and done == [
                "look_up A1"
            ]

        await eventually(look_up_done, "the look-up to finish")
        assert "notify" not in await scheduled_activities(handle.workflow)
        await handle.approve("call_r", approved=False, reason="not yet")
        result = await finished(handle)
    assert done == ["look_up A1", "notify A1"]
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "look_up",
        "notify",
        "relaykit.model_call",
    ]
    assert [m.content for m in result.transcript if m.role == "tool"] == [
        "paid",
        "The call was rejected by a person: not yet.",
        "notified about A1",
    ]


async def test_parallel_approval_order_runs_later_calls_at_once(
    client: Client, model_server: ScriptedModelServer
) -> None:
    done: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("refund", id="call_r", order_id="A1", amount=3), call("notify", order_id="A1")
            ),
            text("done"),
        ],
    )
    agent = Agent(
        name="parallel_order",
        model=model,
        tools=[make_refund(done), make_notify(done)],
        approval_order="parallel",
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund and tell", task_queue=worker.task_queue)
        await waiting_for_approval(handle)

        async def notified() -> bool:
            return done == ["notify A1"]

        await eventually(notified, "the later call to run while the approval waits")
        await handle.approve("call_r")
        await finished(handle)
    assert done == ["notify A1", "refund A1"]


# --- choices recorded once per run --------------------------------------------------------------


async def _replay_on(graph: AgentGraph, history: Any) -> Any:
    build_id = f"b{uuid.uuid4().hex[:8]}"
    task_queue = f"replay-{build_id}"
    registry.register(task_queue, graph)
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            data_converter=pydantic_data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build_id,
        )
        return await replayer.replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(task_queue, graph)


async def test_a_run_replays_on_a_worker_configured_the_other_way(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Recorded with search attributes and event groups on; replayed with both off, and the
    # reverse. Each worker decides only for the runs it starts.
    for recorded_on in (True, False):
        refunds: list[str] = []
        model = scripted_model(model_server)
        model_server.script(
            model.name,
            [
                call("refund", id="call_r", order_id="A1", amount=3),
                text("refunded"),
            ],
        )
        agent = Agent(
            name=f"setup_{recorded_on}".lower(), model=model, tools=[make_refund(refunds)]
        )
        async with serving(
            client, agent, search_attributes=recorded_on, event_groups=recorded_on
        ) as worker:
            handle = await start_run(client, agent, "refund", task_queue=worker.task_queue)
            await waiting_for_approval(handle)
            await handle.approve("call_r")
            await finished(handle)
        history = await handle.workflow.fetch_history()
        upserts = [
            e
            for e in history.events
            if e.event_type == EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES
            and "RelayStatus"
            in e.upsert_workflow_search_attributes_event_attributes.search_attributes.indexed_fields
        ]
        assert bool(upserts) == recorded_on
        other = AgentGraph.build([agent])
        other.search_attributes = other.event_groups = not recorded_on
        result = await _replay_on(other, history)
        assert result.replay_failure is None, (recorded_on, result.replay_failure)


def test_a_value_that_does_not_decode_is_described_on_one_bounded_line() -> None:
    # What a run's failure, an evaluation's skipped line and `relaykit fork` say about a
    # recorded value this release cannot read (relaykit.errors.error_detail).
    from pydantic import ValidationError

    from relaykit.errors import error_detail
    from relaykit.runs import RunInput

    try:
        RunInput.model_validate({"agent": "a", "budget": {"max_requests": -1, "max_usd": "x"}})
    except ValidationError as exc:
        detail = error_detail(exc)
    assert detail == (
        "budget.max_requests: Input should be greater than or equal to 0; "
        "budget.max_usd: Input should be a valid number, unable to parse string as a number"
    )
    assert error_detail(ValueError("line one\nline two")) == "ValueError: line one line two"
    cut = error_detail(ValueError("x" * 5_000), 100)
    assert len(cut) == 100 and cut.endswith("…")
