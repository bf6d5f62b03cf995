"""Subagent and agent-as-tool semantics as lovia and Eino define them (issue 15 items 1-7 and 10,
issue 12 item 1, issue 14's child names), on the real Temporal server with a scripted model."""

from __future__ import annotations

import asyncio
import json
import re
import threading
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client

from relaykit import Agent, RunFailed, Subagents, ToolContext, start_run, tool
from relaykit.messages import Message
from relaykit.runs import RunResult
from relaykit.streaming import StreamEvent
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    batch,
    call,
    text,
)
from relaykit.watch import describe
from tests.support import history_events, scripted_model, serving


def _tool_results(result: RunResult) -> list[Message]:
    return [m for m in result.transcript if m.role == "tool"]


async def _event_types(handle: Any) -> list[int]:
    return [e.event_type for e in await history_events(handle.workflow)]


# --- agent as tool ------------------------------------------------------------------------------


async def test_agent_tool_child_run_is_named_after_the_agent_and_the_event_names_the_same_id(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [text("one"), text("two")])
    model_server.script(
        parent_model.name,
        [
            batch(call("ask_summarizer", input="first"), call("ask_summarizer", input="second")),
            text("done"),
        ],
    )
    summarizer = Agent(name="summarizer", model=child_model)
    manager = Agent(name="manager", model=parent_model, tools=[summarizer.as_tool()])
    async with serving(client, manager) as worker:
        handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        events = await handle.events()
    named = [e.data["workflow_id"] for e in events if e.kind == "tool_call"]
    assert named == [f"{handle.id}/summarizer-1", f"{handle.id}/summarizer-2"]
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert sorted(started) == sorted(named)
    assert sorted(m.content for m in _tool_results(result)) == ["one", "two"]


async def test_a_tool_that_cancels_its_own_agent_tool_child_run_ends_the_parent_cancelled(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # lovia: the child shares its parent's cancel token, so one cancel stops the whole tree.
    @tool
    async def abort_run(ctx: ToolContext) -> str:
        """Cancel the run this tool serves."""
        await client.get_workflow_handle(ctx.workflow_id).cancel()
        await asyncio.sleep(30)  # cancelled with the run
        return "not reached"

    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [call("abort_run")])
    model_server.script(parent_model.name, [call("ask_operator", input="stop everything")])
    operator = Agent(name="operator", model=child_model, tools=[abort_run])
    front = Agent(name="front", model=parent_model, tools=[operator.as_tool()])
    async with serving(client, front) as worker:
        handle = await start_run(client, front, "go", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await asyncio.wait_for(handle.result(), timeout=60)
        parent = await handle.workflow.describe()
        child = await client.get_workflow_handle(f"{handle.id}/operator-1").describe()
    assert failure.value.type == "RunCancelled"
    assert child.status is not None and child.status.name == "CANCELED"
    assert parent.status is not None and parent.status.name == "CANCELED"
    # The child's cancel request can reach the parent while the parent completes a task; the
    # server then refuses that completion (UnhandledCommand) and the task runs again with the
    # request in view. That is Temporal's normal race, not a failure of workflow code.
    failed = [
        e
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
        and e.workflow_task_failed_event_attributes.cause
        != WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND
    ]
    assert failed == []


async def test_an_agent_tool_child_that_fails_is_still_an_error_result_for_the_parent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [call("nothing_here"), call("nothing_here")])
    model_server.script(parent_model.name, [call("ask_clerk", input="go"), text("recovered")])
    clerk = Agent(name="clerk", model=child_model)
    front = Agent(name="front", model=parent_model, tools=[clerk.as_tool(max_turns=2)])
    async with serving(client, front) as worker:
        handle = await start_run(client, front, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == "recovered"
    (failed,) = _tool_results(result)
    assert failed.is_error and "did not finish" in failed.content


# --- background subagents -----------------------------------------------------------------------


def _held_researcher(model_server: ScriptedModelServer, hold: threading.Event) -> Agent:
    model = scripted_model(model_server)
    model_server.respond(model.name, lambda req: text(f"report on {req.last_user_text}", hold=hold))
    return Agent(name="researcher", model=model)


async def _run_lead(
    client: Client,
    model_server: ScriptedModelServer,
    steps: list[Step] | None = None,
    *,
    respond: Any = None,
    hold: threading.Event | None = None,
    researcher: Agent | None = None,
    **capability: Any,
) -> tuple[RunResult, Any, list[ScriptedRequest]]:
    """Run a lead with a scripted model and one researcher; returns its result, handle and the
    requests its model got. ``hold`` keeps the researcher's answers back until the run ends.
    The handle's ``run_events`` holds the run's events (queried while the worker serves)."""
    hold = hold if hold is not None else threading.Event()
    researcher = researcher or _held_researcher(model_server, hold)
    lead_model = scripted_model(model_server)
    if steps is not None:
        model_server.script(lead_model.name, steps)
    if respond is not None:
        model_server.respond(lead_model.name, respond)
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([researcher], **capability))
    try:
        async with serving(client, lead) as worker:
            handle = await start_run(client, lead, "go", task_queue=worker.task_queue)
            result = await asyncio.wait_for(handle.result(), timeout=60)
            handle.run_events = await handle.events()
    finally:
        hold.set()
    return result, handle, model_server.requests(lead_model.name)


async def test_wait_with_timeout_zero_does_not_wait_and_names_the_running_tasks(
    client: Client, model_server: ScriptedModelServer
) -> None:
    result, handle, _ = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", timeout_seconds=0),
            text("ok"),
        ],
    )
    waited = _tool_results(result)[1]
    assert not waited.is_error
    assert "Did not wait" in waited.content and "task-1 (researcher, running for" in waited.content
    assert EventType.EVENT_TYPE_TIMER_STARTED not in await _event_types(handle)


async def test_a_wait_that_times_out_says_so_and_lists_what_still_runs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    result, _, _ = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", timeout_seconds=0.5),
            text("ok"),
        ],
    )
    waited = _tool_results(result)[1]
    assert "The wait timed out after 0.5 s" in waited.content
    assert "task-1 (researcher, running for" in waited.content and '"alpha"' in waited.content


@pytest.mark.parametrize(
    "raw",
    [
        '{"timeout_seconds": 1e8}',
        '{"timeout_seconds": 1e300}',
        '{"timeout_seconds": NaN}',
        '{"timeout_seconds": -1}',
        '{"timeout_seconds": "soon"}',
        '{"ids": 7}',
        '{"ids": [{"id": "task-1"}]}',
        '{"ids": "task-1"}',
        '["task-1"]',
        "wait for everything",
    ],
)
async def test_wait_arguments_out_of_bounds_or_of_the_wrong_type_are_an_error_result_without_a_timer(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, raw: str
) -> None:
    result, handle, _requests = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", raw_arguments=raw),
            text("ok"),
        ],
    )
    refused = _tool_results(result)[1]
    assert refused.is_error and "Invalid arguments for tool 'wait_subagents'" in refused.content
    assert result.output == "ok"
    types = await _event_types(handle)
    assert EventType.EVENT_TYPE_TIMER_STARTED not in types
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in types


async def test_wait_schema_shows_the_bounds_that_are_enforced(
    client: Client, model_server: ScriptedModelServer
) -> None:
    _, _, requests = await _run_lead(client, model_server, [text("nothing to do")])
    tools = {t["function"]["name"]: t["function"]["parameters"] for t in requests[0].body["tools"]}
    timeout = tools["wait_subagents"]["properties"]["timeout_seconds"]
    assert (timeout["minimum"], timeout["maximum"]) == (0, 600)
    assert tools["spawn_subagent"]["properties"]["agent"]["enum"] == ["researcher"]
    assert tools["cancel_subagent"]["required"] == ["id"]


async def test_wait_on_an_unknown_id_lists_the_known_ones(
    client: Client, model_server: ScriptedModelServer
) -> None:
    result, _, _ = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", ids=["task-9"], timeout_seconds=1),
            text("ok"),
        ],
    )
    unknown = _tool_results(result)[1]
    assert unknown.is_error
    assert "Unknown task id: task-9" in unknown.content and "task-1 (running)" in unknown.content


def _quick_and_slow_researcher(model_server: ScriptedModelServer, hold: threading.Event) -> Agent:
    """Answers at once, except for prompts with "slow", which wait for ``hold``."""
    model = scripted_model(model_server)
    model_server.respond(
        model.name,
        lambda req: text(
            f"report on {req.last_user_text}", hold=hold if "slow" in req.last_user_text else None
        ),
    )
    return Agent(name="researcher", model=model)


def _idle() -> Step:
    """A harmless turn (an error result) that takes a moment, while a report is on its way."""
    return call("cancel_subagent", raw_arguments='{"id": "task-99"}', delay=0.2)


def _seen(request: ScriptedRequest, needle: str) -> bool:
    return needle in json.dumps(request.messages)


async def test_waiting_after_every_report_was_delivered_says_which_finished_or_were_cancelled(
    client: Client, model_server: ScriptedModelServer
) -> None:
    hold = threading.Event()
    researcher = _quick_and_slow_researcher(model_server, hold)

    def lead(request: ScriptedRequest) -> Step:
        if request.index == 0:
            return call("spawn_subagent", prompt="alpha")
        if not _seen(request, "Background task report"):
            return _idle()
        if not _seen(request, "task-2"):
            return call("spawn_subagent", prompt="slow beta")
        if not _seen(request, "Task task-2 cancelled"):
            return call("cancel_subagent", raw_arguments='{"id": "task-2"}')
        if not _seen(request, "No task is running"):
            return call("wait_subagents")
        return text("ok")

    result, _, _ = await _run_lead(
        client, model_server, respond=lead, researcher=researcher, hold=hold
    )
    last_wait = _tool_results(result)[-1]
    assert not last_wait.is_error
    assert "Finished: task-1 (researcher, finished)" in last_wait.content
    assert "already delivered" in last_wait.content
    assert "Cancelled (no report): task-2 (researcher)" in last_wait.content
    delivered = " ".join(m.content for m in result.transcript if m.role in ("user", "tool"))
    assert delivered.count("report on alpha") == 1


async def test_a_report_entering_the_transcript_at_a_turn_boundary_is_an_event(
    client: Client, model_server: ScriptedModelServer
) -> None:
    researcher = _quick_and_slow_researcher(model_server, threading.Event())

    def lead(request: ScriptedRequest) -> Step:
        if request.index == 0:
            return call("spawn_subagent", prompt="alpha")
        if _seen(request, "Background task report"):
            return text("ok")
        return _idle()

    result, handle, _ = await _run_lead(client, model_server, respond=lead, researcher=researcher)
    events = handle.run_events
    kinds = [e.kind for e in events]
    delivered = [e for e in events if e.kind == "report_delivered"]
    assert [e.data for e in delivered] == [
        {"id": "task-1", "agent": "researcher", "status": "finished", "via": "turn_boundary"}
    ]
    assert kinds.index("subagent_finished") < kinds.index("report_delivered")
    assert any(m.role == "user" and "report on alpha" in m.content for m in result.transcript)
    line = describe(StreamEvent(**delivered[0].model_dump(), workflow_id=handle.id))
    assert line == "report of task-1 (researcher) delivered (turn_boundary)"  # relaykit watch


async def test_the_cap_refusal_names_the_running_tasks_that_hold_the_slots(
    client: Client, model_server: ScriptedModelServer
) -> None:
    result, _, _ = await _run_lead(
        client,
        model_server,
        [
            batch(call("spawn_subagent", prompt="alpha"), call("spawn_subagent", prompt="beta")),
            call("spawn_subagent", prompt="gamma"),
            text("ok"),
        ],
        max_concurrent=2,
    )
    refused = _tool_results(result)[2]
    assert refused.is_error and refused.content.startswith("Refused: 2 of at most 2 tasks")
    assert "task-1 (researcher, running for" in refused.content and '"alpha"' in refused.content
    assert "task-2 (researcher, running for" in refused.content and '"beta"' in refused.content


async def test_detached_subagents_are_not_told_to_wait_before_answering(
    client: Client, model_server: ScriptedModelServer
) -> None:
    sink_model = scripted_model(model_server)
    model_server.respond(sink_model.name, lambda req: text("stored"))
    _, _, requests = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", raw_arguments='{"timeout_seconds": 5}'),
            text("answered without waiting"),
        ],
        detached=True,
        deliver_url="http://127.0.0.1:9/reports",
    )
    system = requests[0].system
    assert "spawn_subagent" in system
    assert "wait for your tasks" not in system and "do not wait for them" in system
    assert requests[0].tool_names == ["spawn_subagent"]
    assert "Background tasks" not in json.dumps(requests[1].messages)  # nothing to wait for
    assert "not available" in requests[2].tool_results[-1]


async def test_the_status_reminder_shows_elapsed_time_forbids_finishing_and_goes_when_tasks_end(
    client: Client, model_server: ScriptedModelServer
) -> None:
    hold = threading.Event()
    researcher = _quick_and_slow_researcher(model_server, hold)

    def lead(request: ScriptedRequest) -> Step:
        if request.index == 0:
            return call("spawn_subagent", prompt="slow alpha")
        if request.index == 1:
            hold.set()
            return call("wait_subagents", timeout_seconds=30)
        return text("ok")

    _, _, requests = await _run_lead(
        client, model_server, respond=lead, researcher=researcher, hold=hold
    )
    while_running = requests[1].last_user_text
    assert while_running.startswith("Background tasks:")
    assert re.search(r'task-1 \(researcher, running for \d+s\): "slow alpha"', while_running)
    assert "Do not give your final answer while tasks are running" in while_running
    assert "Background tasks" not in json.dumps(requests[2].messages)


async def test_a_long_report_keeps_its_beginning_and_its_conclusion(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    long_report = "BEGINNING " + "x" * 5_000 + " CONCLUSION"
    model_server.respond(model.name, lambda req: text(long_report))
    researcher = Agent(name="researcher", model=model)
    result, _, _ = await _run_lead(
        client,
        model_server,
        [
            call("spawn_subagent", prompt="alpha"),
            call("wait_subagents", timeout_seconds=30),
            text("ok"),
        ],
        researcher=researcher,
        max_result_chars=200,
    )
    report = _tool_results(result)[1].content
    assert "BEGINNING" in report and report.rstrip().endswith("CONCLUSION")
    assert "characters dropped from the middle" in report
    assert len(report) < 400


@pytest.mark.parametrize(
    ("name", "raw", "says"),
    [
        ("spawn_subagent", '{"prompt": "   "}', "must not be blank"),
        ("spawn_subagent", '{"prompt": 42}', "prompt"),
        ("spawn_subagent", '{"prompt": "x", "agent": ["researcher"]}', "agent"),
        ("spawn_subagent", '{"prompt": "x", "agent": "nobody"}', "choose one of: researcher"),
        ("cancel_subagent", '{"id": ["task-1"]}', "id"),
        ("cancel_subagent", '{"id": 1}', "id"),
        ("cancel_subagent", '{"id": "task-7"}', "known tasks: task-1 (running)"),
        ("send_to_subagent", '{"id": "task-1", "message": {"text": "hi"}}', "message"),
        ("send_to_subagent", '{"id": "task-1"}', "message"),
        ("send_to_subagent", "null", "object"),
    ],
)
async def test_invalid_subagent_tool_arguments_become_error_results_the_model_can_correct(
    client: Client, model_server: ScriptedModelServer, name: str, raw: str, says: str
) -> None:
    result, handle, _ = await _run_lead(
        client,
        model_server,
        [call("spawn_subagent", prompt="alpha"), call(name, raw_arguments=raw), text("ok")],
    )
    refused = _tool_results(result)[1]
    assert refused.is_error and says in refused.content
    assert result.output == "ok"
    assert EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED not in await _event_types(handle)


async def test_a_task_id_held_by_a_task_of_an_earlier_run_is_an_error_result_not_a_failed_run(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A run id used again while a detached task of its earlier run still runs: the new run's
    # task-1 cannot start under the same workflow id, and the model is told so.
    hold = threading.Event()
    researcher = _held_researcher(model_server, hold)
    lead_model = scripted_model(model_server)
    model_server.script(
        lead_model.name,
        [
            call("spawn_subagent", prompt="first"),
            text("first done"),
            call("spawn_subagent", prompt="second"),
            text("second done"),
        ],
    )
    lead = Agent(
        name="lead",
        model=lead_model,
        subagents=Subagents([researcher], detached=True, deliver_url="http://127.0.0.1:9/r"),
    )
    run_id = f"reused-{uuid.uuid4().hex[:8]}"
    try:
        async with serving(client, lead) as worker:
            first = await start_run(client, lead, "go", task_queue=worker.task_queue, id=run_id)
            assert (await asyncio.wait_for(first.result(), timeout=60)).output == "first done"
            second = await start_run(client, lead, "again", task_queue=worker.task_queue, id=run_id)
            result = await asyncio.wait_for(second.result(), timeout=60)
    finally:
        hold.set()
    assert result.output == "second done"
    refused = _tool_results(result)[0]
    assert refused.is_error and f"{run_id}/task-1 is already running" in refused.content
