"""Wedged runs: open runs whose workflow task keeps failing.

A run wedges when the code serving it cannot replay its history (a deploy that changed what a
run had decided) or raises in workflow code. Temporal then retries the workflow task forever;
the run looks "running" or "waiting for approval" in every list, and its queries fail. Temporal
tells it apart only in the run's description (the pending workflow task's attempt count) and in
its history (the first failure of that task). This module reads both, for ``relaykit runs
--stuck``, the mark in ``relaykit runs`` and the refusal of ``relaykit result`` to wait.

The way out (docs/deploy.md): roll the code back, or ``temporal workflow reset`` the run to
before the change.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass

from temporalio.api.enums.v1 import EventType
from temporalio.api.failure.v1 import Failure
from temporalio.api.history.v1 import HistoryEvent
from temporalio.client import Client, WorkflowExecutionDescription
from temporalio.service import RPCError

STUCK_ATTEMPTS = 3
"""A workflow task failing this often is no passing fault (a worker restart costs one)."""


@dataclass
class StuckRun:
    workflow_id: str
    run_id: str
    attempts: int
    cause: str
    """First line of the workflow task's failure."""

    def to_json(self) -> dict[str, object]:
        return {
            "run_id": self.workflow_id,
            "execution": self.run_id,
            "attempts": self.attempts,
            "cause": self.cause,
        }


async def stuck(client: Client, workflow_id: str, run_id: str | None = None) -> StuckRun | None:
    """The run's wedge, or ``None`` when its workflow task is not failing again and again."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    return await stuck_from(client, await handle.describe())


async def stuck_from(client: Client, description: WorkflowExecutionDescription) -> StuckRun | None:
    """:func:`stuck` for a run already described (the history is read only for a wedged run)."""
    workflow_id = description.id
    raw = description.raw_description
    if not raw.HasField("pending_workflow_task"):
        return None
    attempts = raw.pending_workflow_task.attempt
    if attempts < STUCK_ATTEMPTS:
        return None
    execution_run = description.run_id
    return StuckRun(
        workflow_id, execution_run, attempts, await _cause(client, workflow_id, execution_run)
    )


async def _events_backwards(
    client: Client, workflow_id: str, run_id: str
) -> AsyncIterator[HistoryEvent]:
    """The run's history from its newest event back, at most 20 pages: what the callers look
    for (the latest workflow task's outcome) is near the end, and the walk stays bounded."""
    from temporalio.api.common.v1 import WorkflowExecution
    from temporalio.api.workflowservice.v1 import GetWorkflowExecutionHistoryReverseRequest

    token = b""
    for _ in range(20):
        page = await client.workflow_service.get_workflow_execution_history_reverse(
            GetWorkflowExecutionHistoryReverseRequest(
                namespace=client.namespace,
                execution=WorkflowExecution(workflow_id=workflow_id, run_id=run_id),
                maximum_page_size=100,
                next_page_token=token,
            )
        )
        for event in page.history.events:
            yield event
        token = page.next_page_token
        if not token:
            return


async def _cause(client: Client, workflow_id: str, run_id: str) -> str:
    """The last workflow task failure in history (Temporal records the first of a series)."""
    async for event in _events_backwards(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            failure = event.workflow_task_failed_event_attributes.failure
            try:
                message = str(await client.data_converter.decode_failure(failure))
            except Exception:  # noqa: BLE001 - a codec this client lacks
                message = failure.message
            return first_line(message)
    return "workflow task failing (no failure recorded in history yet)"


async def latest_task_failure(client: Client, workflow_id: str, run_id: str) -> Failure | None:
    """The failure of the run's latest workflow task when that task failed; ``None`` when it
    completed or timed out (a worker gone is no wedge) or no task ended yet."""
    ended = (
        EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_TASK_TIMED_OUT,
    )
    async for event in _events_backwards(client, workflow_id, run_id):
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            return event.workflow_task_failed_event_attributes.failure
        if event.event_type in ended:
            return None
    return None


def first_line(failure: str) -> str:
    """The message of a failure as the SDK core words it (``Failure { message: "…" … }``),
    or its first line."""
    found = re.search(r'message: "((?:[^"\\]|\\.)*)"', failure)
    if found:
        return found.group(1)
    return (failure.strip().splitlines() or ["replay failed"])[0]


async def find_stuck(
    client: Client, workflow_ids: Iterable[str], *, concurrency: int = 16
) -> dict[str, StuckRun]:
    """Which of these runs are wedged, described a few at a time."""
    gate = asyncio.Semaphore(concurrency)

    async def one(workflow_id: str) -> StuckRun | None:
        async with gate:
            try:
                return await stuck(client, workflow_id)
            except Exception:  # noqa: BLE001 - a run closing meanwhile is not stuck
                return None

    ids = list(dict.fromkeys(workflow_ids))
    found = await asyncio.gather(*(one(i) for i in ids))
    return {s.workflow_id: s for s in found if s is not None}


# --- the Temporal Python SDK's update ordering ----------------------------------------------------

SDK_ORDERING_SIGNS = (
    "Update machine does not handle this event",
    "but there is no corresponding change command",
    "does not match activity id of activity command",
)
"""The faces of the SDK's ordering fault in a workflow task's failure (docs/deploy.md)."""
_SKIPPED_ACTIVITY = re.compile(
    r"Activity id of scheduled event '([^']+)' does not match activity id of activity command "
    r"'([^']+)'"
)

_COMMAND_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED,
        EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED,
        EventType.EVENT_TYPE_MARKER_RECORDED,
        EventType.EVENT_TYPE_TIMER_STARTED,
        EventType.EVENT_TYPE_TIMER_CANCELED,
        EventType.EVENT_TYPE_UPSERT_WORKFLOW_SEARCH_ATTRIBUTES,
        EventType.EVENT_TYPE_WORKFLOW_PROPERTIES_MODIFIED,
        EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_SIGNAL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
        EventType.EVENT_TYPE_REQUEST_CANCEL_EXTERNAL_WORKFLOW_EXECUTION_INITIATED,
    }
)
_UPDATE_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_COMPLETED,
    }
)


@dataclass
class OrderingReset:
    """Where a run wedged by the SDK's update ordering gets out, and what runs again.

    Live, the worker advanced the run in one activation and accepted an update in a later one
    of the same workflow task, so the task's commands put the acceptance after others; a replay
    applies the update first and fails at that task. A reset to the task's start applies the
    update again, in order. What the run did after that point is discarded and done again:
    ``again`` counts those activities by type, so a person sees which tools (writes among them)
    would run a second time before choosing the reset."""

    event_id: int
    """The task's ``WorkflowTaskStarted`` event: ``temporal workflow reset --event-id``."""
    again: dict[str, int]

    def command(self, workflow_id: str, run_id: str) -> str:
        return (
            f"temporal workflow reset --workflow-id {workflow_id} --run-id {run_id} "
            f"--event-id {self.event_id} --reason '<your name>: SDK update ordering'"
        )

    def summary(self) -> str:
        if not self.again:
            return "no activity after that point"
        done = ", ".join(f"{name} x{count}" for name, count in sorted(self.again.items()))
        return f"the reset discards and makes again: {done}"


def ordering_reset_in(events: Sequence[HistoryEvent], cause: str = "") -> OrderingReset | None:
    """The first workflow task whose commands accept an update after another command (what the
    SDK's ordering fault leaves in history), or ``None``.

    The fault has a third face, which ``cause`` (the task's failure) names: live, the update
    cancelled an activity the run had scheduled in an earlier activation of the same task, so
    the command was never sent and its id is missing from history; a replay applies the update
    first, never schedules that activity, and gives the next one the missing id. The task to
    reset to is the one that accepted an update and scheduled the activity named."""
    reset = _misordered_task(events) or _task_that_skipped(events, cause)
    if reset is None:
        return None
    again: dict[str, int] = {}
    for event in events:
        if event.event_id > reset and event.HasField("activity_task_scheduled_event_attributes"):
            name = event.activity_task_scheduled_event_attributes.activity_type.name
            again[name] = again.get(name, 0) + 1
    return OrderingReset(reset, again)


def _misordered_task(events: Sequence[HistoryEvent]) -> int | None:
    started = 0
    in_commands = command_seen = False
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started, in_commands = event.event_id, False
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            in_commands, command_seen = True, False
        elif in_commands and kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            if command_seen:
                return started
        elif in_commands and kind in _COMMAND_EVENTS:
            command_seen = True
        elif kind not in _UPDATE_EVENTS:
            in_commands = False
    return None


def _task_that_skipped(events: Sequence[HistoryEvent], cause: str) -> int | None:
    found = _SKIPPED_ACTIVITY.search(cause)
    if found is None:
        return None
    scheduled, command = found.groups()
    ids = {
        e.activity_task_scheduled_event_attributes.activity_id
        for e in events
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    if command in ids:  # no id is missing: another change of code, not the dropped command
        return None
    started = 0
    accepted = False
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started, accepted = event.event_id, False
        elif kind == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED:
            accepted = True
        elif event.HasField("activity_task_scheduled_event_attributes"):
            if event.activity_task_scheduled_event_attributes.activity_id == scheduled:
                return started if accepted else None
    return None


async def ordering_reset(
    client: Client, workflow_id: str, run_id: str, cause: str
) -> OrderingReset | None:
    """For a run whose wedge (``cause``) reads as the SDK's ordering fault, where a reset gets
    it out (its history read once); ``None`` for any other wedge, or when the history cannot
    be read (the general way out stands)."""
    if not any(sign in cause for sign in SDK_ORDERING_SIGNS):
        return None
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    try:
        events = [event async for event in handle.fetch_history_events()]
    except RPCError:
        return None
    return ordering_reset_in(events, cause)


WAY_OUT = "roll back the worker's code, or `temporal workflow reset` the run (docs/deploy.md)"


def way_out(workflow_id: str, run_id: str, reset: OrderingReset | None) -> str:
    """What a person does about a wedged run, in one line."""
    if reset is None:
        return WAY_OUT
    return (
        "the Temporal SDK's update ordering, not your code (docs/deploy.md): "
        f"`{reset.command(workflow_id, run_id)}`; {reset.summary()}"
    )
