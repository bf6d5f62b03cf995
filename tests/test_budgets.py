"""Dollar budgets: each call's worst case fits what remains, children get reservations, and at
the limit the run pauses for a person, finishes, or fails."""

from __future__ import annotations

import asyncio
import dataclasses
import json
from pathlib import Path
from typing import Any

import pydantic
import pytest
from temporalio.client import Client

from relaykit import (
    Agent,
    Budget,
    ModelSettings,
    ModelSpec,
    Price,
    RunFailed,
    Subagents,
    get_run,
    start_run,
    tool,
)
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import scripted_model, serving

# $1 per million input and output tokens: a call of (input, output) tokens costs their sum
# in millionths of a dollar.
DOLLAR = Price(input=1.0, output=1.0)
SMALL = ModelSettings(max_tokens=1000)
"""Each call plans for 1000 output tokens ($0.001)."""


@tool
def look(topic: str) -> str:
    """Look a topic up."""
    return f"notes on {topic}"


def priced_model(server: ScriptedModelServer, **options: Any) -> Any:
    return scripted_model(server, price=DOLLAR, **options)


def spend(tokens: int, step: Any) -> Any:
    """``step`` reporting ``tokens`` input tokens (so it costs ``tokens`` millionths of $)."""
    return dataclasses.replace(step, usage=(tokens, 0))


async def wait_for_status(handle: Any, status: str, timeout: float = 30.0) -> Any:
    async def poll() -> Any:
        while True:
            snapshot = await handle.state()
            if snapshot.status == status:
                return snapshot
            await asyncio.sleep(0.2)

    return await asyncio.wait_for(poll(), timeout)


async def test_a_run_within_its_dollar_limit_ends_as_usual_and_reports_its_budget(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = priced_model(model_server)
    model_server.script(model.name, [spend(2000, call("look", topic="a")), text("done")])
    agent = Agent(name="frugal", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.05)
        )
        result = await handle.result()
        snapshot = await handle.state()
    assert result.output == "done"
    assert snapshot.budget is not None and snapshot.budget.limit == 0.05
    # every request carried the output limit the money left pays for: its own 1000 here
    assert all(r.body.get("max_tokens") == 1000 for r in model_server.requests(model.name))


async def test_at_the_limit_a_failing_budget_ends_the_run_with_budget_exceeded(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = priced_model(model_server)
    model_server.script(
        model.name,
        [spend(4000, call("look", topic="a")), spend(4000, call("look", topic="b")), text("x")],
    )
    agent = Agent(name="spender", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.006, on_limit="fail"),
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "BudgetExceeded"
    assert "spent $0.0040 of the $0.0060 limit" in str(failure.value)
    assert len(model_server.requests(model.name)) == 1  # the second call was never made


async def test_at_the_limit_a_paused_run_waits_and_goes_on_when_a_person_raises_it(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = priced_model(model_server)
    model_server.script(
        model.name,
        [spend(4000, call("look", topic="a")), spend(4000, call("look", topic="b")), text("x")],
    )
    agent = Agent(name="pauser", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.006)
        )
        snapshot = await wait_for_status(handle, "budget_reached")
        assert snapshot.budget is not None
        assert (snapshot.budget.spent, snapshot.budget.limit) == (0.004, 0.006)
        assert len(model_server.requests(model.name)) == 1
        view = await handle.set_budget(raise_by=0.01, by="ana")
        assert view.limit == pytest.approx(0.016)
        result = await handle.result()
        events = await handle.events()
    assert result.output == "x"
    changed = next(e for e in events if e.kind == "budget_changed")
    assert changed.data["by"] == "ana" and changed.data["limit"] == pytest.approx(0.016)
    assert [e.kind for e in events].count("budget_reached") == 1


async def test_finish_makes_one_last_call_without_tools_paid_from_the_reserve(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = priced_model(model_server)
    model_server.script(
        model.name,
        [spend(2000, call("look", topic="a")), text("best answer so far")],
    )
    agent = Agent(name="finisher", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.006, on_limit="finish", finish_reserve=0.3),
        )
        result = await handle.result()
    # $0.004 remain, $0.0018 of them kept for the last answer: the second call (2000 known
    # input tokens and 256 output tokens at least) does not fit the rest, so it is the last.
    assert result.output == "best answer so far"
    last = model_server.requests(model.name)[-1]
    assert last.tool_names == []
    assert "budget for this run is spent" in str(last.body)
    assert result.usage.cost_usd <= 0.006


async def test_the_last_call_counts_the_answer_it_sends_back_and_its_reminder(
    client: Client, model_server: ScriptedModelServer
) -> None:
    """The fuzzer's seed 2639: a stand-in counted an answer's output as 5 tokens, which cost far
    more sent back as input, and the last call's reminder was left out of its estimate, so the
    last call of a run at its limit spent past it. Here the first answer is a 1 kB tool call
    counted as no output at all, and a provider would count the last call at 2,900 input
    tokens: more than the $0.0029 left."""
    model = priced_model(model_server)
    model_server.script(
        model.name,
        [
            spend(2000, call("look", topic="t" * 1000)),
            dataclasses.replace(text("best answer so far"), usage=(2900, 32)),
        ],
    )
    agent = Agent(name="last_caller", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.0049, on_limit="finish", finish_reserve=0.5),
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
        spent = (await handle.state()).usage.cost_usd
    assert failure.value.type == "BudgetExceeded"
    assert len(model_server.requests(model.name)) == 1  # the last call did not fit: not made
    assert spent <= 0.0049


async def test_a_model_without_a_price_refuses_a_dollar_limited_run_unless_counted_free(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text("free answer")])
    agent = Agent(name="unpriced-limited", model=model)
    async with serving(client, agent) as worker:
        refused = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=1)
        )
        with pytest.raises(RunFailed) as failure:
            await refused.result()
        free = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=1, unpriced="free"),
        )
        assert (await free.result()).output == "free answer"
    assert failure.value.type == "UnpricedModel"
    assert model.label in str(failure.value)
    assert len(model_server.requests(model.name)) == 1  # the refused run made no call


async def test_concurrent_subagents_that_together_would_overspend_do_not(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each subagent would spend $0.004 per call for as long as it is allowed; two run at once
    # under a $0.02 limit. Their reservations (a third each of what remains) stop them.
    sub_model = priced_model(model_server)
    lead_model = priced_model(model_server)
    model_server.respond(sub_model.name, lambda request: spend(4000, call("look", topic="x")))
    model_server.script(
        lead_model.name,
        [
            spend(100, call("spawn_subagent", prompt="dig a")),
            spend(100, call("spawn_subagent", prompt="dig b")),
            spend(100, call("wait_subagents", timeout_seconds=30)),
            spend(100, text("done")),
        ],
    )
    digger = Agent(name="digger", model=sub_model, tools=[look], model_settings=SMALL)
    lead = Agent(
        name="lead",
        model=lead_model,
        model_settings=SMALL,
        subagents=Subagents([digger], max_concurrent=2),
    )
    async with serving(client, lead) as worker:
        handle = await start_run(
            client,
            lead,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.02, on_limit="fail"),
        )
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "done"
    assert result.usage.cost_usd <= 0.02
    assert result.usage.by_agent["digger"] > 0


async def test_a_run_paused_at_its_limit_survives_a_worker_kill_and_goes_on_when_raised(
    client: Client, temporal_server: Any, model_server: ScriptedModelServer, tmp_path: Any
) -> None:
    from tests.support import eventually
    from tests.test_crash_recovery import crash_rig, forget_sticky_worker, kill

    async with crash_rig(temporal_server.address, model_server, tmp_path) as rig:
        model_server.script(
            rig.model,
            [
                spend(4000, call("quick", n=1)),
                spend(4000, call("quick", n=2)),
                text("done after the raise"),
            ],
        )
        first = rig.start_worker()
        handle = await start_run(
            client,
            "crash_priced",
            "go",
            task_queue=rig.task_queue,
            budget=Budget(max_usd=0.006),
        )

        async def reached() -> bool:
            return (await handle.state()).status == "budget_reached"

        await eventually(reached, "the run to wait at its limit")
        kill(first)
        await forget_sticky_worker(client, handle)
        rig.start_worker()
        snapshot = await handle.state()  # answered by the new worker, rebuilt from history
        assert snapshot.status == "budget_reached"
        await handle.set_budget(0.05, by="ops")
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "done after the raise"
    assert model_server.request_count(rig.model) == 3
    assert rig.tool_calls() == {"quick 1": 1, "quick 2": 1}


async def test_a_person_sees_a_paused_run_in_runs_and_pending_and_raises_it_with_the_cli(
    client: Client, temporal_server: Any, model_server: ScriptedModelServer
) -> None:
    from tests.test_watch import relaykit

    model = priced_model(model_server)
    model_server.script(
        model.name,
        [spend(4000, call("look", topic="a")), spend(4000, call("look", topic="b")), text("x")],
    )
    agent = Agent(name="cli-budget", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        code, out, err = await relaykit(
            temporal_server,
            "run",
            "cli-budget",
            "go",
            "--max-usd",
            "0.006",
            "--task-queue",
            worker.task_queue,
            "--json",
        )
        assert code == 0, err
        handle = get_run(client, json.loads(out)["run_id"])
        await wait_for_status(handle, "budget_reached")
        code, out, err = await relaykit(
            temporal_server, "runs", "--status", "budget_reached", "--json"
        )
        assert code == 0, err
        (row,) = [r for r in json.loads(out) if r["run_id"] == handle.id]
        assert row["status"] == "budget_reached" and row["cost_usd"] == pytest.approx(0.004)
        from relaykit.inbox.pending import list_pending

        inbox = await list_pending(client)
        (wait,) = [w for w in inbox.budgets if w.run_id == handle.id]
        assert (wait.spent, wait.limit) == (0.004, 0.006)
        code, out, err = await relaykit(temporal_server, "pending", handle.id)
        assert code == 0, err
        assert "budget reached: spent $0.0040 of $0.0060" in out
        code, out, err = await relaykit(
            temporal_server, "budget", handle.id, "--raise", "0.01", "--as", "ana"
        )
        assert code == 0, err
        assert "of $0.0160" in out
        assert (await handle.result()).output == "x"
        code, out, err = await relaykit(temporal_server, "result", handle.id)
        assert code == 0, err
        assert "$0.0080" in err  # the run's cost, after the answer
        query = f"RelayCostUSD > 0.0079 AND WorkflowId = '{handle.id}'"
        code, out, err = await relaykit(temporal_server, "runs", "--query", query, "--json")
        assert code == 0, err
        assert [r["run_id"] for r in json.loads(out)] == [handle.id]
        changes = [e.data for e in await handle.events() if e.kind == "budget_changed"]
    assert changes == [
        {"by": "ana", "limit": pytest.approx(0.016), "previous": 0.006, "finish": False}
    ]


async def test_continue_as_new_carries_the_spend_and_the_limit(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = priced_model(model_server)
    model_server.script(
        model.name,
        [
            spend(2000, call("look", topic="a")),
            spend(2000, call("look", topic="b")),
            spend(2000, call("look", topic="c")),
            text("x"),
        ],
    )
    agent = Agent(name="long-budget", model=model, tools=[look], model_settings=SMALL)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            budget=Budget(max_usd=0.006, on_limit="fail"),
            continue_as_new_after_turns=1,
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    # each turn ran in a workflow run of its own; the limit still counted all of them
    assert failure.value.type == "BudgetExceeded"
    assert len(model_server.requests(model.name)) == 2


async def test_the_budgeted_research_example_pauses_is_raised_and_finishes(
    temporal_server: Any, capsys: Any
) -> None:
    from examples.budgeted_research import play

    answer = await asyncio.wait_for(play(temporal_server.address), 90)
    assert answer.startswith("Comparison:")
    shown = capsys.readouterr().out
    assert "budget_reached, spent $0.0" in shown and "of $0.0500" in shown
    assert "raised to $0.1500" in shown


async def test_a_budgeted_run_replays_with_the_prices_it_recorded_whatever_todays_are(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Replayed under a price a hundred times higher, the run would decide to wait at its limit
    # before its second call; it replays as it ran because the prices it planned with are in
    # its history.
    model, agent, history = await finished_run(
        client, model_server, "replayed-budget", spend(2000, call("look", topic="a")), 0.05
    )
    dearer = model.model_copy(update={"price": Price(input=100.0, output=100.0)})
    today = Agent(name=agent.name, model=dearer, tools=[look])
    replayed = await replays_under(history, today, "budget-check")
    assert replayed.replay_failure is None, replayed.replay_failure


@pytest.mark.parametrize(
    "limits",
    [
        {"max_requests": -1},
        {"max_total_tokens": -5},
        {"max_usd": -0.5},
        {"max_usd": float("nan")},
        {"max_usd": float("inf")},  # travelled as JSON null: no limit at all
    ],
)
def test_a_negative_or_not_finite_limit_is_refused_when_the_budget_is_built(
    limits: dict[str, Any],
) -> None:
    # Before, Budget(max_requests=-1) was taken, and the run failed after its first model call
    # ("request budget exceeded: 1 > -1"), paying for a call it could never use.
    with pytest.raises(pydantic.ValidationError, match=r"greater than or equal to 0|finite number"):
        Budget(**limits)


def scripted_agent(model_server: ScriptedModelServer, name: str, *steps: Any) -> tuple[Any, Agent]:
    """An agent with ``look`` on a priced model scripted to answer ``steps``, then "done"."""
    model = priced_model(model_server)
    model_server.script(model.name, [*steps, text("done")])
    return model, Agent(name=name, model=model, tools=[look], model_settings=SMALL)


async def raised_run(client: Client, agent: Agent) -> Any:
    """The history of a run of ``agent`` ($0.012) that stopped at its limit, was given $0.05
    more by a person, and answered "done"."""
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.012)
        )
        await wait_for_status(handle, "budget_reached")
        await handle.set_budget(raise_by=0.05, by="ana")
        assert (await handle.result()).output == "done"
        return await handle.workflow.fetch_history()


async def finished_run(
    client: Client, model_server: ScriptedModelServer, name: str, first: Any, max_usd: float
) -> tuple[Any, Agent, Any]:
    """A budgeted run of :func:`scripted_agent`, run to its end: its model, its agent and its
    history."""
    model, agent = scripted_agent(model_server, name, first)
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_usd=max_usd)
        )
        assert (await handle.result()).output == "done"
        return model, agent, await handle.workflow.fetch_history()


def replays_under(history: Any, agent: Agent, queue: str) -> Any:
    """Replay ``history`` on a worker whose only agent is ``agent`` (today's definition)."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from relaykit import registry
    from relaykit.graph import AgentGraph
    from relaykit.sandbox import sandbox_runner
    from relaykit.workflows.agent_run import AgentRun

    async def replay() -> Any:
        graph = AgentGraph.build([agent])
        registry.register(f"replay-{queue}", graph)
        try:
            replayer = Replayer(
                workflows=[AgentRun],
                data_converter=pydantic_data_converter,
                workflow_runner=sandbox_runner(),
                build_id=queue,
            )
            return await replayer.replay_workflow(history, raise_on_replay_failure=False)
        finally:
            registry.unregister(f"replay-{queue}", graph)

    return replay()


LONG_INSTRUCTIONS = "Check every entry twice before you answer. " * 700
"""About 30 kB: 15,000 tokens by the budget's estimate, $0.015 at a dollar per million."""


@pytest.mark.parametrize("recorded_long", [False, True], ids=["went-ahead", "stopped"])
async def test_a_deploy_that_changes_the_instructions_replays_each_budget_decision_as_made(
    client: Client, model_server: ScriptedModelServer, recorded_long: bool
) -> None:
    # A call's estimate counts the instructions it sends, which come from today's definition.
    # A run that went ahead under short instructions would be stopped at its limit by the same
    # estimate under long ones, and one that stopped under long ones would go ahead under short:
    # either way its replay after such a deploy no longer matched its history (found by
    # bench.chaos, seed 1086: a nondeterminism error at every attempt after the deploy).
    model = priced_model(model_server)
    model_server.script(model.name, [spend(100, call("look", topic="a")), text("done")])
    short, long = "Use the tools, then answer.", LONG_INSTRUCTIONS
    recorded = Agent(
        name="deployed-budget",
        instructions=long if recorded_long else short,
        model=model,
        tools=[look],
        model_settings=SMALL,
    )
    async with serving(client, recorded) as worker:
        handle = await start_run(
            client, recorded, "go", task_queue=worker.task_queue, budget=Budget(max_usd=0.012)
        )
        if recorded_long:  # $0.015 of instructions do not fit: it waits for a person
            await wait_for_status(handle, "budget_reached")
            await handle.set_budget(raise_by=0.05, by="ana")
        assert (await handle.result()).output == "done"
        history = await handle.workflow.fetch_history()
        events = [e.kind for e in await handle.events()]
    assert events.count("budget_reached") == (1 if recorded_long else 0)
    today = dataclasses.replace(recorded, instructions=short if recorded_long else long)
    replayed = await replays_under(history, today, "deployed-budget")
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_later_call_the_budget_stops_is_recorded_by_a_marker_and_replays_from_it(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The first call's decision is recorded with the run's prices (a local activity); a later
    # stop writes the marker relaykit.budget-stop.<decision>, and nothing is written for a call
    # that goes ahead.
    from temporalio.api.enums.v1 import EventType

    _, agent = scripted_agent(model_server, "later-stop", spend(9000, call("look", topic="a")))
    history = await raised_run(client, agent)
    markers = [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for e in history.events
        if e.event_type == EventType.EVENT_TYPE_MARKER_RECORDED
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    stops = [m for m in markers if b"relaykit.budget-stop" in m]
    assert len(stops) == 1 and b'"relaykit.budget-stop.1"' in stops[0]
    replayed = await replays_under(history, agent, "later-stop")
    assert replayed.replay_failure is None, replayed.replay_failure


def test_the_stops_choice_is_recorded_inside_the_grants_entry() -> None:
    # Releases before it skip the grants entry whatever its value; an entry of its own would
    # read to them as a model without a price, and fail the run on their replay of it.
    from relaykit.workflows import budget_plan as plan

    model = json.dumps(["m", [1.0, None, 1.0]])
    now = [model, json.dumps([plan.GRANTS_CHOICE, [plan.STOPS_CHOICE]])]
    before = [model, json.dumps([plan.GRANTS_CHOICE, None])]
    assert plan.read_prices(now) == (
        {"m": [1.0, 1.0, 1.0]},
        [],
        {plan.GRANTS_CHOICE, plan.STOPS_CHOICE},
    )
    assert plan.read_prices(before)[1:] == ([], {plan.GRANTS_CHOICE})


@pytest.mark.parametrize("today_priced", [False, True])
async def test_a_deploy_that_changes_a_budgeted_agents_model_replays_the_calls_made_before_it(
    client: Client, model_server: ScriptedModelServer, today_priced: bool
) -> None:
    # The run priced the models it planned with when it started. Replayed after a deploy that
    # gave the agent another model, its earlier calls ask today's model's price, which the run
    # never recorded: the replay failed the run where it had made its calls, and its replays
    # failed at every attempt.
    model, agent, history = await finished_run(
        client, model_server, "remodelled", spend(100, call("look", topic="a")), 0.5
    )
    other = model.model_copy(
        update={"name": "another-model", "price": DOLLAR if today_priced else None}
    )
    replayed = await replays_under(history, dataclasses.replace(agent, model=other), "remodel")
    assert replayed.replay_failure is None, replayed.replay_failure


DEARER = Price(input=1000.0, output=1000.0)
"""A thousand times :data:`DOLLAR`: the run's 9,000 tokens of transcript cost $9 as input."""


@pytest.mark.parametrize("today", ["priced", "dearer", "unpriced"])
async def test_a_run_waiting_at_its_limit_goes_on_with_the_model_a_deploy_gave_it(
    client: Client, model_server: ScriptedModelServer, today: str
) -> None:
    # The run stops at its limit; a deploy then gives its agent a model it did not price when it
    # started. The new worker replays the calls made before the deploy; once the limit is
    # raised, the run prices the new model where it first calls it (a marker and the recording
    # local activity), and goes on with it: at once, or (a dearer model) after its first call of
    # it stops at the limit again and a person raises it once more. A model without a price
    # fails the run in words, and no call of it is made. Every end replays.
    model, agent = scripted_agent(
        model_server, f"remodelled-{today}", spend(9000, call("look", topic="a"))
    )
    async with serving(client, agent) as worker:
        queue = worker.task_queue
        handle = await start_run(
            client, agent, "go", task_queue=queue, budget=Budget(max_usd=0.012)
        )
        await wait_for_status(handle, "budget_reached")
    price = {"priced": DOLLAR, "dearer": DEARER, "unpriced": None}[today]
    new = model.model_copy(update={"name": f"{model.name}-new", "price": price})
    model_server.script(new.name, [spend(10, text("done with the new model"))])
    deployed = dataclasses.replace(agent, model=new)
    async with serving(client, deployed, task_queue=queue):
        await handle.set_budget(raise_by=0.05, by="ana")
        if today == "dearer":
            await wait_for_status(handle, "budget_reached")
            assert len(model_server.requests(new.name)) == 0
            await handle.set_budget(raise_by=20.0, by="ana")  # its 9,000 tokens in: $9
        if today != "unpriced":
            result = await handle.result()
        else:
            with pytest.raises(RunFailed) as failure:
                await handle.result()
        history = await handle.workflow.fetch_history()
        reached = [e.kind for e in await handle.events()].count("budget_reached")
    assert reached == (2 if today == "dearer" else 1)
    assert len(model_server.requests(model.name)) == 1
    if today != "unpriced":
        assert result.output == "done with the new model"
        assert len(model_server.requests(new.name)) == 1
        per_token = 1 if today == "priced" else 1000
        assert result.usage.cost_usd == pytest.approx((9000 + 10 * per_token) / 1e6)
    else:
        assert failure.value.type == "UnpricedModel"
        assert f"no price is known for {new.name}" in str(failure.value)
        assert len(model_server.requests(new.name)) == 0
    patches = [
        e.marker_recorded_event_attributes.details["patch-data"].payloads[0].data
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
        and e.marker_recorded_event_attributes.marker_name == "core_patch"
    ]
    assert sum(b"relaykit.budget-priced" in m for m in patches) == 1
    replayed = await replays_under(history, deployed, f"remodel-waiting-{today}")
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_run_the_release_before_failed_on_a_deployed_model_still_replays() -> None:
    # That release failed a run where it first called a model it had not priced, and wrote a
    # relaykit.budget-unplanned.<n> marker there (tests/histories/budget_unplanned.json: a run
    # waiting at its limit, raised after a deploy gave its agent the unpriced model). Today's
    # code prices such a model instead; a query or a reset of that failed run replays its end.
    from temporalio.client import WorkflowHistory

    text = (Path(__file__).resolve().parent / "histories" / "budget_unplanned.json").read_text()
    model = ModelSpec(name="unpriced-model", base_url="http://127.0.0.1:9/v1")
    agent = Agent(name="remodelled-waiting", model=model, tools=[look], model_settings=SMALL)
    history = WorkflowHistory.from_json("budget-unplanned", text)
    replayed = await replays_under(history, agent, "budget-unplanned")
    assert replayed.replay_failure is None, replayed.replay_failure


async def test_a_stop_right_after_a_turn_recorded_by_the_local_activity_replays(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Past the markers' bound a turn's call decisions are recorded by a local activity; when
    # every call of that turn is refused, the next model call is decided right after it, in
    # the same workflow task, and a stop there writes its marker after the local activity's.
    from relaykit.testing.scripted_server import batch
    from relaykit.workflows.call_record import MARKER_BOUND

    unknown = [call("nope", topic=str(i)) for i in range(MARKER_BOUND + 1)]
    _, agent = scripted_agent(
        model_server,
        "stop-after-record",
        spend(100, batch(*unknown)),
        spend(9000, call("nope", topic="x")),
    )
    history = await raised_run(client, agent)
    markers = [
        e.marker_recorded_event_attributes
        for e in history.events
        if e.HasField("marker_recorded_event_attributes")
    ]
    last_record = max(i for i, m in enumerate(markers) if m.marker_name == "core_local_activity")
    stop = markers[last_record + 1]
    assert b'"relaykit.budget-stop.2"' in stop.details["patch-data"].payloads[0].data
    replayed = await replays_under(history, agent, "stop-after-record")
    assert replayed.replay_failure is None, replayed.replay_failure
