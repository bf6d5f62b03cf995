"""Retention of the store: ``relaykit gc`` deletes the stored transcripts and payloads of runs
closed longer ago than the retention, and of runs Temporal no longer knows (dated by their last
write). The store itself is :mod:`relaykit.storage`."""

from __future__ import annotations

import dataclasses
import os
from datetime import UTC, datetime, timedelta
from typing import Any

from relaykit.errors import ConfigurationError
from relaykit.search_attributes import query_literal
from relaykit.storage import (
    RUNS_PREFIX,
    Store,
    long_id_start,
    root_run_id,
    run_id_of_scope,
    run_prefix,
    scope_for,
)

# --- retention ----------------------------------------------------------------------------------

DEFAULT_RETENTION = timedelta(days=7)


def parse_duration(text: str) -> timedelta:
    """``"7d"``, ``"12h"``, ``"30m"``, ``"45s"`` or a number of seconds."""
    text = text.strip().lower()
    units = {"d": 86400, "h": 3600, "m": 60, "s": 1}
    try:
        if text and text[-1] in units:
            duration = timedelta(seconds=float(text[:-1]) * units[text[-1]])
        else:
            duration = timedelta(seconds=float(text))
    except (ValueError, OverflowError):
        raise ConfigurationError(
            f"not a duration: {text!r}", hint="write e.g. 7d, 12h, 30m or 45s"
        ) from None
    if duration < timedelta(0):  # a negative retention would delete every closed run's data
        raise ConfigurationError(
            f"a duration cannot be negative: {text!r}", hint="write e.g. 7d, 12h, 30m or 45s"
        )
    return duration


def retention_from_env() -> timedelta:
    value = os.environ.get("RELAYKIT_STORE_RETENTION")
    return parse_duration(value) if value else DEFAULT_RETENTION


@dataclasses.dataclass
class GcReport:
    """What :func:`collect_garbage` did, one entry per root run folder."""

    deleted: dict[str, int] = dataclasses.field(default_factory=dict)
    """Root run id → objects deleted."""
    kept: dict[str, str] = dataclasses.field(default_factory=dict)
    """Root run id → why its folder stays."""


async def collect_garbage(
    store: Store,
    client: Any,
    *,
    retention: timedelta | None = None,
    dry_run: bool = False,
    now: datetime | None = None,
) -> GcReport:
    """Delete the folders of root runs that closed more than ``retention`` ago.

    Temporal says whether a run is closed (and when). A run Temporal no longer knows (its
    namespace retention removed it) counts as closed when its newest object was written; its
    children (``<root>/<call>``) are asked too, so a detached subagent still running keeps its
    root's folder."""
    from temporalio.service import RPCError, RPCStatusCode

    retention = retention_from_env() if retention is None else retention
    now = now or datetime.now(UTC)
    report = GcReport()
    for scope in await store.folders(f"{RUNS_PREFIX}/"):
        run_id = run_id_of_scope(scope) or await _long_root_id(client, scope)
        label = run_id or scope
        closed_at: datetime | None = None
        if run_id is not None:
            try:
                description = await client.get_workflow_handle(run_id).describe()
            except RPCError as exc:
                if exc.status != RPCStatusCode.NOT_FOUND:
                    raise
                description = None
            if description is not None:
                closed_at = description.close_time
                if closed_at is None:
                    report.kept[label] = "running"
                    continue
            children = f"WorkflowId STARTS_WITH {query_literal(run_id + '/')}"
            query = f"{children} AND ExecutionStatus = 'Running'"
            try:
                running_child = [w async for w in client.list_workflows(query, limit=1)]
            except RPCError:
                running_child = []
            if running_child:
                report.kept[label] = f"child run {running_child[0].id} is running"
                continue
        forgotten = closed_at is None
        if forgotten:  # unknown to Temporal: the last write is when it was last used
            written = [o.last_modified async for o in store.list(run_prefix(scope))]
            if not written:
                continue
            closed_at = max(written)
        assert closed_at is not None
        if now - closed_at < retention:
            when = "unknown to Temporal, last written" if forgotten else "closed"
            report.kept[label] = f"{when} {_ago(now - closed_at)} ago, retention {_ago(retention)}"
            continue
        if dry_run:
            report.deleted[label] = sum([1 async for _ in store.list(run_prefix(scope))])
        else:
            report.deleted[label] = await store.delete_prefix(run_prefix(scope))
    return report


async def _long_root_id(client: Any, scope: str) -> str | None:
    """The root run id of a long id's scope, found among the runs Temporal knows whose id
    begins as the scope does (``None``: Temporal knows none, and the folder counts as
    forgotten, like any other)."""
    start = long_id_start(scope)
    if start is None:
        return None
    query = f"WorkflowId STARTS_WITH {query_literal(start)}"
    async for execution in client.list_workflows(query):
        if scope_for(execution.id) == scope:
            return root_run_id(execution.id)
    return None


def _ago(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"
