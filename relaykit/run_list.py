"""The runs of a namespace, one page at a time, from Temporal's own data: who waits for what,
what it costs, since when.

A page costs a bounded number of requests, whatever the number of runs:

- one visibility list request for the page's rows (``ListWorkflowExecutions``: id, status, start
  and close time, and relaykit's search attributes: agent, status, what the run waits for a
  person for, tenant, tokens, cost, last activity);
- one count request per waiting reason a visibility query can find (:data:`COUNTED_REASONS`),
  for the counts at the top, when asked for;
- for the page's open rows only, one ``DescribeWorkflowExecution`` each (a few at a time): what
  the visibility store does not hold, because it changes without the run issuing a command (a
  provider's rate limit, read from the model call's heartbeat; a retry's backoff, with its
  attempt and next try; a workflow task that keeps failing, read by :mod:`relaykit.stuck`, whose
  cause costs a short backwards history read for such a run only);
- with ``live_usage``, for the page's rows that are working (``running``), one query each for
  the usage so far (``RelayTokens`` and ``RelayCostUSD`` are written at status changes, so a run
  that waits has them current).

What a run waits for a person for (``approval``, ``unknown_outcome``, ``budget``, ``paused``) is
in visibility (``RelayStatus``, and ``RelayWaitingFor`` in runs started on a namespace that has
it), so filters and counts on it cover every run. ``rate_limit``, ``backoff`` and ``stuck`` are
not: a filter on them keeps the page's open rows that have the reason, so such a page may hold
fewer rows than asked for (its ``next_page_token`` goes on), and they are not counted.

The free text filter is a prefix of the run id (visibility's ``STARTS_WITH``: the store has no
substring search on ids).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final, Literal

from pydantic import BaseModel
from temporalio.client import (
    Client,
    WorkflowExecution,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
)
from temporalio.service import RPCError, RPCStatusCode

from relaykit.client import get_run
from relaykit.errors import RelaykitError
from relaykit.runs import AGENT_RUN_WORKFLOW, MODEL_ACTIVITY
from relaykit.search_attributes import (
    RELAY_AGENT,
    RELAY_COST_USD,
    RELAY_FORK_OF,
    RELAY_LAST_ACTIVITY,
    RELAY_PARENT_RUN,
    RELAY_STATUS,
    RELAY_TENANT,
    RELAY_TOKENS,
    RELAY_WAITING_FOR,
    eval_registered,
    keyword,
    query_literal,
)
from relaykit.stuck import stuck_from
from relaykit.versioning import run_build

WaitingReason = Literal[
    "approval",
    "unknown_outcome",
    "budget",
    "paused",
    "rate_limit",
    "backoff",
    "stuck",
    "parent_budget",
]

COUNTED_REASONS: Final = ("approval", "unknown_outcome", "budget", "paused")
"""Reasons a visibility query finds (filters cover every run; counted by count queries)."""

PAGE_REASONS: Final = ("rate_limit", "backoff", "stuck")
"""Reasons read from the description of the page's open rows only."""

REASONS: Final = (*COUNTED_REASONS, *PAGE_REASONS)

_OPEN = "ExecutionStatus = 'Running'"

STATUS_FILTERS: Final[dict[str, str]] = {
    "open": _OPEN,
    "running": f"RelayStatus = 'running' AND {_OPEN}",
    "waiting_approval": f"RelayStatus = 'waiting_approval' AND {_OPEN}",
    "paused": f"RelayStatus = 'paused' AND {_OPEN}",
    "budget_reached": f"RelayStatus = 'budget_reached' AND {_OPEN}",
    "completed": "ExecutionStatus = 'Completed'",
    "failed": "ExecutionStatus = 'Failed'",
    "cancelled": "ExecutionStatus = 'Canceled'",
    "terminated": "ExecutionStatus = 'Terminated'",
    "timed_out": "ExecutionStatus = 'TimedOut'",
}
"""``status`` filter → visibility query (the statuses ``relaykit runs --status`` takes)."""

REASON_FILTERS: Final[dict[str, str]] = {
    # Runs started before RelayWaitingFor (or on a namespace without it) have none: an approval.
    "approval": f"RelayStatus = 'waiting_approval' AND {_OPEN} "
    "AND (RelayWaitingFor IS NULL OR RelayWaitingFor = 'approval')",
    "unknown_outcome": f"RelayWaitingFor = 'unknown_outcome' AND {_OPEN}",
    "budget": f"RelayStatus = 'budget_reached' AND {_OPEN}",
    "paused": f"RelayStatus = 'paused' AND {_OPEN}",
    **dict.fromkeys(PAGE_REASONS, _OPEN),
}
"""``reason`` filter → visibility query (for :data:`PAGE_REASONS`: the open runs, whose page
rows are then kept when they have the reason)."""

DESCRIBE_CONCURRENCY = 16
LIVE_USAGE_TIMEOUT = 2.0
"""Seconds a working run's worker gets to answer the usage query (else the attributes stand)."""


class RunWaiting(BaseModel):
    """What an open run waits for."""

    reason: WaitingReason
    detail: str = ""
    """For people: the calls waiting, the provider's limit, the retried step and its last
    error, or the cause of a stuck run."""
    attempt: int | None = None
    """For ``backoff``: the attempt that will run next."""
    next_try: datetime | None = None
    """For ``backoff``: when it runs."""


class RunRow(BaseModel):
    """One run in a list."""

    run_id: str
    """The workflow id (what every command takes)."""
    execution: str
    """Temporal's run id of the listed execution."""
    agent: str
    status: str
    """relaykit's status while open (``running``, ``waiting_approval``, …), else how it
    closed (``completed``, ``failed``, ``cancelled``, ``terminated``, ``timed_out``, …)."""
    waiting: RunWaiting | None = None
    tenant: str | None = None
    tokens: int | None = None
    cost_usd: float | None = None
    started: datetime | None = None
    last_activity: datetime | None = None
    """The latest of: the run's last change of agent, status or what it waits for
    (``RelayLastActivity``), its close, and, for an open run on the page, its activities'
    latest start or heartbeat. The start when none is known (runs started before)."""
    parent: str | None = None
    fork_of: str | None = None
    build_id: str | None = None

    @property
    def stuck(self) -> str | None:
        """The cause, when the run's workflow task keeps failing."""
        return self.waiting.detail if self.waiting and self.waiting.reason == "stuck" else None

    def to_json(self) -> dict[str, Any]:
        """``relaykit runs --json``'s row (its earlier keys kept: ``stuck`` is the cause)."""
        return {**self.model_dump(mode="json"), "stuck": self.stuck}


class RunPage(BaseModel):
    rows: list[RunRow]
    next_page_token: str | None = None
    """Pass it back for the next page (``None``: the last page)."""
    counts: dict[str, int] | None = None
    """Open runs per reason of :data:`COUNTED_REASONS` under the same agent, tenant, text and
    roots filters (not status or reason), when asked for."""


@dataclass(frozen=True)
class RunFilter:
    """What to list. Every field narrows the list; ``None`` / ``False`` leaves it open."""

    agent: str | None = None
    """The run's current agent."""
    status: str | None = None
    """A key of :data:`STATUS_FILTERS`."""
    reason: str | None = None
    """A key of :data:`REASON_FILTERS` (what an open run waits for)."""
    tenant: str | None = None
    text: str | None = None
    """A prefix of the run id."""
    roots: bool = False
    """Leave child runs out."""
    query: str | None = None
    """A visibility filter of the caller's own (``RelayCostUSD > 1``), ANDed."""
    evals: bool = False
    """Also list the candidate runs of evaluations (``RelayEvalOf``), which are left out by
    default where the namespace has that attribute."""

    def check(self) -> None:
        if self.status is not None and self.status not in STATUS_FILTERS:
            raise RelaykitError(
                f"unknown status {self.status!r}", hint="one of: " + ", ".join(STATUS_FILTERS)
            )
        if self.reason is not None and self.reason not in REASON_FILTERS:
            raise RelaykitError(
                f"unknown reason {self.reason!r}", hint="one of: " + ", ".join(REASON_FILTERS)
            )

    def visibility_query(self, *, with_state: bool = True, eval_attribute: bool = False) -> str:
        """The filter as a visibility query; ``with_state=False`` leaves out status and reason
        (the base of the counts); ``eval_attribute``: the namespace has ``RelayEvalOf``."""
        parts = [f"WorkflowType = {query_literal(AGENT_RUN_WORKFLOW)}"]
        if eval_attribute and not self.evals:
            parts.append("RelayEvalOf IS NULL")
        if with_state and self.status is not None:
            parts.append(f"({STATUS_FILTERS[self.status]})")
        if with_state and self.reason is not None:
            parts.append(f"({REASON_FILTERS[self.reason]})")
        if self.agent is not None:
            parts.append(f"RelayAgent = {query_literal(keyword(self.agent))}")
        if self.roots:
            parts.append("RelayParentRun IS NULL")
        if self.tenant is not None:
            parts.append(f"RelayTenant = {query_literal(self.tenant)}")
        if self.text:
            parts.append(f"WorkflowId STARTS_WITH {query_literal(self.text)}")
        if self.query:
            parts.append(f"({self.query})")
        return " AND ".join(parts)


async def list_runs_page(
    client: Client,
    where: RunFilter | None = None,
    *,
    page_size: int = 50,
    page_token: str | None = None,
    counts: bool = False,
    live_usage: bool = False,
) -> RunPage:
    """One page of runs, newest first (see the module for what it reads and costs). Raises
    :class:`~relaykit.errors.RelaykitError` for an unknown status or reason or a bad page
    token; Temporal's own errors (an unregistered search attribute, a namespace it does not
    know) as they come."""
    where = where or RunFilter()
    where.check()
    if page_size < 1:
        raise RelaykitError(f"a page has at least one row, not {page_size}")
    evals_kept = not where.evals and await eval_registered(client)
    listing = client.list_workflows(
        where.visibility_query(eval_attribute=evals_kept),
        page_size=page_size,
        next_page_token=_token_bytes(page_token),
    )
    counting = (
        asyncio.ensure_future(count_waiting(client, where, eval_attribute=evals_kept))
        if counts
        else None
    )
    try:
        await listing.fetch_next_page()
        rows = [row_of(execution) for execution in listing.current_page or ()]
        await _look_closer(client, rows)
        if live_usage:
            await _live_usage(client, rows)
        counted = await counting if counting is not None else None
    finally:  # the list failed (an unknown namespace): the counts are not wanted, nor their error
        if counting is not None and not counting.cancel() and not counting.cancelled():
            counting.exception()
    if where.reason in PAGE_REASONS:
        rows = [row for row in rows if row.waiting and row.waiting.reason == where.reason]
    token = listing.next_page_token
    return RunPage(
        rows=rows,
        next_page_token=base64.urlsafe_b64encode(token).decode() if token else None,
        counts=counted,
    )


async def count_waiting(
    client: Client, where: RunFilter | None = None, *, eval_attribute: bool | None = None
) -> dict[str, int]:
    """Open runs per reason of :data:`COUNTED_REASONS` (one count request each, at once). On a
    namespace without ``RelayWaitingFor`` every run waiting for a person's answer counts as an
    ``approval`` and ``unknown_outcome`` is left out."""
    where = where or RunFilter()
    if eval_attribute is None:
        eval_attribute = not where.evals and await eval_registered(client)
    base = where.visibility_query(with_state=False, eval_attribute=eval_attribute)
    found = await asyncio.gather(
        *(_count(client, f"{base} AND ({REASON_FILTERS[reason]})") for reason in COUNTED_REASONS)
    )
    counts = {reason: n for reason, n in zip(COUNTED_REASONS, found, strict=True) if n is not None}
    if "approval" not in counts:  # RelayWaitingFor is not registered
        plain = await _count(client, f"{base} AND ({STATUS_FILTERS['waiting_approval']})")
        counts = {"approval": plain or 0, **counts}
    return counts


async def _count(client: Client, query: str) -> int | None:
    """The count, or ``None`` when the namespace refuses the query (an attribute it lacks)."""
    try:
        return (await client.count_workflows(query)).count
    except RPCError as exc:
        if exc.status == RPCStatusCode.INVALID_ARGUMENT:
            return None
        raise


def _token_bytes(token: str | None) -> bytes | None:
    if not token:
        return None
    try:
        return base64.urlsafe_b64decode(token.encode())
    except (binascii.Error, ValueError):
        raise RelaykitError(
            "not a page token of this list", hint="pass next_page_token as it was given"
        ) from None


_CLOSED_WORDS: Final = {
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
}

_PERSON_REASONS: Final[dict[str, WaitingReason]] = {
    "waiting_approval": "approval",
    "budget_reached": "budget",
    "paused": "paused",
    "waiting_parent_budget": "parent_budget",
}
"""What an open run's status says it waits for. ``parent_budget``: a child at its dollar
reservation waits for its parent's answer (a person acts on the parent, whose row says
``budget`` when it waits at its own limit); shown, not counted or filtered."""


def row_of(execution: WorkflowExecution) -> RunRow:
    """A row from a visibility record (or a description) alone."""
    attrs = execution.typed_search_attributes
    relay_status = attrs.get(RELAY_STATUS)
    status = execution.status
    is_open = status in (None, WorkflowExecutionStatus.RUNNING)
    if is_open:
        shown = relay_status or "running"
    else:
        assert status is not None
        shown = _CLOSED_WORDS.get(status, status.name.lower())
    waiting = None
    if is_open:
        recorded = attrs.get(RELAY_WAITING_FOR)
        reason = _PERSON_REASONS.get(shown)
        if reason is not None:
            waiting = RunWaiting(
                reason="unknown_outcome" if recorded == "unknown_outcome" else reason
            )
    activity = [t for t in (attrs.get(RELAY_LAST_ACTIVITY), execution.close_time) if t]
    return RunRow(
        run_id=execution.id,
        execution=execution.run_id,
        agent=attrs.get(RELAY_AGENT) or "",
        status=shown,
        waiting=waiting,
        tenant=attrs.get(RELAY_TENANT),
        tokens=attrs.get(RELAY_TOKENS),
        cost_usd=attrs.get(RELAY_COST_USD),
        started=execution.start_time,
        last_activity=max(activity) if activity else execution.start_time,
        parent=attrs.get(RELAY_PARENT_RUN) or execution.parent_id,
        fork_of=attrs.get(RELAY_FORK_OF),
        build_id=(run_build(execution) or (None, None))[1],
    )


async def _look_closer(client: Client, rows: list[RunRow]) -> None:
    """Describe the page's open rows: stuck, rate limited or backing off, and their latest
    activity."""
    gate = asyncio.Semaphore(DESCRIBE_CONCURRENCY)

    async def one(row: RunRow) -> None:
        async with gate:
            try:
                handle = client.get_workflow_handle(row.run_id, run_id=row.execution)
                description = await handle.describe()
                await describe_waiting(client, row, description)
            except Exception:  # noqa: BLE001 - a run closing meanwhile: its record stands
                return

    await asyncio.gather(*(one(row) for row in rows if row.status not in _ENDED))


_ENDED: Final = frozenset((*_CLOSED_WORDS.values(), "terminated", "timed_out", "continued_as_new"))


async def describe_waiting(
    client: Client, row: RunRow, description: WorkflowExecutionDescription
) -> None:
    """What the description adds to a row: a wedge first (nothing else moves), then a
    provider's limit or a retry's backoff of a run that works; and its latest activity."""
    wedge = await stuck_from(client, description)
    if wedge is not None:
        row.waiting = RunWaiting(reason="stuck", detail=wedge.cause)
    elif row.waiting is None:
        limit = await model_wait(client, description)
        row.waiting = (
            RunWaiting(reason="rate_limit", detail=limit) if limit else backoff(description)
        )
    seen = [row.last_activity] if row.last_activity else []
    for activity in description.raw_description.pending_activities:
        for field in ("last_started_time", "last_heartbeat_time"):
            if activity.HasField(field):
                seen.append(getattr(activity, field).ToDatetime(tzinfo=UTC))
    if seen:
        row.last_activity = max(seen)


async def model_wait(client: Client, description: WorkflowExecutionDescription) -> str | None:
    """Why the run's model call has not been sent yet ("rate limited by openai until
    12:04:31"), from the heartbeat details of the pending call (relaykit.models.backpressure)."""
    from relaykit.streaming import ModelProgress

    for pending in description.raw_description.pending_activities:
        payloads = list(pending.heartbeat_details.payloads)
        if pending.activity_type.name != MODEL_ACTIVITY or not payloads:
            continue
        try:
            [progress] = await client.data_converter.decode(payloads, [ModelProgress])
        except Exception:  # noqa: BLE001 - not ours (an older worker): nothing to say
            continue
        if isinstance(progress, ModelProgress) and progress.waiting:
            return progress.waiting
    return None


def backing_off(activity: Any, now: float | None = None) -> bool:
    """Whether a pending activity waits for its next attempt (a retry's backoff)."""
    if not activity.HasField("next_attempt_schedule_time"):
        return False
    retry_at: int = activity.next_attempt_schedule_time.ToSeconds()
    return retry_at > (time.time() if now is None else now)


def backoff(description: WorkflowExecutionDescription) -> RunWaiting | None:
    """The run's step that waits to be tried again, with its attempt, next try and last error."""
    for activity in description.raw_description.pending_activities:
        if not backing_off(activity):
            continue
        error = activity.last_failure.message if activity.HasField("last_failure") else ""
        name = activity.activity_type.name
        return RunWaiting(
            reason="backoff",
            detail=f"{name}: {error}" if error else name,
            attempt=activity.attempt,
            next_try=activity.next_attempt_schedule_time.ToDatetime(tzinfo=UTC),
        )
    return None


async def _live_usage(client: Client, rows: list[RunRow]) -> None:
    """A working run's usage so far, from its own state (the attributes are as of its last
    status change); a run whose worker does not answer in time keeps them."""

    async def refresh(row: RunRow) -> None:
        try:
            state = await asyncio.wait_for(get_run(client, row.run_id).state(), LIVE_USAGE_TIMEOUT)
        except Exception:  # noqa: BLE001 - no worker, or a run closing meanwhile
            return
        row.tokens = state.usage.total_tokens
        row.cost_usd = state.usage.cost_usd

    await asyncio.gather(*(refresh(row) for row in rows if row.status == "running"))
