"""The console's runs list: one page of runs from Temporal visibility, with what each waits for.

This is the one seam between the console and how runs are listed: :func:`runs_page` and
:func:`reason_counts` are all the pages use, so the list can move to another module without
the pages changing. Paging is visibility's own (``next_page_token``), so the first page of
10,000 runs costs what the first page of 10 does; only the rows of the page shown are asked
more (a ``describe`` of each open row, for rate limits, retry backoff and last activity, and
the pending approvals of rows that wait for one).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowExecution, WorkflowExecutionStatus

from relaykit.client import get_run
from relaykit.pricing import format_usd
from relaykit.runs import PendingApproval
from relaykit.search_attributes import (
    RELAY_AGENT,
    RELAY_COST_USD,
    RELAY_PARENT_RUN,
    RELAY_STATUS,
    RELAY_TENANT,
)
from relaykit.watch import STATUS_FILTERS, _quote, runs_query

PAGE_SIZE = 25
DESCRIBE_TIMEOUT = 3.0
REASONS = ("approval", "budget", "paused", "rate_limit", "backoff", "stuck")
"""What a run may wait for; ``approval``, ``budget`` and ``paused`` are counted by visibility
across all runs, the others are read per row of the page shown."""
_REASON_STATUS = {
    "approval": "waiting_approval",
    "budget": "budget_reached",
    "paused": "paused",
}


@dataclass
class RunFilters:
    agent: str = ""
    status: str = ""
    reason: str = ""
    tenant: str = ""
    text: str = ""
    roots: bool = True

    def query(self) -> str:
        status = self.status if self.status in STATUS_FILTERS else None
        extra = []
        if self.reason in _REASON_STATUS:
            extra.append(
                f"RelayStatus = {_quote(_REASON_STATUS[self.reason])} "
                "AND ExecutionStatus = 'Running'"
            )
        elif self.reason:
            extra.append("ExecutionStatus = 'Running' AND RelayStatus = 'running'")
        if self.text:
            needle = _quote(self.text.strip())
            extra.append(
                f"WorkflowId STARTS_WITH {needle} OR RelayAgent STARTS_WITH {needle} "
                f"OR RelayTenant STARTS_WITH {needle}"
            )
        return runs_query(
            status,
            self.agent or None,
            self.roots,
            self.tenant or None,
            " AND ".join(f"({part})" for part in extra) or None,
        )


@dataclass
class ConsoleRow:
    run_id: str
    agent: str
    status: str
    tenant: str | None
    cost: float | None
    started: datetime | None
    last_activity: datetime | None
    parent: str | None = None
    reason: str | None = None
    """What it waits for: one of :data:`REASONS`, ``None`` when it waits for nothing."""
    detail: str = ""
    """The wait in words (attempt and next try, the provider, the stuck cause)."""
    approvals: list[PendingApproval] = field(default_factory=list)
    task_queue: str = ""

    def to_json(self) -> dict[str, Any]:
        def iso(at: datetime | None) -> str | None:
            return at.astimezone(UTC).isoformat().replace("+00:00", "Z") if at else None

        return {
            "run_id": self.run_id,
            "agent": self.agent,
            "status": self.status,
            "reason": self.reason,
            "detail": self.detail,
            "tenant": self.tenant,
            "cost_usd": self.cost,
            "started": iso(self.started),
            "last_activity": iso(self.last_activity),
            "parent": self.parent,
            "approvals": [item.model_dump(mode="json") for item in self.approvals],
        }


@dataclass
class RunsPage:
    rows: list[ConsoleRow]
    next_token: str | None


def _status(execution: WorkflowExecution) -> str:
    relay = execution.typed_search_attributes.get(RELAY_STATUS)
    if execution.status in (None, WorkflowExecutionStatus.RUNNING):
        return relay or "running"
    if execution.status == WorkflowExecutionStatus.CANCELED:
        return "cancelled"
    return execution.status.name.lower()


def row_of(execution: WorkflowExecution) -> ConsoleRow:
    attrs = execution.typed_search_attributes
    status = _status(execution)
    reason = {v: k for k, v in _REASON_STATUS.items()}.get(status)
    return ConsoleRow(
        run_id=execution.id,
        agent=attrs.get(RELAY_AGENT) or "",
        status=status,
        tenant=attrs.get(RELAY_TENANT),
        cost=attrs.get(RELAY_COST_USD),
        started=execution.start_time,
        last_activity=execution.close_time or execution.start_time,
        parent=attrs.get(RELAY_PARENT_RUN) or execution.parent_id,
        reason=reason,
        task_queue=execution.task_queue,
    )


def _token(raw: bytes | None) -> str | None:
    return base64.urlsafe_b64encode(raw).decode() if raw else None


def _raw(token: str) -> bytes | None:
    try:
        return base64.urlsafe_b64decode(token.encode()) if token else None
    except (binascii.Error, ValueError):
        return None


async def runs_page(
    client: Client, filters: RunFilters, token: str = "", *, page_size: int = PAGE_SIZE
) -> RunsPage:
    """One page of runs, newest first, with the open rows' waits read."""
    found = client.list_workflows(filters.query(), page_size=page_size, next_page_token=_raw(token))
    await found.fetch_next_page()
    rows = [row_of(execution) for execution in found.current_page or ()]
    await asyncio.gather(*(_read_wait(client, row) for row in rows if row.status != "completed"))
    if filters.reason and filters.reason not in _REASON_STATUS:
        rows = [row for row in rows if row.reason == filters.reason]
    return RunsPage(rows, _token(found.next_page_token))


async def reason_counts(client: Client, filters: RunFilters) -> dict[str, int]:
    """Open runs per visibility-known wait (``approval``, ``budget``, ``paused``) and running."""
    base = RunFilters(agent=filters.agent, tenant=filters.tenant, roots=filters.roots)

    async def count(reason: str) -> int:
        query = RunFilters(**{**base.__dict__, "reason": reason}).query()
        if reason == "running":
            query = runs_query("running", base.agent or None, base.roots, base.tenant or None)
        return (await client.count_workflows(query)).count

    names = ["running", *_REASON_STATUS]
    return dict(zip(names, await asyncio.gather(*(count(n) for n in names)), strict=True))


async def _read_wait(client: Client, row: ConsoleRow) -> None:
    """An open row's wait and last activity, from ``describe`` (and the run's approvals)."""
    from relaykit.cli.waiting import waiting_reason
    from relaykit.stuck import stuck

    handle = get_run(client, row.run_id)
    try:
        description = await asyncio.wait_for(handle.workflow.describe(), DESCRIBE_TIMEOUT)
    except Exception:  # noqa: BLE001 - the row keeps what visibility said
        return
    if description.status != WorkflowExecutionStatus.RUNNING:
        return
    raw = description.raw_description
    times = [row.last_activity] if row.last_activity else []
    for pending in raw.pending_activities:
        for stamp in (pending.last_heartbeat_time, pending.last_started_time):
            if stamp.seconds:
                times.append(stamp.ToDatetime(tzinfo=UTC))
        if (
            row.reason is None
            and pending.attempt > 1
            and pending.next_attempt_schedule_time.seconds
        ):
            at = pending.next_attempt_schedule_time.ToDatetime(tzinfo=UTC)
            row.reason = "backoff"
            row.detail = (
                f"{pending.activity_type.name}: attempt {pending.attempt}, next try "
                f"{at.strftime('%H:%M:%S')} UTC"
            )
    if raw.HasField("pending_workflow_task") and raw.pending_workflow_task.scheduled_time.seconds:
        times.append(raw.pending_workflow_task.scheduled_time.ToDatetime(tzinfo=UTC))
    row.last_activity = max(times) if times else row.last_activity
    if row.reason is None:
        limited = await waiting_reason(client, description)
        if limited:
            row.reason, row.detail = "rate_limit", limited
    if row.reason is None and raw.pending_workflow_task.attempt > 1:
        wedged = await stuck(client, row.run_id)
        if wedged is not None:
            row.reason, row.detail = "stuck", wedged.cause
    if row.reason == "budget":
        try:
            view = (await asyncio.wait_for(handle.state(), DESCRIBE_TIMEOUT)).budget
        except Exception:  # noqa: BLE001 - shown without its figures
            view = None
        if view is not None:
            row.detail = f"spent {format_usd(view.spent)} of {format_usd(view.limit)}"
    if row.reason == "approval":
        try:
            row.approvals = await asyncio.wait_for(handle.pending_approvals(), DESCRIBE_TIMEOUT)
        except Exception:  # noqa: BLE001 - shown without its calls; the inbox says why
            row.detail = "its approvals could not be read (no worker answered)"


def children_query(run_id: str) -> str:
    return f"RelayParentRun = {_quote(run_id)}"
