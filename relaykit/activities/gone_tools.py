"""Calls of tools this worker does not define: answered at once, as results the model reads.

A run whose call of ``lookup`` was scheduled by a worker that defined it can be taken over by a
worker whose code renamed or removed the tool (a deploy). Temporal would offer the activity to
the new worker, which has no such activity type, and retry it by the call's policy (minutes, and
forever with an unbounded policy). Instead, the worker's dynamic activity answers every tool call
it has no tool for: an error result saying the tool is gone, or, for a ``"write"`` call whose
earlier attempt was lost after it started, the unknown outcome that call really has.

Only calls a relaykit run scheduled are answered so: the activity's info names the workflow type
that scheduled it (a public field of every activity task), and relaykit's runs are all
``AgentRun``. An activity of another application that shares the task queue (or of a workflow
the user registered next to relaykit's) is not relaykit's to answer: it fails as a worker without
that type would fail it, retryably, so a retry reaches a worker that has it. Activity types of
relaykit itself (``relaykit.*``) and of MCP (``mcp:*``) are not tools of the agents' code: those
still fail as not registered.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from relaykit.activities.attempts import AttemptGuard
from relaykit.runs import AGENT_RUN_WORKFLOW
from relaykit.tools import ToolOutcome

RELAYKIT_TYPES = ("relaykit.", "mcp:")


def gone_text(name: str) -> str:
    return (
        f"Tool {name!r} is not defined by the code this worker runs now (it was renamed or "
        "removed after the call was made), so the call was not run. Do not call it again."
    )


def is_tool_type(kind: str) -> bool:
    return not kind.startswith(RELAYKIT_TYPES)


def not_registered(kind: str) -> ApplicationError:
    """The failure of an activity type this worker does not serve, as the SDK words it for a
    worker without a dynamic activity (retryable: another worker on the queue may have it)."""
    info = activity.info()
    return ApplicationError(
        f"Activity function {kind} for workflow {info.workflow_id} is not registered on this "
        f"worker (a relaykit worker; the activity was scheduled by workflow type "
        f"{info.workflow_type!r}, not by a relaykit run)",
        type="NotFoundError",
    )


async def answer_gone(kind: str, args: Sequence[RawValue]) -> Any:
    """The outcome of a call of tool ``kind``, which this worker does not define."""
    if activity.info().workflow_type != AGENT_RUN_WORKFLOW:  # not relaykit's call
        activity.logger.info("activity %s is not relaykit's: left to its own workers", kind)
        raise not_registered(kind)
    if not is_tool_type(kind) or not args:
        raise ApplicationError(
            f"activity type {kind!r} is not registered on this worker",
            type="NotFoundError",
            non_retryable=True,
        )
    try:
        sent = activity.payload_converter().from_payload(args[0].payload, dict)
    except Exception:  # noqa: BLE001 - not a tool call's input: nothing more to learn from it
        sent = {}
    effect = sent.get("effect") if isinstance(sent, dict) else None
    await AttemptGuard.check(effect, f"tool {kind!r}")  # a lost "write": its outcome is unknown
    activity.logger.warning("tool %s is not defined on this worker: answered as gone", kind)
    return ToolOutcome(content=gone_text(kind), is_error=True).model_dump(mode="json")


@activity.defn(dynamic=True)
async def gone_tool(args: Sequence[RawValue]) -> Any:
    return await answer_gone(activity.info().activity_type, args)
