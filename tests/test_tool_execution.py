"""Bounded, observable tool execution against the real Temporal dev server: retries end, nothing
a tool produces can exceed Temporal's payload limit, tools heartbeat on their own, and sync tools
run on the worker's own thread pool."""

from __future__ import annotations

import asyncio
import collections
import json
import threading
import time
import uuid
from datetime import timedelta
from typing import Any

from pydantic_core import to_json
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.exceptions import ApplicationError

from relaykit import Agent, ToolContext, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.tools import (
    DEFAULT_TOOL_HEARTBEAT_TIMEOUT,
    MAX_OFFLOADED_TOOL_RESULT_BYTES,
    MAX_TOOL_ERROR_BYTES,
    MAX_TOOL_RESULT_BYTES,
    ToolInvocation,
)
from tests.support import history_events, scripted_model, serving

RUNS: collections.Counter[str] = collections.Counter()
"""Executions per tool call, counted inside the tools (one worker process: the test's)."""
BIG = 3 * 1024 * 1024


def _count(key: str) -> int:
    RUNS[key] += 1
    return RUNS[key]


@tool
def always_flaky(key: str) -> str:
    """Fail with a retryable error every time.

    Args:
        key: Counter key.
    """
    _count(key)
    raise ApplicationError("upstream unavailable", next_retry_delay=timedelta(milliseconds=50))


@tool
def raises_huge(key: str) -> str:
    """Raise an ordinary exception with a huge message.

    Args:
        key: Counter key.
    """
    _count(key)
    raise RuntimeError("x" * BIG)


@tool
def raises_huge_application_error(key: str) -> str:
    """Raise a non-retryable ApplicationError with a huge message and huge details.

    Args:
        key: Counter key.
    """
    _count(key)
    raise ApplicationError("y" * BIG, {"blob": "z" * BIG}, non_retryable=True)


@tool(max_output_chars=10 * BIG)
def returns_huge(key: str) -> str:
    """Return more than Temporal's payload limit.

    Args:
        key: Counter key.
    """
    _count(key)
    return "\u0001" * BIG  # escaped in JSON: 6 bytes per character


@tool(heartbeat_timeout=1)
async def long_async(key: str) -> str:
    """Work for longer than the heartbeat timeout without heartbeating.

    Args:
        key: Counter key.
    """
    _count(key)
    await asyncio.sleep(3)
    return "async done"


@tool(heartbeat_timeout=1)
def long_sync(key: str) -> str:
    """Block for longer than the heartbeat timeout without heartbeating.

    Args:
        key: Counter key.
    """
    _count(key)
    time.sleep(3)
    return "sync done"


@tool(heartbeat_timeout=1)
async def resumable(key: str, ctx: ToolContext) -> str:
    """Report progress, outlive a few automatic beats, fail; the retry reads the progress.

    Args:
        key: Counter key.
    """
    if _count(key) == 1:
        ctx.heartbeat({"pages": 3})
        await asyncio.sleep(1.5)  # several automatic beats go out meanwhile
        raise ApplicationError("connection reset", next_retry_delay=timedelta(milliseconds=50))
    return f"resumed from {ctx.progress}"


@tool(heartbeat_timeout=1)
async def resumable_raw(key: str) -> str:
    """Like ``resumable``, but heartbeating through the Temporal SDK directly.

    Args:
        key: Counter key.
    """
    from temporalio import activity

    if _count(key) == 1:
        activity.heartbeat({"rows": 7})
        await asyncio.sleep(1.5)
        raise ApplicationError("connection reset", next_retry_delay=timedelta(milliseconds=50))
    return f"resumed from {list(activity.info().heartbeat_details)}"


HUNG = threading.Event()


@tool
def hangs(key: str) -> str:
    """Block until the test releases it.

    Args:
        key: Counter key.
    """
    _count(key)
    HUNG.wait(60)
    return "released"


def _agent(
    model_server: ScriptedModelServer, name: str, *tools: Any, **model: Any
) -> tuple[Agent, str]:
    spec = scripted_model(model_server, **model)
    return Agent(name=name, instructions="Use the tool.", model=spec, tools=list(tools)), spec.name


def _tool_results(result: Any) -> list[Any]:
    return [m for m in result.transcript if m.role == "tool"]


async def test_a_tool_that_keeps_failing_runs_five_times_then_the_model_reads_an_error(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "flaky", always_flaky)
    model_server.script(model, [call("always_flaky", key=key), text("gave up")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == "gave up"
    assert RUNS[key] == 5
    (message,) = _tool_results(result)
    assert message.is_error
    assert "upstream unavailable" in message.content
    (sent,) = model_server.requests(model)[1].tool_results
    assert message.content in sent


async def test_tools_are_scheduled_with_a_heartbeat_timeout_and_five_attempts_by_default(
    client: Client, model_server: ScriptedModelServer
) -> None:
    @tool
    def plain(n: int) -> int:
        """Echo.

        Args:
            n: A number.
        """
        return n

    agent, model = _agent(model_server, "defaults", plain)
    model_server.script(model, [call("plain", n=1), text("ok")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        await handle.result()
    (scheduled,) = [
        e.activity_task_scheduled_event_attributes
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "plain"
    ]
    assert scheduled.heartbeat_timeout.ToTimedelta() == DEFAULT_TOOL_HEARTBEAT_TIMEOUT
    assert scheduled.retry_policy.maximum_attempts == 5


async def test_a_tool_raising_with_a_3mb_message_runs_once_and_the_model_gets_a_cut_error(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "huge_raise", raises_huge)
    model_server.script(model, [call("raises_huge", key=key), text("noted")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert RUNS[key] == 1
    (message,) = _tool_results(result)
    assert message.is_error
    assert message.content.startswith("Tool 'raises_huge' raised RuntimeError: xxx")
    assert "cut by relaykit" in message.content
    assert len(message.content.encode()) <= MAX_TOOL_ERROR_BYTES


async def test_an_application_error_with_a_3mb_message_and_details_fails_once_with_a_cut_message(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "huge_app_error", raises_huge_application_error)
    model_server.script(model, [call("raises_huge_application_error", key=key), text("noted")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert RUNS[key] == 1
    (message,) = _tool_results(result)
    assert message.is_error
    assert "yyyy" in message.content and "cut by relaykit" in message.content
    assert len(message.content.encode()) < 2 * MAX_TOOL_ERROR_BYTES


async def test_a_result_over_the_payload_limit_runs_once_and_reaches_the_model_cut_with_a_marker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "huge_result", returns_huge)
    model_server.script(model, [call("returns_huge", key=key), text("read it")])
    async with serving(client, agent) as worker:
        # the worker's client: it reads payloads the worker offloaded to its store
        handle = await start_run(worker.client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert result.output == "read it"
    assert RUNS[key] == 1
    (message,) = _tool_results(result)
    assert not message.is_error
    assert message.content.startswith("\u0001\u0001")
    assert "cut by relaykit" in message.content
    # cut below the worker's limit (8 MiB: its payloads offload to the store), once encoded
    assert worker.max_tool_result_bytes == MAX_OFFLOADED_TOOL_RESULT_BYTES
    assert len(message.content) < worker.max_tool_result_bytes // 5


async def test_async_and_sync_tools_heartbeat_on_their_own_while_they_run(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each tool outlives its 1 s heartbeat timeout without heartbeating itself: automatic beats
    # keep the attempt alive, so each runs once.
    key_a, key_s = uuid.uuid4().hex, uuid.uuid4().hex
    agent, model = _agent(model_server, "long_tools", long_async, long_sync)
    model_server.script(
        model,
        [call("long_async", key=key_a), call("long_sync", key=key_s), text("both done")],
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert [m.content for m in _tool_results(result)] == ["async done", "sync done"]
    assert (RUNS[key_a], RUNS[key_s]) == (1, 1)
    kinds = {e.event_type for e in await history_events(handle.workflow)}
    assert EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT not in kinds


async def test_automatic_heartbeats_keep_the_progress_a_tool_reported_for_its_retry(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "resumable_agent", resumable)
    model_server.script(model, [call("resumable", key=key), text("ok")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert RUNS[key] == 2
    assert [m.content for m in _tool_results(result)] == ["resumed from {'pages': 3}"]


async def test_automatic_heartbeats_keep_progress_sent_with_the_sdk_heartbeat_too(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, "resumable_raw_agent", resumable_raw)
    model_server.script(model, [call("resumable_raw", key=key), text("ok")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
    assert RUNS[key] == 2
    assert [m.content for m in _tool_results(result)] == ["resumed from [{'rows': 7}]"]


async def test_hung_sync_tools_do_not_make_unrelated_runs_model_calls_fail(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # More hung sync tools than the default thread pool has threads (min(32, cpus + 4)); the
    # unrelated runs' model calls store their transcripts on that pool, with a 2 s heartbeat
    # timeout. Sync tools run on the worker's own pool, so those runs finish at once.
    import os

    hung_runs = min(32, (os.cpu_count() or 1) + 4) + 2
    key = uuid.uuid4().hex
    blocked, blocked_model = _agent(model_server, "blocked", hangs)
    free_spec = scripted_model(model_server, heartbeat_timeout_seconds=2.0)
    free = Agent(name="free", instructions="Answer.", model=free_spec)
    model_server.script(blocked_model, [call("hangs", key=key)] * hung_runs)
    model_server.script(free_spec.name, [text("fine")] * 3)
    HUNG.clear()
    try:
        async with serving(client, [blocked, free], tool_threads=4) as worker:
            hung = [
                await start_run(client, blocked, "go", task_queue=worker.task_queue)
                for _ in range(hung_runs)
            ]
            deadline = time.monotonic() + 30
            while RUNS[key] < 4 and time.monotonic() < deadline:
                await asyncio.sleep(0.05)
            assert RUNS[key] == 4  # the tool pool is full; the other calls queue for it
            handles = [
                await start_run(client, free, "hi", task_queue=worker.task_queue) for _ in range(3)
            ]
            results = await asyncio.wait_for(
                asyncio.gather(*(h.result() for h in handles)), timeout=30
            )
            assert [r.output for r in results] == ["fine"] * 3
            for h in handles:
                kinds = {e.event_type for e in await history_events(h.workflow)}
                assert EventType.EVENT_TYPE_ACTIVITY_TASK_TIMED_OUT not in kinds
                assert EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED not in kinds
            for h in hung:
                assert (await h.workflow.describe()).status == WorkflowExecutionStatus.RUNNING
                await h.workflow.terminate("test over")
    finally:
        HUNG.set()


async def test_without_external_storage_a_result_is_cut_below_temporals_payload_limit() -> None:
    # A tool activity on a worker whose converter cannot offload large payloads.
    invocation = ToolInvocation(call_id="c1", arguments=json.dumps({"key": uuid.uuid4().hex}))
    outcome = await returns_huge.invoke(invocation)
    assert "cut by relaykit" in outcome.content
    assert len(to_json(outcome.content)) <= MAX_TOOL_RESULT_BYTES
