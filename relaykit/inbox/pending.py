"""Finding and deciding the approvals a namespace waits for.

Finding never queries every run: one visibility list (``RelayStatus = 'waiting_approval' AND
ExecutionStatus = 'Running'`` on root runs, the same filter as ``relaykit runs --status
waiting_approval --roots``) names the runs that wait, and only those answer a
``pending_approvals`` query. Child runs are left out of the list because a call waiting inside
an agent-as-tool child is already in its root run's pending approvals (with the child's run
path), and an answer sent to the root is forwarded to the child: so each call is listed once,
under the run a person started, and decided there.

A run whose worker does not answer in time, or whose payloads this process cannot decode, is not
silently dropped: it is named in :attr:`InboxListing.unreadable` with why.

Deciding classifies every outcome before anything changes, so the API can answer with a status
code a client can act on: an unknown run or call is ``not_found``, a call answered already or a
closed run is ``conflict``, a run no worker serves is ``unavailable``.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from datetime import UTC, datetime
from typing import Any, Literal
from urllib.parse import quote

from pydantic import BaseModel, Field
from temporalio.client import (
    Client,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.service import RPCError, RPCStatusCode

from relaykit.bulk_approvals import BulkAnswer, answer_waiting, waiting_runs_query
from relaykit.client import DEFAULT_TASK_QUEUE, get_run, task_queue_has_worker
from relaykit.runs import PendingApproval, RunEvent
from relaykit.search_attributes import eval_registered

QUERY_TIMEOUT = 5.0
"""Seconds a waiting run's worker gets to answer its ``pending_approvals`` query."""

QUERY_CONCURRENCY = 48
"""Runs queried at once: hundreds of waiting runs list in seconds, and workers answer queries
from their cache of runs (no replay) when they have them."""

DEFAULT_LIMIT = 2000
"""Waiting runs listed at most (the oldest waits are shown first)."""


def ui_url(workflow_id: str, namespace: str) -> str:
    """The run's page in the Temporal UI (``RELAYKIT_UI_URL``, default the dev server's)."""
    from relaykit.devserver import DEFAULT_UI_URL

    base = (os.environ.get("RELAYKIT_UI_URL") or DEFAULT_UI_URL).rstrip("/")
    return f"{base}/namespaces/{quote(namespace, safe='')}/workflows/{quote(workflow_id, safe='')}"


class InboxItem(BaseModel):
    """One tool call waiting for a person (an item of ``GET /api/pending``)."""

    run_id: str
    """The root run to decide it on (the run a person started)."""
    call_id: str
    agent: str
    """The agent that asked for the call."""
    run_path: list[str] = Field(default_factory=list)
    """From the root run's agent to the agent that asked (longer for a child run's call)."""
    tool: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    """The model's arguments, decoded (with the configured codec) and parsed."""
    reason: str | None = None
    """Why a person is asked, when the run says (e.g. a call whose outcome is unknown)."""
    requested_at: str | None = None
    """When the run asked, ISO 8601 in UTC."""
    turn: int = 0
    owner_run_id: str | None = None
    """The run that owns the call (a child's id for a call inside an agent-as-tool)."""
    ui_url: str = ""


class UnreadableRun(BaseModel):
    run_id: str
    why: str


class BudgetWait(BaseModel):
    """A root run waiting at its dollar limit for a person (``relaykit budget RUN ...``)."""

    run_id: str
    spent: float | None = None
    limit: float | None = None
    ui_url: str = ""


class InboxListing(BaseModel):
    items: list[InboxItem] = Field(default_factory=list)
    budgets: list[BudgetWait] = Field(default_factory=list)
    """Runs waiting at their dollar limit (``budget_reached``)."""
    unreadable: list[UnreadableRun] = Field(default_factory=list)
    """Waiting runs whose approvals could not be read (no worker answered, another codec key)."""
    runs: int = 0
    """How many runs the visibility list named."""


def _arguments(raw: str) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (TypeError, ValueError):
        return {"_raw": raw}
    return value if isinstance(value, dict) else {"_value": value}


def _iso_utc(at: datetime | None) -> str | None:
    if at is None:
        return None
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


def item_from(run_id: str, pending: PendingApproval, namespace: str) -> InboxItem:
    return InboxItem(
        run_id=run_id,
        call_id=pending.call_id,
        agent=pending.agent,
        run_path=list(pending.run_path),
        tool=pending.tool,
        arguments=_arguments(pending.arguments),
        reason=getattr(pending, "reason", None),
        requested_at=_iso_utc(pending.requested_at),
        turn=pending.turn,
        owner_run_id=pending.workflow_id or run_id,
        ui_url=ui_url(run_id, namespace),
    )


def _why(exc: BaseException) -> str:
    from relaykit.codec import describe_decode_error

    decode = describe_decode_error(exc)
    if decode is not None:
        return str(decode)
    if isinstance(exc, asyncio.TimeoutError):
        return f"no worker answered within {QUERY_TIMEOUT:g} s"
    if isinstance(exc, RPCError):
        return f"Temporal: {exc.message}"
    return f"{type(exc).__name__}: {exc}"


async def _served(client: Client, task_queue: str) -> bool:
    try:
        return await task_queue_has_worker(client, task_queue or DEFAULT_TASK_QUEUE)
    except RPCError:  # no permission to describe queues: query and see
        return True


async def list_pending(
    client: Client, *, limit: int = DEFAULT_LIMIT, hidden: set[tuple[str, str]] | None = None
) -> InboxListing:
    """Every call waiting for a person in the client's namespace, oldest request first.

    ``hidden`` holds ``(run_id, call_id)`` pairs decided moments ago: a run may still list a
    call for a moment after the answer was accepted.
    """
    queues: dict[str, str] = {}
    query = waiting_runs_query(exclude_evals=await eval_registered(client))
    async for execution in client.list_workflows(query, limit=limit):
        queues[execution.id] = execution.task_queue
    listing = InboxListing(runs=len(queues))
    # A query to a run nobody serves would only time out: ask each task queue once instead.
    served = dict(
        zip(
            distinct := sorted(set(queues.values())),
            await asyncio.gather(*(_served(client, queue) for queue in distinct)),
            strict=True,
        )
    )
    run_ids = []
    for run_id, queue in queues.items():
        if served[queue]:
            run_ids.append(run_id)
        else:
            listing.unreadable.append(
                UnreadableRun(run_id=run_id, why=f"no worker polls task queue {queue!r}")
            )
    gate = asyncio.Semaphore(QUERY_CONCURRENCY)

    async def read(run_id: str) -> list[InboxItem]:
        async with gate:
            try:
                approvals = await asyncio.wait_for(
                    get_run(client, run_id).pending_approvals(), timeout=QUERY_TIMEOUT
                )
            except Exception as exc:  # noqa: BLE001 - named in the listing, never fatal
                listing.unreadable.append(UnreadableRun(run_id=run_id, why=_why(exc)))
                return []
        return [item_from(run_id, pending, client.namespace) for pending in approvals]

    listing.budgets = await _budget_waits(client, limit)
    for items in await asyncio.gather(*(read(run_id) for run_id in run_ids)):
        listing.items.extend(
            item for item in items if not hidden or (item.run_id, item.call_id) not in hidden
        )
    listing.items.sort(key=lambda item: (item.requested_at or "", item.run_id, item.call_id))
    return listing


async def _budget_waits(client: Client, limit: int) -> list[BudgetWait]:
    """The root runs at their dollar limit, with what they spent (when their worker answers)."""
    query = waiting_runs_query(exclude_evals=await eval_registered(client)).replace(
        "'waiting_approval'", "'budget_reached'"
    )
    waits = [
        BudgetWait(run_id=execution.id, ui_url=ui_url(execution.id, client.namespace))
        async for execution in client.list_workflows(query, limit=limit)
    ]

    async def read(wait: BudgetWait) -> None:
        try:
            snapshot = await asyncio.wait_for(get_run(client, wait.run_id).state(), QUERY_TIMEOUT)
        except Exception:  # noqa: BLE001 - listed without its figures
            return
        if snapshot.budget is not None:
            wait.spent, wait.limit = snapshot.budget.spent, snapshot.budget.limit

    await asyncio.gather(*(read(wait) for wait in waits))
    return waits


DecideProblem = Literal["not_found", "conflict", "unavailable"]


class DecideError(Exception):
    """Why a decision was not taken; ``problem`` maps to an HTTP status (404, 409, 503)."""

    def __init__(self, problem: DecideProblem, message: str) -> None:
        super().__init__(message)
        self.problem = problem
        self.message = message


class Decided(BaseModel):
    run_id: str
    call_id: str
    tool: str
    approved: bool
    reason: str | None = None
    by: str | None = None
    """Who decided, when the decision names them (the console's signed-in person)."""


_CLOSED_WORDS = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
}


def _answered(events: list[RunEvent], call_id: str) -> bool:
    return any(
        event.kind == "approval_answered" and event.data.get("call_id") == call_id
        for event in events
    )


async def decide(
    client: Client,
    run_id: str,
    call_id: str,
    *,
    approve: bool,
    reason: str | None = None,
    by: str | None = None,
) -> Decided:
    """Answer one waiting call, as ``relaykit approve`` does (the model reads ``reason`` after a
    rejection; ``by`` names who decided); raises :class:`DecideError` when it cannot be
    answered."""
    run = get_run(client, run_id)
    try:
        description = await run.workflow.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise DecideError("not_found", f"no run with id {run_id!r}") from None
        raise
    if description.status != WorkflowExecutionStatus.RUNNING:
        word = _CLOSED_WORDS.get(description.status, "closed") if description.status else "closed"
        raise DecideError("conflict", f"run {run_id!r} is closed ({word})")
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    try:
        served = await task_queue_has_worker(client, queue)
    except RPCError:  # no permission to describe queues: try anyway
        served = True
    if not served:
        raise DecideError(
            "unavailable", f"no worker polls task queue {queue!r}: run {run_id!r} cannot answer"
        )
    try:
        pending = await asyncio.wait_for(run.pending_approvals(), timeout=QUERY_TIMEOUT)
    except TimeoutError:
        raise DecideError("unavailable", f"run {run_id!r} did not answer in time") from None
    waiting = {item.call_id: item for item in pending}
    if call_id not in waiting:
        events = await asyncio.wait_for(run.events(), timeout=QUERY_TIMEOUT)
        if _answered(events, call_id):
            raise DecideError("conflict", f"call {call_id!r} was already answered")
        raise DecideError(
            "not_found",
            f"no pending approval with call id {call_id!r} in run {run_id!r} "
            f"(waiting: {', '.join(waiting) or 'none'})",
        )
    try:
        answered = await run.approve(call_id, approved=approve, reason=reason, by=by)
    except WorkflowUpdateFailedError as exc:  # answered by someone else a moment ago
        message = str(getattr(exc.cause, "message", exc.cause))
        raise DecideError("conflict", message) from None
    return Decided(
        run_id=run_id, call_id=call_id, tool=answered.tool, approved=approve, reason=reason, by=by
    )


MAX_SELECTED = DEFAULT_LIMIT
"""Calls one "approve selected" answers at most (a page lists at most this many runs)."""


async def decide_selected(
    client: Client,
    picks: list[tuple[str, str]],
    *,
    approve: bool,
    reason: str | None = None,
    by: str | None = None,
) -> list[BulkAnswer]:
    """Answer the calls a person ticked, ``(run_id, call_id)`` each, on the bulk path
    (:func:`relaykit.bulk_approvals.answer_waiting`): a ``describe`` per run checks the call
    still waits (``RelayWaitingCalls``, no worker asked), then a signal carries the decision
    with ``by``. A hundred ticked calls cost a hundred signals, not a hundred workflow tasks
    waited for in turn; the run still validates each answer and records one that comes too
    late as ``approval_refused``. One answer per pick, in the picks' order."""
    unique = list(dict.fromkeys(picks))
    answers = await answer_waiting(client, approved=approve, reason=reason, by=by, picks=unique)
    by_pick = {(answer.run_id, answer.call_id): answer for answer in answers}
    return [by_pick[pick] for pick in unique]


class RecentlyDecided:
    """``(run_id, call_id)`` pairs answered in the last ``keep`` seconds, hidden from listings
    until the run has caught up."""

    def __init__(self, keep: float = 30.0) -> None:
        self.keep = keep
        self._at: dict[tuple[str, str], float] = {}

    def add(self, run_id: str, call_id: str) -> None:
        self._at[(run_id, call_id)] = time.monotonic()

    def current(self) -> set[tuple[str, str]]:
        now = time.monotonic()
        self._at = {key: at for key, at in self._at.items() if now - at < self.keep}
        return set(self._at)
