"""What an open run waits for, said at once, and the wait of ``run --wait``, ``result`` and
``fork --wait``.

A run that waits for a person (an approval, a decision on an unknown outcome, a resume) or for a
worker looks the same from outside as one that works: Temporal's result call just blocks. So
every wait reads the run's description every couple of seconds and says, in one line on stderr,
what the run waits for whenever that changes:

- a person: the calls waiting and the command that answers them, or the pause and ``resume``;
  when this process cannot read the calls (the workers use a codec it lacks), that instead;
- a worker: a workflow task or an activity scheduled and taken by no worker for a few seconds
  (a queue nobody polls, or a worker killed: its task is scheduled again when its timeout
  fires, and then nobody takes it);
- and it ends the wait when the run's workflow task keeps failing (it would never end).

Commands that need the run's worker to answer (``approve``, ``send``, ``steer``, ``pending``)
check the last of these before they act and while they wait for the answer, so a stuck run is
one line with its cause instead of Temporal's "Workflow Task in failed state" after 20 s.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from contextlib import nullcontext
from typing import TypeVar

from temporalio.api.enums.v1 import PendingActivityState, PendingWorkflowTaskState
from temporalio.client import WorkflowExecutionDescription, WorkflowExecutionStatus
from temporalio.service import RPCError

from relaykit.cli.common import _no_worker_message, err_console
from relaykit.client import DEFAULT_TASK_QUEUE, RunHandle, task_queue_last_poll
from relaykit.errors import RelaykitError
from relaykit.run_list import backing_off, model_wait
from relaykit.runs import PendingApproval, RunResult
from relaykit.search_attributes import RELAY_STATUS
from relaykit.stuck import STUCK_ATTEMPTS, first_line, latest_task_failure
from relaykit.tools import summarize_call

T = TypeVar("T")

NO_WORKER_AFTER = 3.0
"""Seconds a scheduled workflow task or activity may wait for a worker before the wait says
that none takes it (a live worker with a free slot takes one within milliseconds)."""

CHECK_EVERY = 2.0
"""Seconds between two readings of the run's description while waiting."""

QUERY_TIMEOUT = 5.0
"""Seconds the run's worker gets to list the calls waiting for a person."""


async def failing_task(
    handle: RunHandle, task_queue: str, *, attempt: int = 2
) -> RelaykitError | None:
    """Why the worker keeps failing the run's workflow task, when its pending ``attempt`` is
    this far and the one before failed. Temporal retries a failed workflow task forever without
    closing the run, so without this a wait would never end, and an update or a query would
    fail after 20 s with "Workflow Task in failed state"."""
    try:
        description = await handle.workflow.describe()
    except RPCError:
        return None
    raw = description.raw_description
    if not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < attempt:
        return None
    try:
        failure = await latest_task_failure(handle.client, handle.id, description.run_id)
    except RPCError:
        return None
    if failure is None:  # the latest task timed out (a worker gone), or a later one completed
        return None
    attempts = raw.pending_workflow_task.attempt - 1
    hint = (
        "roll back the worker's code or serve the run's agents on that queue, or `temporal "
        f"workflow reset` the run (docs/deploy.md); `relaykit terminate {handle.id}` ends it"
    )
    try:
        message = str(await handle.client.data_converter.decode_failure(failure))
    except Exception:  # noqa: BLE001 - a codec may raise anything
        if failure.HasField("encoded_attributes"):  # the worker's failure converter encoded it
            encoding = failure.encoded_attributes.metadata.get("encoding", b"").decode(
                errors="replace"
            )
            return RelaykitError(
                f"the worker on task queue {task_queue!r} cannot run {handle.id}, and its error "
                f"is encoded as {encoding!r} with a codec or key this command lacks: the worker "
                "and this command use different codecs or keys",
                hint="give both the same RELAYKIT_CODEC and key; the worker keeps retrying; "
                f"`relaykit terminate {handle.id}` ends the run",
            )
        message = failure.message
    return RelaykitError(
        f"run {handle.id} is stuck: the worker on task queue {task_queue!r} fails it on every "
        f"attempt ({attempts} so far): {first_line(message)}",
        hint=hint,
    )


async def unless_stuck(handle: RunHandle, task_queue: str, answer: Awaitable[T]) -> T:
    """``answer`` (an update or a query the run's worker must handle), ended early with the
    cause when the run's workflow task fails instead, as often as ``relaykit runs --stuck``
    counts stuck (a rolling deploy's old worker may fail a task once that a new one completes),
    and on Temporal's own "failed state" error."""
    task = asyncio.ensure_future(answer)
    try:
        while True:
            await asyncio.wait({task}, timeout=1.0)
            if task.done():
                break
            failing = await failing_task(handle, task_queue, attempt=STUCK_ATTEMPTS)
            if failing is not None:
                raise failing
        try:
            return task.result()
        except Exception:
            failing = await failing_task(handle, task_queue)
            if failing is not None:
                raise failing from None
            raise
    finally:
        if not task.done():
            task.cancel()


def _approval_text(run_id: str, approvals: list[PendingApproval]) -> str:
    def one(item: PendingApproval) -> str:
        why = f" ({item.reason})" if item.reason else ""
        return f"{summarize_call(item.tool, item.arguments, 80)} [call {item.call_id}]{why}"

    unknown = any(item.reason and item.reason.startswith("outcome unknown") for item in approvals)
    what = "a person's decision" if unknown else "approval"
    calls = "; ".join(one(item) for item in approvals)
    call_id = approvals[0].call_id if len(approvals) == 1 else "CALL_ID"
    return (
        f"run {run_id} waits for {what}: {calls}; answer with `relaykit approve {run_id} "
        f"{call_id}` (or --reject)"
    )


class WaitWatch:
    """Reads what one open run waits for; :meth:`check` is called every :data:`CHECK_EVERY`."""

    def __init__(self, handle: RunHandle, task_queue: str) -> None:
        self.handle = handle
        self.task_queue = task_queue
        self._scheduled: dict[tuple[str, int], float] = {}
        """Each task seen scheduled and not taken → when it was first seen so."""
        self._asked: tuple[tuple[str | None, int], str | None] | None = None
        """What the run said it waits for, at which status and history length: a run whose
        history has not grown waits for the same thing, and is not asked again."""

    async def check(self) -> str | None:
        """One line on what the run waits for now (``None``: nothing to say); raises when its
        workflow task keeps failing."""
        try:
            description = await self.handle.workflow.describe()
        except RPCError:
            return None
        if description.status != WorkflowExecutionStatus.RUNNING:
            return None
        failing = await failing_task(self.handle, self.task_queue)
        if failing is not None:
            raise failing
        if self._untaken_for(description) >= NO_WORKER_AFTER:
            try:
                last_poll = await task_queue_last_poll(self.handle.client, self.task_queue)
            except RPCError:
                last_poll = None
            return _no_worker_message(self.task_queue, last_poll)
        return await self._person(description)

    def _untaken_for(self, description: WorkflowExecutionDescription) -> float:
        """How long the oldest task of the run has waited, scheduled, for a worker to take it."""
        raw = description.raw_description
        waiting: list[tuple[str, int]] = []
        if (
            raw.HasField("pending_workflow_task")
            and raw.pending_workflow_task.state
            == PendingWorkflowTaskState.PENDING_WORKFLOW_TASK_STATE_SCHEDULED
        ):
            waiting.append(("workflow task", 0))
        now = time.time()
        for activity in raw.pending_activities:
            if activity.state == PendingActivityState.PENDING_ACTIVITY_STATE_SCHEDULED and not (
                backing_off(activity, now)
            ):
                waiting.append((activity.activity_id, activity.attempt))
        seen = time.monotonic()
        self._scheduled = {key: self._scheduled.get(key, seen) for key in waiting}
        return max((seen - first for first in self._scheduled.values()), default=0.0)

    async def _person(self, description: WorkflowExecutionDescription) -> str | None:
        key = (description.typed_search_attributes.get(RELAY_STATUS), description.history_length)
        if self._asked is not None and self._asked[0] == key:
            return self._asked[1]
        line = await self._ask(key[0])
        if line is not None or key[0] not in (None, "waiting_approval"):  # not a slow worker
            self._asked = (key, line)
        return line

    async def _ask(self, status: str | None) -> str | None:
        run_id = self.handle.id
        if status is None:  # relaykit's search attributes not registered: ask the run
            try:
                status = (await asyncio.wait_for(self.handle.state(), QUERY_TIMEOUT)).status
            except Exception as exc:  # noqa: BLE001 - a codec this process lacks, no worker
                return _unreadable(exc, f"this command cannot read run {run_id}'s state")
        if status == "paused":
            return f"run {run_id} is paused: `relaykit resume {run_id}` continues it"
        if status != "waiting_approval":
            return None
        try:
            approvals = await asyncio.wait_for(
                self.handle.pending_approvals(), timeout=QUERY_TIMEOUT
            )
        except Exception as exc:  # noqa: BLE001 - a codec this process lacks, no worker
            return _unreadable(
                exc, f"run {run_id} waits for approval, and this command cannot read which calls"
            )
        if not approvals:
            return f"run {run_id} waits for approval: `relaykit pending {run_id}` lists the calls"
        return _approval_text(run_id, approvals)


def _unreadable(exc: BaseException, said: str) -> str | None:
    from relaykit.codec import describe_decode_error

    unreadable = describe_decode_error(exc)
    if unreadable is None:
        return None  # a slow worker: say nothing rather than guess
    return f"{said}: {unreadable}"


async def _status_line(handle: RunHandle) -> str | None:
    """One line: agent, turn, and the activities in progress with how long they have run."""
    try:
        state = await asyncio.wait_for(handle.state(), timeout=2.0)
        description = await asyncio.wait_for(handle.workflow.describe(), timeout=2.0)
    except Exception:  # noqa: BLE001 - a slow or absent worker: keep the last line
        return None
    if state.status == "waiting_approval":
        status = f" · waiting for approval (relaykit pending {handle.id})"
    else:
        status = "" if state.status == "running" else f" · {state.status}"
    waiting = await model_wait(handle.client, description)
    status += f" · {waiting}" if waiting else ""
    return f"{state.agent} · turn {state.turn}{status}{_activity_line(description)}"


def _activity_line(description: WorkflowExecutionDescription) -> str:
    pending = list(description.raw_description.pending_activities)
    if not pending:
        return ""
    now = time.time()
    parts = []
    for activity in pending:
        since = (
            activity.last_started_time
            if activity.HasField("last_started_time")
            else (activity.scheduled_time)
        )
        seconds = max(0, int(now - since.ToSeconds())) if since.seconds else 0
        parts.append(f"{activity.activity_type.name} {seconds}s")
    return " · " + ", ".join(parts)


def _say(line: str) -> None:
    from rich.markup import escape

    warning = "[yellow]warning:[/yellow] " if line.startswith("no worker polls") else ""
    err_console.print(f"{warning}{escape(line)}", highlight=False)


async def wait_for_result(handle: RunHandle, task_queue: str) -> RunResult:
    """Wait for the run's result, saying at once and at every change what it waits for. On a
    terminal a live status line also says what it does. Ctrl-C stops the waiting, not the run,
    and says so with the run's id."""
    result_task = asyncio.ensure_future(handle.result())
    live = err_console.is_terminal
    watch = WaitWatch(handle, task_queue)
    said: str | None = None
    checked = -CHECK_EVERY
    status = err_console.status("waiting for the run to start…") if live else nullcontext()
    try:
        with status:
            while not result_task.done():
                if time.monotonic() - checked >= CHECK_EVERY:
                    checked = time.monotonic()
                    line = await watch.check()
                    if line is not None and line != said:
                        _say(line)
                    said = line
                if live:
                    current = await _status_line(handle)
                    if current is not None and hasattr(status, "update"):
                        status.update(current)
                await asyncio.wait({result_task}, timeout=1.0)
    except asyncio.CancelledError:  # Ctrl-C: only this command stops
        err_console.print(
            f"stopped waiting; run {handle.id} goes on (`relaykit result {handle.id}` waits "
            f"for it again, `relaykit cancel {handle.id}` stops it)",
            highlight=False,
        )
        raise
    finally:
        if not result_task.done():
            result_task.cancel()
    return result_task.result()


async def refuse_if_stuck(handle: RunHandle, description: WorkflowExecutionDescription) -> None:
    """Raise the cause at once when the run's workflow task keeps failing (as ``relaykit runs
    --stuck`` counts it): the worker could not take an update or answer a query."""
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    failing = await failing_task(handle, queue, attempt=STUCK_ATTEMPTS)
    if failing is not None:
        raise failing
