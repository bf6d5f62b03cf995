"""Tool activities: one activity type per tool, named after the tool, so the Temporal UI
history reads like the run (``search_web``, not ``run_tool``).

Ordinary exceptions raised by a tool become an error result for the model (the run goes on);
``ApplicationError`` and cancellation go through Temporal (retries, cancellation), with messages
and details cut below Temporal's payload limit: an oversized failure could not be recorded, so
every attempt would fail after the tool had already done its work.

A ``"write"`` tool's attempt first records that it starts, and does not run the tool when an
earlier attempt was lost after starting it (:mod:`relaykit.activities.attempts`). While the tool
runs, the attempt heartbeats on its own, repeating the last progress the tool reported
(:mod:`relaykit.activities.heartbeats`), so a retry after a crash still finds that progress.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from relaykit.activities.attempts import AttemptGuard
from relaykit.activities.heartbeats import AttemptBeats, attempt_beats
from relaykit.handoff import Handoff, HandoffArgs, HandoffCallbackInput
from relaykit.tools import (
    MAX_TOOL_ERROR_BYTES,
    MAX_TOOL_RESULT_BYTES,
    Tool,
    ToolContext,
    ToolInvocation,
    ToolOutcome,
    cut_to_bytes,
)


def tool_activity(
    tool: Tool,
    executor: concurrent.futures.Executor | None = None,
    max_result_bytes: int = MAX_TOOL_RESULT_BYTES,
) -> Callable[..., Any]:
    """The activity that runs ``tool`` for one call (a sync tool on ``executor``), its result
    cut to ``max_result_bytes`` once encoded."""

    async def run_tool(invocation: ToolInvocation) -> ToolOutcome:
        # The effect the workflow recorded for this call, not today's code: None for calls
        # scheduled before tools had effects (they run as they always did).
        guard = await AttemptGuard.begin(invocation.effect, f"tool {tool.name!r}", user_code=True)
        beats = attempt_beats()
        context = tool_context(tool, invocation, beats) if tool.context_param else None
        try:
            async with beats.automatic():
                return await tool.invoke(invocation, executor, max_result_bytes, context)
        except ApplicationError as exc:
            if not exc.non_retryable:  # a known failure: the next attempt may run the tool
                await guard.raised()
            raise bounded_application_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - the model decides what to do about it
            activity.logger.info("tool %s raised %s", tool.name, type(exc).__name__)
            return ToolOutcome(
                content=error_text(f"Tool {tool.name!r} raised {type(exc).__name__}: ", exc),
                is_error=True,
            )

    run_tool.__name__ = f"tool_{tool.name}"
    return activity.defn(name=tool.name)(run_tool)


def tool_context(tool: Tool, invocation: ToolInvocation, beats: AttemptBeats) -> ToolContext:
    """What the tool learns about its call; its :meth:`ToolContext.heartbeat` goes through the
    attempt's heartbeats, from the worker's loop even when a sync tool calls it from a thread
    (the SDK's heartbeat must run there)."""
    info = activity.info()
    loop = asyncio.get_running_loop()
    context = contextvars.copy_context()

    def beat(value: Any) -> None:
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:
            beats.beat(value)
        else:
            loop.call_soon_threadsafe(context.run, beats.beat, value)

    ctx = ToolContext(
        call_id=invocation.call_id,
        tool_name=tool.name,
        agent=invocation.agent,
        workflow_id=invocation.workflow_id or info.workflow_id or "",
        run_path=invocation.run_path,
        attempt=info.attempt,
        progress=beats.progress[0] if beats.progress else None,
        idempotency_key=invocation.idempotency_key,
    )
    ctx._beat = beat
    return ctx


def error_text(prefix: str, exc: BaseException) -> str:
    """``prefix`` + the exception's message, cut below :data:`MAX_TOOL_ERROR_BYTES`."""
    try:
        message = str(exc)
    except Exception:  # noqa: BLE001 - a broken __str__ still gives the model something
        message = f"<{type(exc).__name__} whose message could not be read>"
    return cut_to_bytes(prefix + message, MAX_TOOL_ERROR_BYTES)


def bounded_application_error(exc: ApplicationError) -> ApplicationError:
    """``exc`` when it fits a Temporal payload; else a copy with its message cut, details too
    large replaced by a note, and its cause chain folded into the message."""
    message = cut_to_bytes(exc.message, MAX_TOOL_ERROR_BYTES)
    details = exc.details
    try:
        encoded = sum(len(p.data) for p in activity.payload_converter().to_payloads(details))
    except Exception:  # noqa: BLE001 - details that cannot be encoded would fail the attempt too
        encoded = MAX_TOOL_ERROR_BYTES + 1
    if encoded > MAX_TOOL_ERROR_BYTES:
        details = (
            f"[details dropped by relaykit: {encoded} bytes encoded, over {MAX_TOOL_ERROR_BYTES}]",
        )
    cause = exc.__cause__
    if cause is not None:
        message = cut_to_bytes(
            f"{message} (caused by {type(cause).__name__}: "
            + error_text("", cause)[: MAX_TOOL_ERROR_BYTES // 8]
            + ")",
            MAX_TOOL_ERROR_BYTES,
        )
    if message == exc.message and details is exc.details and cause is None:
        return exc
    return ApplicationError(
        message,
        *details,
        type=exc.type,
        non_retryable=exc.non_retryable,
        next_retry_delay=exc.next_retry_delay,
        category=exc.category,
    )


def handoff_activity(
    handoff: Handoff,
    executor: concurrent.futures.Executor | None = None,
    *,
    name: str | None = None,
) -> Callable[..., Any]:
    """The activity that runs ``on_handoff``, named after the handoff tool (``name``: another
    name of it, e.g. the one runs started before lovia's names use).

    The callback is user code with side effects, guarded like a tool of its declared effect
    (``Handoff.effect``, a ``"write"`` by default): the attempt records that it starts it, beats
    while it runs, and does not start it again after an attempt lost while it ran
    (:class:`AttemptGuard`); inputs recorded before callbacks had effects run as before."""
    callback = handoff.on_handoff
    assert callback is not None

    async def run_callback(data: HandoffCallbackInput) -> dict[str, str]:
        # The result is what the Temporal UI shows for this activity (None would show as an
        # opaque binary/null payload); the workflow ignores it, so old histories whose result
        # is None replay unchanged.
        args = HandoffArgs(reason=data.reason)
        guard = await AttemptGuard.begin(
            data.effect, f"on_handoff {data.source} → {data.target}", user_code=True
        )
        try:
            async with attempt_beats().automatic():
                if inspect.iscoroutinefunction(callback):
                    await callback(args, data)
                else:  # a blocking audit write must not stall the worker's event loop
                    await asyncio.get_running_loop().run_in_executor(
                        executor, functools.partial(callback, args, data)
                    )
        except ApplicationError as exc:
            if not exc.non_retryable:  # a known failure: the next attempt may run the callback
                await guard.raised()
            raise bounded_application_error(exc) from None
        except Exception as exc:  # noqa: BLE001 - a bug in the callback will not fix itself on retry
            raise ApplicationError(
                error_text(f"on_handoff raised {type(exc).__name__}: ", exc), non_retryable=True
            ) from None
        return {"handoff": f"{data.source} → {data.target}"}

    activity_name = name or handoff.tool_name
    run_callback.__name__ = f"on_{activity_name}"
    return activity.defn(name=activity_name)(run_callback)
