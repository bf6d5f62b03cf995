"""A run's event stream with its child runs merged in, against the real Temporal dev server."""

from __future__ import annotations

import asyncio
import threading

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, RunHandle, Subagents, start_run, tool
from relaykit.streaming import StreamEvent
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import history_events, scripted_model, serving


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted: {text}"


@tool(needs_approval=True)
def wire(amount: int) -> str:
    """Wire money.

    Args:
        amount: Euros.
    """
    return f"wired {amount}"


async def collect(handle: RunHandle, **options: object) -> list[StreamEvent]:
    return [item async for item in handle.stream(**options)]  # type: ignore[arg-type]


def keys(items: list[StreamEvent]) -> list[tuple[str, str, int]]:
    return [(i.workflow_id, i.kind, i.seq) for i in items]


def team(model_server: ScriptedModelServer, gate: threading.Event | None = None) -> Agent:
    """manager → summarizer (agent tool, which calls `note`) and researcher (a subagent)."""
    manager_model = scripted_model(model_server)
    summarizer_model = scripted_model(model_server)
    researcher_model = scripted_model(model_server)
    model_server.script(
        summarizer_model.name, [call("note", text="draft", hold=gate), text("summary done")]
    )
    model_server.script(researcher_model.name, [text("research done")])
    model_server.script(
        manager_model.name,
        [
            batch(
                call("spawn_subagent", prompt="look into it"),
                call("ask_summarizer", input="sum up"),
            ),
            call("wait_subagents", timeout_seconds=30),
            text("all done"),
        ],
    )
    summarizer = Agent(name="summarizer", model=summarizer_model, tools=[note])
    researcher = Agent(name="researcher", model=researcher_model)
    return Agent(
        name="manager",
        model=manager_model,
        tools=[summarizer.as_tool()],
        subagents=Subagents([researcher]),
    )


async def test_child_events_reach_the_root_stream_live_in_order_with_their_run_paths(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: a child's events come after the parent event that started it, before the parent
    # event that consumed its result, each once, with the path from the root.
    gate = threading.Event()
    manager = team(model_server, gate)
    items: list[StreamEvent] = []
    try:
        async with serving(client, manager) as worker:
            handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
            async for item in handle.stream(deltas=False):
                items.append(item)
                if item.run_path == ["manager", "summarizer"] and item.kind == "run_started":
                    gate.set()  # the child is held until the stream has seen it start
            result = await handle.result()
    finally:
        gate.set()
    assert result.output == "all done"
    assert len(set(keys(items))) == len(items)
    by_run: dict[str, list[int]] = {}
    for item in items:
        by_run.setdefault(item.workflow_id, []).append(item.seq)
    assert by_run[handle.id] == list(range(len(by_run[handle.id])))
    tool_call = next(
        i for i in items if i.kind == "tool_call" and i.data["name"] == "ask_summarizer"
    )
    child_id = f"{handle.id}/summarizer-1"  # agent-tool children are named after their agent
    assert tool_call.data["workflow_id"] == child_id
    task_id = f"{handle.id}/task-1"
    assert set(by_run) == {handle.id, child_id, task_id}
    for wid in (child_id, task_id):
        assert by_run[wid] == list(range(len(by_run[wid])))

    child = [i for i in items if i.workflow_id == child_id]
    assert [i.kind for i in child] == [
        "run_started",
        "model_call",
        "tool_call",
        "tool_result",
        "model_call",
        "message",
        "final",
    ]
    assert all(i.run_path == ["manager", "summarizer"] and i.depth == 1 for i in child)
    task = [i for i in items if i.workflow_id == task_id]
    assert [i.kind for i in task] == ["run_started", "model_call", "message", "final"]
    assert all(i.run_path == ["manager", "researcher"] for i in task)

    position = {key: n for n, key in enumerate(keys(items))}
    first = lambda xs: position[keys(xs[:1])[0]]  # noqa: E731
    last = lambda xs: position[keys(xs[-1:])[0]]  # noqa: E731
    tool_result = next(
        i
        for i in items
        if i.kind == "tool_result" and i.data["call_id"] == tool_call.data["call_id"]
    )
    assert first([tool_call]) < first(child) and last(child) < first([tool_result])
    started = next(i for i in items if i.kind == "subagent_started")
    finished = next(i for i in items if i.kind == "subagent_finished")
    assert first([started]) < first(task) and last(task) < first([finished])
    assert items[-1].workflow_id == handle.id and items[-1].kind == "final"


async def test_stream_resumes_from_any_cursor_without_losing_or_repeating_an_event(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: stopping after any item and resuming from its cursor gives the rest, exactly.
    manager = team(model_server)
    async with serving(client, manager) as worker:
        handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
        await handle.result()
        whole = await collect(handle, deltas=False)
        for stop in range(1, len(whole)):
            rest = await collect(handle, deltas=False, from_offset=whole[stop - 1].cursor)
            assert keys(whole[:stop]) + keys(rest) == keys(whole), stop
        from_seq = await collect(handle, deltas=False, children=False, from_offset=3)
    root = [i for i in whole if i.workflow_id == handle.id]
    assert keys(from_seq) == keys(root[3:])


async def test_stream_of_a_single_run_needs_no_child_lookups(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Without children the stream is the run's own log, the same as the `events` query.
    manager = team(model_server)
    async with serving(client, manager) as worker:
        handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
        await handle.result()
        own = await collect(handle, deltas=False, children=False)
        logged = await handle.events()
    assert [(i.kind, i.seq, i.data) for i in own] == [(e.kind, e.seq, e.data) for e in logged]
    assert {i.workflow_id for i in own} == {handle.id}


async def test_an_approval_inside_a_child_run_appears_once_in_the_root_stream(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The child's request is recorded by the child and by the root (so it can be answered
    # there); the merged stream shows it once, from the run that owns the call.
    manager_model = scripted_model(model_server)
    payer_model = scripted_model(model_server)
    model_server.script(payer_model.name, [call("wire", amount=5), text("paid")])
    model_server.script(manager_model.name, [call("ask_payer", input="pay 5"), text("done")])
    payer = Agent(name="payer", model=payer_model, tools=[wire])
    manager = Agent(name="manager", model=manager_model, tools=[payer.as_tool()])
    items: list[StreamEvent] = []
    async with serving(client, manager) as worker:
        handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
        async for item in handle.stream(deltas=False):
            items.append(item)
            if item.kind == "approval_requested":
                await handle.approve(item.data["call_id"])
        assert (await handle.result()).output == "done"
        root_log = await handle.events()
    requested = [i for i in items if i.kind == "approval_requested"]
    answered = [i for i in items if i.kind == "approval_answered"]
    assert len(requested) == 1 and len(answered) == 1
    assert requested[0].run_path == ["manager", "payer"] and requested[0].workflow_id != handle.id
    assert answered[0].workflow_id == requested[0].workflow_id
    assert any(e.kind == "approval_requested" for e in root_log)  # the root's own copy exists


def without_empty_tasks(kinds: list[int]) -> list[int]:
    """``kinds`` without the workflow tasks that nothing new caused.

    Temporal's core SDK ends a workflow task early when it answers a query while a local
    activity (the recorded decisions) is still to resolve, and runs another task for the rest:
    that task follows the previous one's last command (or the previous task itself, when it had
    none) with no event in between that would have caused it (an activity's completion, a
    signal, a timer). A query that reaches a busy run may do that; nothing else the stream
    does can."""
    scheduled, started, completed = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
    )
    uncaused_after = {
        completed,  # a task with no command
        EventType.EVENT_TYPE_MARKER_RECORDED,  # the commands of the task before it
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
    }
    kept: list[int] = []
    for kind in kinds:
        if kept[-3:] == [scheduled, started, completed] and kept[-4:-3] != []:
            if kept[-4] in uncaused_after:
                del kept[-3:]
        kept.append(kind)
    return kept


async def test_reading_the_stream_adds_nothing_to_the_run_history(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Two runs of the same script, one watched live by two streams and one not, have histories
    # of the same length and kinds of events (but for a task with no command a query may add).
    histories = []
    for watched in (False, True):
        model = scripted_model(model_server, stream=True)
        model_server.script(model.name, [call("note", text="a"), text("the answer")])
        agent = Agent(name="watched" if watched else "alone", model=model, tools=[note])
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
            if watched:
                await asyncio.gather(collect(handle), collect(handle))
            await handle.result()
            kinds = [e.event_type for e in await history_events(handle.workflow)]
            histories.append(without_empty_tasks(kinds))
    assert histories[0] == histories[1]


async def test_stream_follows_a_run_across_continue_as_new_without_a_gap(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: a run that continues as new keeps one event log; the stream reads it across the
    # workflow runs, in order, each event once.
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("note", text="1"), call("note", text="2"), call("note", text="3"), text("end")],
    )
    agent = Agent(name="long", model=model, tools=[note])
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, continue_as_new_after_turns=1
        )
        items = await collect(handle)
        assert (await handle.result()).output == "end"
    events = [i for i in items if not i.is_delta]
    assert [i.seq for i in events] == list(range(len(events)))
    assert sum(i.kind == "continued_as_new" for i in events) == 3
    assert [i.data["content"] for i in events if i.kind == "tool_result"] == [
        "noted: 1",
        "noted: 2",
        "noted: 3",
    ]
    assert events[-1].kind == "final"


async def test_stream_ends_when_the_run_is_cancelled_while_a_child_runs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: the stream ends with the run, however it ends (here: cancelled mid-child).
    gate = threading.Event()
    manager = team(model_server, gate)
    items: list[StreamEvent] = []
    try:
        async with serving(client, manager) as worker:
            handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
            async for item in handle.stream(deltas=False):
                items.append(item)
                if item.run_path == ["manager", "summarizer"] and item.kind == "run_started":
                    await handle.cancel()
            description = await handle.workflow.describe()
    finally:
        gate.set()
    assert description.status is not None and description.status.name == "CANCELED"
    assert not [i for i in items if i.kind == "final" and i.workflow_id == handle.id]
    assert len(set(keys(items))) == len(items)


def test_only_a_task_that_nothing_new_caused_is_left_out() -> None:
    s, b, c = 5, 6, 7  # workflow task scheduled, started, completed
    scheduled, started, done, marker = 10, 11, 12, 25  # an activity's events; a marker
    ran = [scheduled, started, done]
    plain = [1, s, b, c, *ran, s, b, c, marker, scheduled]
    assert without_empty_tasks(plain) == plain
    # a task with no command, then the one that does the work
    forced = [1, s, b, c, *ran, s, b, c, s, b, c, marker, scheduled]
    assert without_empty_tasks(forced) == plain
    # the work split over two tasks: the marker in one, the next activity in the other
    split = [1, s, b, c, *ran, s, b, c, marker, s, b, c, scheduled]
    assert without_empty_tasks(split) == plain
    # a task after an activity's completion is always kept, and so is the last one
    assert without_empty_tasks([1, s, b, c, marker, s, b, c]) == [1, s, b, c, marker, s, b, c]
    two = [1, s, b, c, *ran, s, b, c, *ran, s, b, c]
    assert without_empty_tasks(two) == two
