"""The console's actions, with the CLI's semantics and the person's name as ``by``.

Each action checks what the CLI checks before anything changes (the run exists and is open,
a worker serves it when the run itself must accept the action, the run is not stuck), then
calls the same client method the CLI calls, and says what happened in the CLI's words.
Approvals go through :func:`relaykit.inbox.decide`, the inbox's own path.

Every outcome is defined: :class:`ActionError` carries an HTTP status a page or a client can act
on (400 bad input, 404 unknown run or call, 409 closed run or answered call, 503 no worker).
"""

from __future__ import annotations

from dataclasses import dataclass

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowUpdateFailedError
from temporalio.service import RPCError, RPCStatusCode

from relaykit.client import DEFAULT_TASK_QUEUE, RunHandle, get_run, task_queue_has_worker
from relaykit.errors import RelaykitError
from relaykit.inbox.pending import DecideError, decide
from relaykit.pricing import format_usd

ACTIONS = ("approve", "reject", "steer", "send", "pause", "resume", "fork", "cancel", "budget")
TEXT_LIMIT = 20_000


class ActionError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


@dataclass
class Done:
    message: str
    """What happened, in the CLI's words."""
    run_id: str
    """The run to show next (a fork's new run)."""


def _text(value: str | None, what: str, *, required: bool) -> str | None:
    value = (value or "").strip() or None
    if value is None and required:
        raise ActionError(400, f"{what} is empty")
    if value is not None and (len(value) > TEXT_LIMIT or "\x00" in value):
        raise ActionError(400, f"{what} is too long or holds a NUL character")
    return value


async def _open(client: Client, run_id: str, *, served: bool) -> RunHandle:
    handle = get_run(client, run_id)
    try:
        description = await handle.workflow.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise ActionError(404, f"no run with id {run_id!r}") from None
        raise
    if description.status != WorkflowExecutionStatus.RUNNING:
        word = (description.status.name.lower() if description.status else "closed").replace(
            "canceled", "cancelled"
        )
        raise ActionError(409, f"run {run_id!r} is closed ({word})")
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if served:
        try:
            has_worker = await task_queue_has_worker(client, queue)
        except RPCError:  # no permission to describe queues: try anyway
            has_worker = True
        if not has_worker:
            raise ActionError(503, f"no worker polls task queue {queue!r}: run {run_id!r} waits")
        from relaykit.cli.waiting import refuse_if_stuck

        try:
            await refuse_if_stuck(handle, description)
        except RelaykitError as exc:
            raise ActionError(503, str(exc)) from None
    return handle


async def act(client: Client, run_id: str, action: str, fields: dict[str, str], by: str) -> Done:
    """Take ``action`` on ``run_id`` as ``by``; ``fields`` are the form's (text, reason,
    call_id, turn, amount)."""
    if action in ("approve", "reject"):
        call_id = _text(fields.get("call_id"), "call id", required=True) or ""
        reason = _text(fields.get("reason"), "reason", required=False)
        try:
            done = await decide(
                client, run_id, call_id, approve=action == "approve", reason=reason, by=by
            )
        except DecideError as exc:
            status = {"not_found": 404, "conflict": 409, "unavailable": 503}[exc.problem]
            raise ActionError(status, exc.message) from None
        because = f": {done.reason}" if done.reason else ""
        verb = "approved" if done.approved else "rejected"
        return Done(f"{verb} {done.tool} ({done.call_id}) in {run_id}{because}", run_id)
    if action == "fork":
        return await _fork(client, run_id, fields, by)
    if action not in ACTIONS:
        raise ActionError(400, f"unknown action {action!r}")
    handle = await _open(client, run_id, served=action in ("steer", "send", "budget"))
    try:
        return Done(await _on_open_run(handle, action, fields, by), run_id)
    except WorkflowUpdateFailedError as exc:
        raise ActionError(409, f"the run refused: {getattr(exc.cause, 'message', exc)}") from None


async def _on_open_run(handle: RunHandle, action: str, fields: dict[str, str], by: str) -> str:
    if action == "steer":
        text = _text(fields.get("text"), "message", required=True) or ""
        if await handle.steer(text, by=by):
            return "steered: the model call in flight was cancelled; the next one has your message"
        return "queued: no turn's model call in flight, the next one has your message"
    if action == "send":
        text = _text(fields.get("text"), "message", required=True) or ""
        await handle.send_message(text, by=by)
        return "queued: the next turn has your message"
    if action == "pause":
        await handle.pause(by=by)
        return "pause requested: the run pauses at its next turn boundary"
    if action == "resume":
        await handle.resume(_text(fields.get("text"), "message", required=False), by=by)
        return "resumed"
    if action == "cancel":
        await handle.cancel(by=by)
        return "cancel requested: the run stops at its next step"
    amount = _amount(fields.get("amount"))
    view = await handle.set_budget(raise_by=amount, by=by)
    return f"budget raised by {format_usd(amount)}: spent {format_usd(view.spent)} of " + (
        f"{format_usd(view.limit)}"
    )


def _amount(value: str | None) -> float:
    try:
        amount = float((value or "").strip())
    except ValueError:
        raise ActionError(400, f"not an amount of dollars: {value!r}") from None
    if not 0 < amount < 1e9:
        raise ActionError(400, f"raise the budget by a positive amount, not {amount:g}")
    return amount


async def _fork(client: Client, run_id: str, fields: dict[str, str], by: str) -> Done:
    from relaykit.fork import ForkError, fork_run

    turn_text = (fields.get("turn") or "").strip()
    if not turn_text.isdigit():
        raise ActionError(400, f"fork at a turn number, not {turn_text!r}")
    text = _text(fields.get("text"), "input", required=False)
    try:
        forked = await fork_run(client, run_id, int(turn_text), input=text, by=by)
    except ForkError as exc:
        raise ActionError(400, str(exc)) from None
    return Done(f"forked {run_id} at turn {turn_text} as {forked.id}", forked.id)
