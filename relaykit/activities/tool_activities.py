"""Tool activities: one activity type per tool, named after the tool, so the Temporal UI
history reads like the run (``search_web``, not ``run_tool``).

Ordinary exceptions raised by a tool become an error result for the model (the run goes on);
``ApplicationError`` and cancellation go through Temporal (retries, cancellation) untouched.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from relaykit.handoff import Handoff, HandoffArgs, HandoffCallbackInput
from relaykit.tools import Tool, ToolInvocation, ToolOutcome


def tool_activity(tool: Tool) -> Callable[..., Any]:
    """The activity that runs ``tool`` for one call."""

    async def run_tool(invocation: ToolInvocation) -> ToolOutcome:
        try:
            return await tool.invoke(invocation)
        except ApplicationError:
            raise
        except Exception as exc:  # noqa: BLE001 - the model decides what to do about it
            activity.logger.info("tool %s raised %s", tool.name, type(exc).__name__)
            return ToolOutcome(
                content=f"Tool {tool.name!r} raised {type(exc).__name__}: {exc}", is_error=True
            )

    run_tool.__name__ = f"tool_{tool.name}"
    return activity.defn(name=tool.name)(run_tool)


def handoff_activity(handoff: Handoff) -> Callable[..., Any]:
    """The activity that runs ``on_handoff`` (named after the handoff tool)."""
    callback = handoff.on_handoff
    assert callback is not None

    async def run_callback(data: HandoffCallbackInput) -> dict[str, str]:
        # The result is what the Temporal UI shows for this activity (None would show as an
        # opaque binary/null payload); the workflow ignores it, so old histories whose result
        # is None replay unchanged.
        args = HandoffArgs(reason=data.reason)
        try:
            if inspect.iscoroutinefunction(callback):
                await callback(args, data)
            else:  # a blocking audit write must not stall the worker's event loop
                await asyncio.to_thread(callback, args, data)
        except ApplicationError:
            raise
        except Exception as exc:  # a bug in the callback will not fix itself on retry
            raise ApplicationError(
                f"on_handoff raised {type(exc).__name__}: {exc}", non_retryable=True
            ) from exc
        return {"handoff": f"{data.source} → {data.target}"}

    run_callback.__name__ = f"on_{handoff.tool_name}"
    return activity.defn(name=handoff.tool_name)(run_callback)
