"""The budget tree: a child at its dollar reservation asks its parent, which grants from what it
has left, or pauses the whole tree at the root's limit until a person raises it."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from temporalio.client import Client, WorkflowUpdateFailedError

from relaykit import Agent, Budget, Price, RunFailed, Subagents, get_run, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, call, text
from tests.support import eventually, scripted_model, serving
from tests.test_budgets import SMALL, look, priced_model, spend, wait_for_status


def digging(calls: int, tokens: int) -> Any:
    """A subagent's model: ``calls`` look-ups of ``tokens`` input tokens each, then its report."""

    def respond(request: ScriptedRequest) -> Step:
        done = len(request.tool_results)
        if done < calls:
            return spend(tokens, call("look", topic=f"part {done + 1}"))
        return spend(100, text(f"dug {request.last_user_text}"))

    return respond


def lead_agent(lead_model: Any, digger: Agent, *, max_concurrent: int) -> Agent:
    return Agent(
        name="lead",
        model=lead_model,
        model_settings=SMALL,
        subagents=Subagents([digger], max_concurrent=max_concurrent, max_turns=30),
    )


async def test_a_subagent_at_its_reservation_is_granted_more_by_its_parent_and_finishes(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Six look-ups of $0.004 each outgrow the digger's reservation (half of what the lead has
    # left); it asks the lead, which grants from the rest, and it finishes its work.
    sub_model, lead_model = priced_model(model_server), priced_model(model_server)
    model_server.respond(sub_model.name, digging(6, 4000))
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="dig")),
            spend(100, call("wait_subagents", timeout_seconds=120)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = lead_agent(lead_model, digger, max_concurrent=1)
    async with serving(client, lead) as worker:
        handle = await start_run(
            client, lead, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.05)
        )
        result = await asyncio.wait_for(handle.result(), 90)
        child = get_run(client, f"{handle.id}/task-1")
        child_events = await child.events()
        lead_events = await handle.events()
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.05
    requests = model_server.requests(sub_model.name)
    assert len(requests) == 7  # all six look-ups and the report, none of them a last call
    assert all(r.tool_names == ["look"] for r in requests)
    kinds = [e.kind for e in child_events]
    assert "budget_asked" in kinds
    (granted,) = [e.data for e in child_events if e.kind == "budget_granted"]
    assert granted["verdict"] == "grant" and granted["amount"] > 0
    (given,) = [e.data for e in lead_events if e.kind == "budget_granted"]
    assert given == {"child": child.id, "amount": granted["amount"], "verdict": "grant"}
    assert "budget_reached" not in [e.kind for e in lead_events]


async def test_concurrent_subagents_asking_with_too_little_left_pause_the_tree_until_a_raise(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each digger alone would spend more than the whole $0.02 limit: both end up asking, the
    # lead has too little for them, and the tree waits (the lead in budget_reached, each
    # digger for its parent's budget) without ever passing the limit. A raise on the lead,
    # and only there, lets both finish.
    sub_model, lead_model = priced_model(model_server), priced_model(model_server)
    model_server.respond(sub_model.name, digging(12, 2000))
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="dig a")),
            spend(100, call("spawn_subagent", prompt="dig b")),
            spend(100, call("wait_subagents", timeout_seconds=300)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = lead_agent(lead_model, digger, max_concurrent=2)
    async with serving(client, lead) as worker:
        handle = await start_run(
            client, lead, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.02)
        )
        children = [get_run(client, f"{handle.id}/task-{n}") for n in (1, 2)]

        async def tree_paused() -> tuple[Any, list[Any]]:
            while True:
                root = await handle.state()
                if root.status == "budget_reached":
                    states = [await c.state() for c in children]
                    if all(s.status == "waiting_parent_budget" for s in states):
                        return root, states
                await asyncio.sleep(0.2)

        root, states = await asyncio.wait_for(tree_paused(), 90)
        requests_while_paused = len(model_server.requests(sub_model.name))
        assert root.budget is not None and root.budget.phase == "reached"
        spent = root.budget.spent + sum(s.usage.cost_usd for s in states)
        assert spent <= 0.02  # what the tree spent so far, the children's own included
        for state in states:
            assert state.budget is not None and state.budget.phase == "waiting_for_parent"
            assert state.budget.parent == handle.id
        view = await handle.set_budget(raise_by=0.1, by="ana")
        assert view.limit == pytest.approx(0.12)
        result = await asyncio.wait_for(handle.result(), 90)
        outputs = [(await c.result()).output for c in children]
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.12
    assert sorted(outputs) == ["dug dig a", "dug dig b"]
    assert len(model_server.requests(sub_model.name)) == 26 > requests_while_paused


async def test_a_parent_whose_budget_fails_makes_its_asking_child_fail_typed(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The lead gives its one digger most of what it has (child_share=0.8): when the digger has
    # had the rest too and asks for more, nothing is left, and the lead's on_limit="fail"
    # fails the digger with BudgetExceeded; the lead reads the failed report.
    sub_model, lead_model = priced_model(model_server), priced_model(model_server)
    model_server.respond(sub_model.name, digging(12, 2000))
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="dig")),
            spend(100, call("wait_subagents", timeout_seconds=120)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = lead_agent(lead_model, digger, max_concurrent=1)
    budget = Budget(max_usd=0.02, on_limit="fail", child_share=0.8)
    async with serving(client, lead) as worker:
        handle = await start_run(client, lead, "go", task_queue=worker.task_queue, budget=budget)
        result = await asyncio.wait_for(handle.result(), 90)
        child = get_run(client, f"{handle.id}/task-1")
        with pytest.raises(RunFailed) as failure:
            await child.result()
        child_events = await child.events()
    assert failure.value.type == "BudgetExceeded"
    assert "budget_asked" in [e.kind for e in child_events]
    answers = [e.data["verdict"] for e in child_events if e.kind == "budget_granted"]
    assert answers[-1] == "fail"  # (after grants from what was left, if any)
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.02
    assert "FAILED" in str(model_server.requests(lead_model.name)[-1].messages)


async def test_a_child_whose_parent_has_ended_makes_its_last_call_instead_of_waiting(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A detached digger outlives the lead that gave it its reservation: at its limit its ask
    # finds no parent, and it answers with what it has instead of waiting for ever.
    sub_model, lead_model = priced_model(model_server), priced_model(model_server)
    model_server.respond(
        sub_model.name,
        lambda r: text("best so far") if not r.tool_names else digging(12, 2000)(r),
    )
    model_server.script(
        lead_model.name,
        [spend(100, call("spawn_subagent", prompt="dig")), spend(100, text("handed over"))],
    )
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = Agent(
        name="lead",
        model=lead_model,
        model_settings=SMALL,
        subagents=Subagents(
            [digger], max_concurrent=1, max_turns=30, detached=True, deliver_to_workflow="nobody"
        ),
    )
    async with serving(client, lead) as worker:
        handle = await start_run(
            client, lead, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.02)
        )
        assert (await asyncio.wait_for(handle.result(), 60)).output == "handed over"
        child = get_run(client, f"{handle.id}/task-1")
        result = await asyncio.wait_for(child.result(), 90)
        events = await child.events()
    assert result.output == "best so far"
    answer = [e.data for e in events if e.kind == "budget_granted"][-1]
    assert answer["verdict"] == "finish"  # its ask found no parent, or the parent's end said so
    assert "cannot be asked" in answer["reason"] or "has ended" in answer["reason"]
    assert model_server.requests(sub_model.name)[-1].tool_names == []


async def test_a_tree_paused_at_the_roots_limit_survives_a_worker_kill_and_goes_on_when_raised(
    client: Client, temporal_server: Any, model_server: ScriptedModelServer, tmp_path: Any
) -> None:
    from tests.test_crash_recovery import crash_rig, forget_sticky_worker, kill

    def respond(request: ScriptedRequest) -> Step:
        if "spawn_subagent" in request.tool_names:  # the lead
            if not request.tool_results:
                return spend(100, call("spawn_subagent", prompt="count"))
            called = {
                c.get("function", {}).get("name")
                for m in request.messages
                for c in m.get("tool_calls") or []
            }
            if "wait_subagents" not in called:
                return spend(100, call("wait_subagents", timeout_seconds=300))
            return spend(100, text("lead done"))
        done = len(request.tool_results)  # the subagent
        if done < 10:
            return spend(2000, call("quick", n=done + 1))
        return spend(100, text("counted"))

    async with crash_rig(temporal_server.address, model_server, tmp_path) as rig:
        model_server.respond(rig.model, respond)
        first = rig.start_worker()
        handle = await start_run(
            client,
            "crash_priced_lead",
            "go",
            task_queue=rig.task_queue,
            budget=Budget(max_usd=0.01),
        )
        child = get_run(client, f"{handle.id}/task-1")

        async def paused() -> bool:
            root = await handle.state()
            if root.status != "budget_reached":
                return False
            return (await child.state()).status == "waiting_parent_budget"

        await eventually(paused, "the tree to wait at the root's limit", timeout=90)
        kill(first)
        await forget_sticky_worker(client, handle)
        await forget_sticky_worker(client, child)
        rig.start_worker()
        assert (await child.state()).status == "waiting_parent_budget"  # rebuilt from history
        await handle.set_budget(raise_by=0.05, by="ops")
        result = await asyncio.wait_for(handle.result(), 90)
    assert result.output == "lead done"
    assert (await child.result()).output == "counted"
    assert rig.tool_calls() == {f"quick {n}": 1 for n in range(1, 11)}  # none ran twice
    assert result.usage.cost_usd <= 0.06


async def test_grants_nest_a_grandchild_asks_its_parent_which_asks_its_own(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # lead → subagent "middle" → agent tool "digger": the digger outgrows the reservation the
    # middle gave it, the middle has too little left and asks the lead, and the lead's grant
    # reaches the digger through the middle.
    dig_model, mid_model, lead_model = (priced_model(model_server) for _ in range(3))
    model_server.respond(dig_model.name, digging(16, 2000))
    model_server.respond(
        mid_model.name,
        lambda r: (
            spend(100, text("middle done"))
            if r.tool_results
            else spend(100, call("ask_digger", input="dig deep"))
        ),
    )
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="delegate")),
            spend(100, call("wait_subagents", timeout_seconds=120)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=dig_model, tools=[look], model_settings=SMALL)
    middle = Agent(name="middle", model=mid_model, tools=[digger.as_tool()], model_settings=SMALL)
    lead = lead_agent(lead_model, middle, max_concurrent=1)
    async with serving(client, lead) as worker:
        handle = await start_run(
            client, lead, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.05)
        )
        result = await asyncio.wait_for(handle.result(), 90)
        mid = get_run(client, f"{handle.id}/task-1")
        mid_events = await mid.events()
        dig_events = await get_run(client, f"{mid.id}/digger-1").events()
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.05
    assert len(model_server.requests(dig_model.name)) == 17  # every look-up, the report
    asked = [e.data for e in mid_events if e.kind == "budget_asked"]
    assert asked and asked[0]["parent"] == handle.id  # the middle asked the lead
    from_lead = [e.data for e in mid_events if e.kind == "budget_granted" and "from" in e.data]
    to_digger = [e.data for e in mid_events if e.kind == "budget_granted" and "child" in e.data]
    assert from_lead and all(d["verdict"] == "grant" for d in from_lead)
    assert to_digger and all(d["verdict"] == "grant" for d in to_digger)
    got = [e.data for e in dig_events if e.kind == "budget_granted"]
    assert got and all(d["verdict"] == "grant" for d in got)


async def test_a_root_that_continues_as_new_while_paused_carries_its_childrens_asks(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The lead polls its tasks one second at a time and continues as new after every turn:
    # asks it took before a continue-as-new are answered by the run after it, on the raise.
    sub_model = priced_model(model_server)
    # the lead's own calls are free: it never waits for itself, only for its child's ask
    lead_model = scripted_model(model_server, price=Price(input=0, output=0))
    model_server.respond(sub_model.name, digging(12, 2000))

    def lead_step(request: ScriptedRequest) -> Step:
        called = {
            c.get("function", {}).get("name")
            for m in request.messages
            for c in m.get("tool_calls") or []
        }
        if "spawn_subagent" not in called:
            return spend(100, call("spawn_subagent", prompt="dig"))
        if "digger] finished" in str(request.messages):
            return spend(100, text("done"))
        return spend(100, call("wait_subagents", timeout_seconds=1))

    model_server.respond(lead_model.name, lead_step)
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = lead_agent(lead_model, digger, max_concurrent=1)
    async with serving(client, lead) as worker:
        handle = await start_run(
            client,
            lead,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.02),
            continue_as_new_after_turns=1,
        )
        child = get_run(client, f"{handle.id}/task-1")
        await wait_for_status(handle, "budget_reached", timeout=90)
        await wait_for_status(child, "waiting_parent_budget", timeout=30)
        await continued_as_new_at_its_limit(handle)
        await handle.set_budget(raise_by=0.1, by="ana")
        result = await asyncio.wait_for(handle.result(), 90)
        kinds = [e.kind for e in await handle.events()]
    # the lead waited at its limit, continued as new with the digger's ask, and granted it then
    reached = kinds.index("budget_reached")
    assert "continued_as_new" in kinds[reached:]
    assert kinds.index("budget_granted", reached) > kinds.index("continued_as_new", reached)
    assert result.output == "done"
    assert (await child.result()).output == "dug dig"
    assert result.usage.cost_usd <= 0.12


async def continued_as_new_at_its_limit(handle: Any) -> None:
    """Until the run has continued as new after it reached its limit.

    Read from its events, not by counting continue-as-news from the moment the test saw the
    status: the run reaches its limit while a turn is in flight and continues as new when that
    turn ends, which on a loaded machine can come before the test reads the status."""

    async def continued() -> bool:
        kinds = [e.kind for e in await handle.events()]
        return (
            "budget_reached" in kinds
            and "continued_as_new" in kinds[kinds.index("budget_reached") :]
        )

    await eventually(continued, "a continue-as-new after the limit was reached", timeout=60)


async def test_a_child_refuses_a_raise_of_its_reservation_so_the_tree_keeps_the_roots_limit(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A person raising a child's limit (its reservation of the parent's money) would let the
    # child spend past the root's limit: the child never asks, and its real cost lands on the
    # parent when it ends. The raise is refused with where to raise instead; asking the child
    # for its best answer, or lowering its limit, is still taken.
    @tool(needs_approval=True)
    def gated(topic: str) -> str:
        """Look a topic up once a person approves."""
        return f"notes on {topic}"

    sub_model, lead_model = priced_model(model_server), priced_model(model_server)

    def digger_model(request: ScriptedRequest) -> Step:
        if not request.tool_results:
            return spend(100, call("gated", topic="start"))
        return digging(6, 4000)(request)

    model_server.respond(sub_model.name, digger_model)
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="dig")),
            spend(100, call("wait_subagents", timeout_seconds=120)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=sub_model, tools=[gated, look], model_settings=SMALL)
    lead = Agent(
        name="lead",
        model=lead_model,
        model_settings=SMALL,
        subagents=Subagents([digger], max_concurrent=1, max_turns=30, approvals="parent"),
    )
    async with serving(client, lead) as worker:
        handle = await start_run(
            client,
            lead,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.01, on_limit="finish"),
        )
        child = get_run(client, f"{handle.id}/task-1")

        async def pending() -> Any:
            while not (waiting := await handle.pending_approvals()):
                await asyncio.sleep(0.2)
            return waiting

        (waiting,) = await asyncio.wait_for(pending(), 60)
        before = await child.state()
        assert before.budget is not None
        for change in ({"raise_by": 1.0}, {"max_usd": before.budget.limit + 1.0}):
            with pytest.raises(WorkflowUpdateFailedError) as refused:
                await child.set_budget(**change, by="ana")
            assert f"raise the limit of {handle.id}" in str(refused.value.cause)
        lowered = await child.set_budget(before.budget.limit * 0.9, by="ana")
        assert lowered.limit == pytest.approx(before.budget.limit * 0.9)
        await handle.approve(waiting.call_id, by="ana")
        result = await asyncio.wait_for(handle.result(), 90)
        child_events = await child.events()
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.01
    changes = [e.data for e in child_events if e.kind == "budget_changed"]
    assert [c["by"] for c in changes] == ["ana"]  # the lowering only
