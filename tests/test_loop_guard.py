"""The loop guard: a model that repeats one tool call with the same arguments gets the earlier
result instead of running the tool again, and the run still ends."""

from __future__ import annotations

import asyncio
import threading
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Replayer

from relaykit import Agent, Subagents, registry, start_run, tool
from relaykit.errors import ConfigurationError
from relaykit.graph import AgentGraph
from relaykit.messages import Message
from relaykit.sandbox import sandbox_runner
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    call,
    text,
)
from relaykit.workflows.agent_run import AgentRun
from tests.support import history_events, scheduled_activities, scripted_model, serving


def counting_tool(name: str, runs: list[str]) -> object:
    @tool(name=name)
    def status(order_id: str) -> str:
        """Status of an order.

        Args:
            order_id: The order id.
        """
        runs.append(order_id)
        return f"order {order_id}: shipped"

    return status


def repeats_unless_tools_are_withheld(request: ScriptedRequest) -> Step:
    """A stuck model: the same call every turn, an answer only when it is given no tools."""
    if request.body.get("tool_choice") == "none":
        return text(f"answer after {len(request.tool_results)} results")
    return call("order_status", order_id="A-1")


async def test_a_call_repeated_40_times_runs_the_tool_3_times_and_the_run_ends(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A model that ignores everything repeats the call 40 times, then answers: the tool ran
    # three times, every later call got the earlier result, and the run finished.
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(model.name, [call("order_status", order_id="A-1")] * 40 + [text("done")])
    agent = Agent(name="repeat40", model=model, tools=[counting_tool("order_status", runs)])
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "Where is A-1?", task_queue=worker.task_queue, max_turns=45
        )
        result = await handle.result()
    assert result.output == "done"
    assert runs == ["A-1"] * 3
    activities = await scheduled_activities(handle.workflow)
    assert activities.count("order_status") == 3
    results = [m for m in result.transcript if m.role == "tool"]
    assert len(results) == 40
    assert [r.content for r in results[:3]] == ["order A-1: shipped"] * 3
    refused = results[3:]
    assert all(
        r.content.startswith("order A-1: shipped\n\n(The same result as before") for r in refused
    )
    assert all("not run again" in r.content for r in refused)


async def test_a_turn_of_only_refused_repeats_makes_the_next_call_answer_without_tools(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # With the default limit (3) a stuck model is told to answer at turn 5, and is then asked
    # without tools; the run ends on its own, far below max_turns.
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.respond(model.name, repeats_unless_tools_are_withheld)
    agent = Agent(name="stuck", model=model, tools=[counting_tool("order_status", runs)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "Where is A-1?", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "answer after 4 results"
    assert result.turns == 5
    assert runs == ["A-1"] * 3
    choices = [r.body.get("tool_choice") for r in model_server.requests(model.name)]
    assert choices[-1] == "none" and "none" not in choices[:-1]


async def test_a_cancel_subagent_call_repeated_past_the_limit_is_not_run_and_the_run_ends(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The subagent tools go through the one tool path, loop guard included: a model stuck on
    # cancel_subagent(id="000") gets the earlier result with the note from the 4th call on,
    # is then asked without tools, and answers (before, it called it until max_turns).
    def stuck(request: ScriptedRequest) -> Step:
        if request.body.get("tool_choice") == "none":
            return text("giving up on 000")
        return call("cancel_subagent", raw_arguments='{"id": "000"}')

    model = scripted_model(model_server)
    model_server.respond(model.name, stuck)
    helper = Agent(name="guard_helper", model=model)
    lead = Agent(name="guard_lead", model=model, subagents=Subagents([helper]))
    async with serving(client, lead) as worker:
        handle = await start_run(client, lead, "cancel 000", task_queue=worker.task_queue)
        result = await handle.result()
    assert (result.output, result.turns) == ("giving up on 000", 5)
    results = [m for m in result.transcript if m.role == "tool"]
    assert len(results) == 4
    unknown = "Unknown task id '000'; no task has been started yet."
    assert [(r.content, r.is_error) for r in results[:3]] == [(unknown, True)] * 3
    refused = results[3]
    assert refused.content.startswith(unknown + "\n\n(The same result as before")
    assert "cancel_subagent already ran 3 times" in refused.content
    assert "not run again" in refused.content
    choices = [r.body.get("tool_choice") for r in model_server.requests(model.name)]
    assert choices[-1] == "none" and "none" not in choices[:-1]


async def test_a_repeated_cancel_subagent_is_not_run_again_and_cancels_the_task_once(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Run again, the second cancel would answer "already cancelled"; refused by the guard
    # (max_repeated_calls=1), it repeats the first result, and one cancel request is recorded.
    hold = threading.Event()
    child_model = scripted_model(model_server)
    model_server.respond(child_model.name, lambda req: text("late report", hold=hold))
    helper = Agent(name="guard_worker", model=child_model)
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("spawn_subagent", prompt="slow task"),
            call("cancel_subagent", raw_arguments='{"id": "task-1"}'),
            call("cancel_subagent", raw_arguments='{"id": "task-1"}'),
            text("cancelled it"),
        ],
    )
    lead = Agent(
        name="guard_canceller", model=model, subagents=Subagents([helper]), max_repeated_calls=1
    )
    try:
        async with serving(client, lead) as worker:
            handle = await start_run(client, lead, "start then stop", task_queue=worker.task_queue)
            result = await asyncio.wait_for(handle.result(), timeout=60)
            events = await history_events(handle.workflow)
    finally:
        hold.set()
    assert result.output == "cancelled it"
    first, second = [m.content for m in result.transcript if m.role == "tool"][1:]
    assert first == "Task task-1 cancelled."
    assert second.startswith("Task task-1 cancelled.\n\n(The same result as before")
    assert "already cancelled" not in second
    cancels = [
        e
        for e in events
        if e.event_type == EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(cancels) == 1


async def test_a_handoff_repeated_past_the_limit_does_not_switch_again(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Handoffs are tools too: triage and billing handing the conversation back and forth
    # with the same arguments stop at the limit, and the agent holding it answers.
    triage_model = scripted_model(model_server)
    billing_model = scripted_model(model_server)
    billing = Agent(name="guard_billing", model=billing_model, max_repeated_calls=1)
    triage = Agent(
        name="guard_triage", model=triage_model, handoffs=[billing], max_repeated_calls=1
    )
    billing.handoffs = [triage]
    model_server.script(
        triage_model.name,
        [
            call("transfer_to_guard_billing"),
            call("transfer_to_guard_billing"),
            text("triage answers"),
        ],
    )
    model_server.script(billing_model.name, [call("transfer_to_guard_triage")])
    async with serving(client, triage) as worker:
        handle = await start_run(client, triage, "ping", task_queue=worker.task_queue, max_turns=6)
        result = await handle.result()
        handoffs = [e for e in await handle.events() if e.kind == "handoff"]
    assert (result.output, result.final_agent) == ("triage answers", "guard_triage")
    assert [(e.data["from"], e.data["to"]) for e in handoffs] == [
        ("guard_triage", "guard_billing"),
        ("guard_billing", "guard_triage"),
    ]
    refused = [m for m in result.transcript if m.role == "tool"][-1]
    assert refused.name == "transfer_to_guard_billing"
    assert "not run again" in refused.content


async def test_arguments_that_differ_only_in_key_order_or_spacing_count_as_the_same_call(
    client: Client, model_server: ScriptedModelServer
) -> None:
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("order_status", raw_arguments='{"order_id": "A-1"}'),
            call("order_status", raw_arguments='{ "order_id":"A-1" }'),
            call("order_status", order_id="B-2"),  # other arguments: runs
            text("ok"),
        ],
    )
    agent = Agent(
        name="canonical",
        model=model,
        tools=[counting_tool("order_status", runs)],
        max_repeated_calls=1,
    )
    async with serving(client, agent) as worker:
        result = await (
            await start_run(client, agent, "A-1?", task_queue=worker.task_queue)
        ).result()
    assert runs == ["A-1", "B-2"]
    second = [m for m in result.transcript if m.role == "tool"][1]
    assert "already ran once" in second.content and "order A-1: shipped" in second.content


async def test_a_user_message_restarts_the_count(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A person's new message may change the answer: the same call runs again after it.
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("order_status", order_id="A-1"),
            text("first"),
            call("order_status", order_id="A-1"),
            text("second"),
        ],
    )
    agent = Agent(
        name="restart",
        model=model,
        tools=[counting_tool("order_status", runs)],
        max_repeated_calls=1,
    )
    async with serving(client, agent) as worker:
        first = await (
            await start_run(client, agent, "A-1?", task_queue=worker.task_queue)
        ).result()
        second = await (
            await start_run(
                client,
                agent,
                [*first.transcript, Message.user("And now?")],
                task_queue=worker.task_queue,
            )
        ).result()
    assert second.output == "second"
    assert runs == ["A-1", "A-1"]


async def test_the_count_survives_continue_as_new(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The guard's memory is run state: a new run (continue-as-new every 2 turns) keeps it.
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(model.name, [call("order_status", order_id="A-1")] * 8 + [text("done")])
    agent = Agent(
        name="guard_can",
        model=model,
        tools=[counting_tool("order_status", runs)],
        max_repeated_calls=2,
    )
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "A-1?",
            task_queue=worker.task_queue,
            max_turns=12,
            continue_as_new_after_turns=2,
        )
        result = await handle.result()
    assert result.output == "done"
    assert runs == ["A-1"] * 2
    description = await handle.workflow.describe()
    assert description.run_id != handle.run_id  # it did continue as new
    refused = [m for m in result.transcript if m.role == "tool"][-1]
    assert "not run again" in refused.content


async def test_max_repeated_calls_none_runs_every_call(
    client: Client, model_server: ScriptedModelServer
) -> None:
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(model.name, [call("order_status", order_id="A-1")] * 5 + [text("done")])
    agent = Agent(
        name="unguarded",
        model=model,
        tools=[counting_tool("order_status", runs)],
        max_repeated_calls=None,
    )
    async with serving(client, agent) as worker:
        await (await start_run(client, agent, "A-1?", task_queue=worker.task_queue)).result()
    assert runs == ["A-1"] * 5


@pytest.mark.parametrize("option", ["max_repeated_calls", "answer_after_tool_turns"])
@pytest.mark.parametrize("bad", [0, -1, True, 1.5, "3"])
def test_loop_limits_must_be_positive_ints(option: str, bad: object) -> None:
    with pytest.raises(ConfigurationError, match=option):
        Agent(name="bad", **{option: bad})


async def _replay(client: Client, handle_id: str, graph: AgentGraph, task_queue: str) -> None:
    """Replay a finished run's history through today's code with ``graph`` (as a worker would
    have it; the Replayer's task queue is ``replay-<build id>``)."""
    history = await client.get_workflow_handle(handle_id).fetch_history()
    build_id = task_queue.removeprefix("replay-")
    registry.register(task_queue, graph)
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            data_converter=client.data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build_id,
        )
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(task_queue, graph)
    assert result.replay_failure is None, result.replay_failure


async def test_guarded_runs_replay_and_runs_from_before_the_guard_replay_under_it(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A run that the guard cut short replays; so does a run recorded without the guard (every
    # repeat ran), once the guard is on: it keeps running the calls it ran (workflow.patched).
    runs: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("order_status", order_id="A-1")] * 5
        + [text("guarded")]
        + [call("order_status", order_id="A-1")] * 5
        + [text("unguarded")],
    )
    tool_ = counting_tool("order_status", runs)
    guarded = Agent(name="replay_guard", model=model, tools=[tool_], max_repeated_calls=2)
    unguarded = guarded.clone(max_repeated_calls=None)
    queue = f"replay-{uuid.uuid4().hex[:8]}"
    async with serving(client, guarded, task_queue=queue) as worker:
        graph = worker.graph
        first = await start_run(client, guarded, "A-1?", task_queue=queue)
        assert (await first.result()).output == "guarded"
    async with serving(client, unguarded, task_queue=queue):
        second = await start_run(client, unguarded, "A-1?", task_queue=queue)
        assert (await second.result()).output == "unguarded"
    assert runs == ["A-1"] * (2 + 5)
    await _replay(client, first.id, graph, queue)
    await _replay(client, second.id, graph, queue)


def test_arguments_that_are_not_json_or_nest_too_deep_are_compared_as_text() -> None:
    from relaykit.messages import ToolCall
    from relaykit.workflows.loop_guard import call_key

    deep = "[" * 100_000 + "]" * 100_000
    assert call_key(ToolCall(id="a", name="t", arguments=deep)) == call_key(
        ToolCall(id="b", name="t", arguments=deep)
    )
    assert call_key(ToolCall(id="a", name="t", arguments="{oops")) != call_key(
        ToolCall(id="a", name="t", arguments="{oops!")
    )


def test_a_turn_decided_again_after_restoring_the_snapshot_decides_as_the_first_time() -> None:
    # A replay whose definitions decided a turn otherwise goes back to the snapshot and decides
    # the turn again: the answers and the guard's state must be those of deciding it once.
    from relaykit.messages import ToolCall
    from relaykit.runs import RunSetup, RunState
    from relaykit.workflows.loop_guard import check_repeat, guard_snapshot, restore_guard

    def turn(n: int, *calls: tuple[str, str]) -> list[ToolCall]:
        return [
            ToolCall(id=f"t{n}-{i}", name=name, arguments=a) for i, (name, a) in enumerate(calls)
        ]

    earlier = turn(1, ("lookup", '{"q": "x"}'), ("fetch", '{"u": 1}'))
    now = turn(2, ("lookup", '{"q":"x"}'), ("lookup", "{}"), ("lookup", '{ "q": "x" }'))
    state = RunState(agent="a", setup=RunSetup(recorded_calls=True))
    state.transcript = [Message.user("go"), Message.assistant(tool_calls=earlier)]
    for made in earlier:
        assert check_repeat(state, made, 2) is None
    state.transcript += [Message.tool_result(c, f"result of {c.name}") for c in earlier]
    state.transcript.append(Message.assistant(tool_calls=now))
    untouched = state.model_copy(deep=True)

    snapshot = guard_snapshot(state, now)
    first = [check_repeat(state, c, 2) for c in now]
    after_once = state.repeats.model_dump()
    restore_guard(state, snapshot)
    again = [check_repeat(state, c, 2) for c in now]

    assert [answer is None for answer in first] == [True, True, False]  # the third: a 3rd run
    assert first[2] is not None and "already ran 2 times" in first[2]
    assert again == first
    assert state.repeats.model_dump() == after_once
    assert [check_repeat(untouched, c, 2) for c in now] == first
    assert untouched.repeats.model_dump() == after_once
