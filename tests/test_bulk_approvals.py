"""Answering approvals at signal speed: each answer checked against the run's waiting calls
first, signalled, recorded with its author; late answers recorded as refused, never dropped."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from relaykit import Agent, ApprovalDecision, ApprovalNotWaiting, answer_waiting, start_run
from relaykit.bulk_approvals import waiting_runs_query
from relaykit.devserver import DevServer
from relaykit.search_attributes import MORE_CALLS, RELAY_WAITING_CALLS
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import scripted_model, serving
from tests.test_approvals import (
    eventually,
    make_refund_tool,
    relaykit_cli,
    run_command,
    waiting_for_approval,
)


async def test_approve_without_waiting_checks_the_call_first_and_records_who_answered(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # wait=False: an unknown call id raises at once and sends nothing; a waiting one is signalled.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name, [call("refund", id="call_fast", order_id="B1", amount=3), text("done")]
    )
    agent = Agent(name="fast_approved", model=model, tools=[make_refund_tool(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund B1", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        with pytest.raises(ApprovalNotWaiting, match="waiting: call_fast"):
            await handle.approve("call_other", wait=False, by="ann")
        answered = await handle.approve("call_fast", wait=False, by="ann")
        assert answered.call_id == "call_fast" and answered.workflow_id == handle.id
        result = await handle.result()
        events = await handle.events()
    assert result.output == "done" and refunds == ["B1:3"]
    (decision,) = [e.data for e in events if e.kind == "approval_answered"]
    assert decision["call_id"] == "call_fast" and decision["by"] == "ann"
    assert not [e for e in events if e.kind == "approval_refused"]


async def test_a_signalled_answer_that_comes_too_late_is_recorded_as_refused(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The race: another answer landed between the check and the signal. The first one stands.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name, [call("refund", id="call_race", order_id="R2", amount=5), text("done")]
    )
    agent = Agent(name="raced", model=model, tools=[make_refund_tool(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund R2", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        await handle.approve("call_race", approved=False, reason="no", by="bob")
        late = ApprovalDecision(call_id="call_race", approved=True, by="ann")
        await handle.workflow.signal("approve_signal", late)
        await handle.result()
        events = await handle.events()
    assert refunds == []  # bob's rejection stood
    (refused,) = [e.data for e in events if e.kind == "approval_refused"]
    assert refused["by"] == "ann" and "already answered" in refused["why"]


async def test_approve_all_answers_every_waiting_run_a_query_finds_with_one_line_each(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # `relaykit approve --all --query`: each waiting call of each run found, answered, printed.
    refunds: list[str] = []
    agents = []
    refund = make_refund_tool(refunds)
    for n in range(2):
        model = scripted_model(model_server)
        model_server.script(
            model.name, [call("refund", id=f"call_{n}", order_id=f"A{n}", amount=n), text("ok")]
        )
        agents.append(Agent(name=f"bulk_{n}", model=model, tools=[refund]))
    async with serving(client, agents) as worker:
        handles = [
            await start_run(client, agent, "refund", task_queue=worker.task_queue)
            for agent in agents
        ]
        for handle in handles:
            await waiting_for_approval(handle)
        query = f"TaskQueue = '{worker.task_queue}'"

        async def listed() -> bool:  # visibility follows the runs' upserts
            return (await client.count_workflows(waiting_runs_query(query))).count == 2

        await eventually(listed, "both runs listed as waiting")
        code, out, err = await run_command(
            *relaykit_cli("approve", "--all", "--query", query, "--as", "carol"),
            address=temporal_server.address,
        )
        assert code == 0, err
        assert sorted(out.splitlines()) == sorted(
            f"approved\t{handle.id}\tcall_{n}" for n, handle in enumerate(handles)
        )
        for handle in handles:
            assert (await handle.result()).output == "ok"
        events = [await handle.events() for handle in handles]
        again = await answer_waiting(client, query)
    assert sorted(refunds) == ["A0:0", "A1:1"]
    for run_events in events:
        (decision,) = [e.data for e in run_events if e.kind == "approval_answered"]
        assert decision["by"] == "carol"
    assert again == []  # nothing waits any more


async def test_forty_calls_waiting_at_once_keep_the_run_and_are_all_answered_in_bulk(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Forty 60-character call ids are more than one attribute value holds (2 kB): the server
    # terminated such a run. The list is cut, marked, and the bulk path asks the run instead.
    refunds: list[str] = []
    model = scripted_model(model_server)
    ids = [f"call_{'x' * 50}{n:04d}" for n in range(40)]
    turn = batch(*(call("refund", id=i, order_id=f"M{n}", amount=n) for n, i in enumerate(ids)))
    model_server.script(model.name, [turn, text("done")])
    agent = Agent(
        name="many_waiting",
        model=model,
        tools=[make_refund_tool(refunds)],
        approval_order="parallel",
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund all", task_queue=worker.task_queue)
        await waiting_for_approval(handle, count=40)

        async def cut() -> bool:
            described = await handle.workflow.describe()
            listed = described.typed_search_attributes.get(RELAY_WAITING_CALLS) or []
            return bool(listed) and listed[-1] == MORE_CALLS

        await eventually(cut, "the cut list of waiting calls")
        assert len(await handle.waiting_calls()) == 40  # the run's own answer, not the cut list
        query = f"TaskQueue = '{worker.task_queue}'"

        async def listed() -> bool:  # visibility follows the run's upserts
            return (await client.count_workflows(waiting_runs_query(query))).count == 1

        await eventually(listed, "the run listed as waiting")
        answers = await answer_waiting(client, query, by="dora")
        result = await handle.result()
    assert sorted(a.call_id for a in answers) == sorted(ids)
    assert result.output == "done" and len(refunds) == 40
