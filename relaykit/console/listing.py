"""The console's runs list: a page of :mod:`relaykit.run_list` (the one list mechanism, shared
with ``relaykit runs``), as the console's rows, with what only the console shows added.

The list itself (one visibility page, counts per reason, a ``describe`` of the page's open rows
for rate limits, backoff, stuck runs and last activity) is ``run_list``'s. This module adds, for
the rows of the page only, what a person acts on: the calls an ``approval`` or
``unknown_outcome`` row waits on (its ``pending_approvals`` query, so they can be decided from
the list) and the spend of a ``budget`` row.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from temporalio.client import Client, WorkflowExecution

from relaykit.client import get_run
from relaykit.pricing import format_usd
from relaykit.run_list import (
    COUNTED_REASONS,
    REASON_FILTERS,
    REASONS,
    STATUS_FILTERS,
    RunFilter,
    RunRow,
    list_runs_page,
)
from relaykit.run_list import row_of as list_row
from relaykit.runs import PendingApproval
from relaykit.search_attributes import keyword, query_literal

__all__ = ["COUNTED_REASONS", "REASONS", "STATUS_FILTERS"]

PAGE_SIZE = 25
QUERY_TIMEOUT = 3.0
_ASKS_A_PERSON = ("approval", "unknown_outcome")


@dataclass
class RunFilters:
    """The list's filters as the page's form gives them (empty: no filter)."""

    agent: str = ""
    status: str = ""
    reason: str = ""
    tenant: str = ""
    text: str = ""
    roots: bool = True

    def run_filter(self) -> RunFilter:
        """Unknown statuses and reasons are dropped (a hand-edited address lists all)."""
        return RunFilter(
            agent=self.agent or None,
            status=self.status if self.status in STATUS_FILTERS else None,
            reason=self.reason if self.reason in REASON_FILTERS else None,
            tenant=self.tenant or None,
            text=self.text.strip() or None,
            roots=self.roots,
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
    """What it waits for: one of :data:`relaykit.run_list.REASONS`, or ``parent_budget`` (a
    child waiting for its parent's answer: shown, not filtered), ``None`` for nothing."""
    detail: str = ""
    """The wait in words (the calls, the provider's limit, attempt and next try, the cause)."""
    approvals: list[PendingApproval] = field(default_factory=list)

    @classmethod
    def of(cls, row: RunRow) -> ConsoleRow:
        waiting = row.waiting
        detail = waiting.detail if waiting else ""
        if waiting is not None and waiting.reason == "backoff" and waiting.next_try:
            detail += f" · attempt {waiting.attempt}, next try {waiting.next_try:%H:%M:%S} UTC"
        return cls(
            run_id=row.run_id,
            agent=row.agent,
            status=row.status,
            tenant=row.tenant,
            cost=row.cost_usd,
            started=row.started,
            last_activity=row.last_activity,
            parent=row.parent,
            reason=waiting.reason if waiting else None,
            detail=detail,
        )

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
    counts: dict[str, int]
    """Open runs per reason of :data:`COUNTED_REASONS`, under the agent, tenant and text
    filters."""


def row_of(execution: WorkflowExecution) -> ConsoleRow:
    """A row from a visibility record or a description alone (a run's page, its children)."""
    return ConsoleRow.of(list_row(execution))


async def runs_page(client: Client, filters: RunFilters, token: str = "") -> RunsPage:
    """One page of runs, newest first, with what a person acts on read for its rows. Raises
    :class:`~relaykit.errors.RelaykitError` for a page token that is not one."""
    page = await list_runs_page(
        client,
        filters.run_filter(),
        page_size=PAGE_SIZE,
        page_token=token or None,
        counts=True,
        live_usage=True,
    )
    rows = [ConsoleRow.of(row) for row in page.rows]
    await asyncio.gather(*(_for_a_person(client, row) for row in rows))
    return RunsPage(rows, page.next_page_token, page.counts or {})


async def _for_a_person(client: Client, row: ConsoleRow) -> None:
    handle = get_run(client, row.run_id)
    if row.reason in _ASKS_A_PERSON:
        try:
            row.approvals = await asyncio.wait_for(handle.pending_approvals(), QUERY_TIMEOUT)
        except Exception:  # noqa: BLE001 - listed without its calls, saying why
            row.detail = "its calls could not be read (no worker answered)"
    elif row.reason == "budget":
        try:
            view = (await asyncio.wait_for(handle.state(), QUERY_TIMEOUT)).budget
        except Exception:  # noqa: BLE001 - listed without its figures
            view = None
        if view is not None:
            row.detail = f"spent {format_usd(view.spent)} of {format_usd(view.limit)}"


def children_query(run_id: str) -> str:
    return f"RelayParentRun = {query_literal(keyword(run_id))}"
