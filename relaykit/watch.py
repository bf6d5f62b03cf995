"""``relaykit watch`` and ``relaykit runs``: a run seen from a terminal.

``watch`` reads :meth:`relaykit.RunHandle.stream` (which adds nothing to the run's history) and
shows the run live on a terminal: current agent and turn, the text the model is writing, tool
calls with their durations, pending approvals, background subagents and tokens used. On a
finished run, or when the output is not a terminal, it prints the run's log line by line
instead and exits when the run has ended. Watching can stop at any time (Ctrl-C) and start again
from the beginning or from the cursor it printed when it stopped; the run is not affected.

``runs`` renders the page of runs :mod:`relaykit.run_list` reads from Temporal visibility.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from rich.console import Console, Group, RenderableType
from rich.live import Live
from rich.markup import escape
from rich.panel import Panel
from rich.table import Table
from rich.text import Text
from temporalio.client import WorkflowExecutionStatus

from relaykit.client import RunHandle
from relaykit.pricing import cost_text, format_usd
from relaykit.run_list import RunRow, RunWaiting
from relaykit.streaming import StreamEvent
from relaykit.tools import summarize_call

MAX_LOG_LINES = 8
MAX_TOOL_ROWS = 12
MAX_STREAM_CHARS = 1200
STATE_REFRESH_SECONDS = 1.0


def _short(value: Any, limit: int = 120) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _usd(value: Any) -> str:
    return format_usd(float(value)) if isinstance(value, int | float) else "?"


def describe(item: StreamEvent) -> str:
    """One line of text for an event (not for deltas); an operator action's ends with who took
    it."""
    line = _describe(item)
    by = item.data.get("by")
    return f"{line} · by {by}" if by and isinstance(by, str) else line


def _describe(item: StreamEvent) -> str:
    data = item.data
    kind = item.kind
    if kind == "run_started":
        fork = f" (fork of {data['forked_from']})" if data.get("forked_from") else ""
        return f"started{fork}: {_short(data.get('input', ''))}"
    if kind == "message":
        return _short(data.get("text", ""), 200)
    if kind == "model_call":
        cost = data.get("cost")
        price = "cost unknown" if cost is None else format_usd(float(cost))
        return (
            f"{data.get('model')}: {data.get('input_tokens')} in / {data.get('output_tokens')} "
            f"out tokens · {price}"
        )
    if kind == "tool_call":
        return "→ " + summarize_call(str(data.get("name")), str(data.get("arguments", "")), 100)
    if kind == "tool_result":
        mark = "✗" if data.get("is_error") else "←"
        return f"{mark} {data.get('name')}: {_short(data.get('content', ''))}"
    if kind == "handoff":
        reason = f" ({_short(data['reason'], 60)})" if data.get("reason") else ""
        return f"handoff {data.get('from')} → {data.get('to')}{reason}"
    if kind == "tool_outcome_unknown":
        lost = f"attempt {data.get('attempt')} lost" if data.get("attempt") else "an attempt lost"
        started = f", started {data.get('started_at')}" if data.get("started_at") else ""
        then = "a person decides" if data.get("on_unknown") == "ask" else "not run again"
        call = data.get("call_id")
        return f"? {data.get('name')}: outcome unknown ({lost}{started}); {then} [call {call}]"
    if kind == "approval_requested":
        call = summarize_call(str(data.get("tool")), str(data.get("arguments", "")), 80)
        why = f" ({_short(data['reason'], 100)})" if data.get("reason") else ""
        return f"waiting for approval: {call} [call {data.get('call_id')}]{why}"
    if kind == "approval_answered":
        verdict = "approved" if data.get("approved") else "rejected"
        reason = f": {data['reason']}" if data.get("reason") else ""
        return f"{verdict} call {data.get('call_id')}{reason}"
    if kind == "message_injected":
        return f"user: {_short(data.get('text', ''))}"
    if kind == "steered":
        abandoned = (
            " (the model call in flight was abandoned)" if data.get("cancelled_call") else ""
        )
        return f"steered: {_short(data.get('text', ''))}{abandoned}"
    if kind in ("paused", "resumed"):
        return kind
    if kind == "cancelled":
        why = f": {_short(data['reason'], 100)}" if data.get("reason") else ""
        return f"cancel requested{why}"
    if kind == "budget_changed":
        limit = format_usd(float(data.get("limit") or 0))
        return "finish requested" if data.get("finish") else f"dollar limit now {limit}"
    if kind == "budget_reached":
        spent, limit = _usd(data.get("spent")), _usd(data.get("limit"))
        then = (
            "it makes its last call and finishes"
            if data.get("then") == "finish"
            else "it waits for `relaykit budget` to raise the limit or finish it"
        )
        return f"dollar limit reached: {spent} of {limit} spent; {then}"
    if kind == "budget_asked":
        return (
            f"asks its parent {data.get('parent')} for {_usd(data.get('need'))} more "
            f"({_usd(data.get('spent'))} of {_usd(data.get('limit'))} spent)"
        )
    if kind == "budget_granted":  # the parent's event names the child, the child's the parent
        reason = f" ({_short(data['reason'], 80)})" if data.get("reason") else ""
        answer = (
            f"granted {_usd(data.get('amount'))}"
            if data.get("verdict") == "grant"
            else f"answered {data.get('verdict')}{reason}"
        )
        if data.get("child"):
            return f"{answer} to child {data['child']}"
        return f"parent {data.get('from')} {answer}"
    if kind == "subagent_started":
        return f"{data.get('id')} ({data.get('agent')}) started"
    if kind == "subagent_finished":
        return f"{data.get('id')} ({data.get('agent')}) {data.get('status')}"
    if kind == "report_delivered":
        return f"report of {data.get('id')} ({data.get('agent')}) delivered ({data.get('via')})"
    if kind == "error":
        return f"error {data.get('kind')}: {_short(data.get('message', ''), 200)}"
    if kind == "final":
        return f"final answer: {_short(data.get('output', ''), 300)}"
    return _short(data) if data else ""


def log_line(item: StreamEvent) -> str:
    path = "/".join(item.run_path)
    indent = "  " * item.depth
    return f"{item.seq:>5} t{item.turn:<3} {indent}{path:<28} {item.kind:<18} {describe(item)}"


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    if start is None:
        return None
    end = end or datetime.now(UTC)
    return max((end - start).total_seconds(), 0.0)


@dataclass
class ToolRow:
    call_id: str
    name: str
    summary: str
    path: str
    started: datetime | None
    ended: datetime | None = None
    status: str = "running"


@dataclass
class Task:
    id: str
    agent: str
    status: str = "running"


@dataclass
class WatchState:
    """What the live view shows, built from the stream's items."""

    run_id: str
    status: str = "running"
    agent: str = ""
    turn: int = 0
    tokens: int | None = None
    requests: int | None = None
    cost: str | None = None
    started: datetime | None = None
    tools: dict[str, ToolRow] = field(default_factory=dict)
    approvals: dict[str, str] = field(default_factory=dict)
    tasks: dict[str, Task] = field(default_factory=dict)
    streaming: dict[str, tuple[str, str]] = field(default_factory=dict)
    """workflow id → (run path, text being written)."""
    log: list[str] = field(default_factory=list)
    output: Any = None
    cursor: str = ""

    def apply(self, item: StreamEvent) -> None:
        self.cursor = item.cursor or self.cursor
        path = "/".join(item.run_path)
        if item.is_delta:
            previous = (
                "" if item.data.get("reset") else self.streaming.get(item.workflow_id, ("", ""))[1]
            )
            self.streaming[item.workflow_id] = (path, previous + str(item.data.get("text", "")))
            return
        data = item.data
        if item.depth == 0:
            self.agent = item.run_path[-1] if item.run_path else item.agent
            self.turn = item.turn
        if self.started is None and item.kind == "run_started":
            self.started = item.at
        kind = item.kind
        if kind in ("message", "steered"):  # a steer abandons the partial text
            self.streaming.pop(item.workflow_id, None)
        elif kind == "tool_call":
            call_id = str(data.get("call_id"))
            self.tools[f"{item.workflow_id}:{call_id}"] = ToolRow(
                call_id,
                str(data.get("name")),
                summarize_call(str(data.get("name")), str(data.get("arguments", "")), 60),
                path,
                item.at,
            )
        elif kind == "tool_result":
            row = self.tools.get(f"{item.workflow_id}:{data.get('call_id')}")
            if row is not None:
                row.ended = item.at
                unknown = row.status == "unknown" and data.get("is_error")
                row.status = "unknown" if unknown else "error" if data.get("is_error") else "ok"
        elif kind == "tool_outcome_unknown":
            row = self.tools.get(f"{item.workflow_id}:{data.get('call_id')}")
            if row is not None:
                row.status = "unknown"
        elif kind == "approval_requested":
            call = summarize_call(str(data.get("tool")), str(data.get("arguments", "")), 60)
            self.approvals[str(data.get("call_id"))] = f"{call} ({path})"
            for row in self.tools.values():
                if row.call_id == data.get("call_id"):
                    row.status = "approval"
        elif kind == "approval_answered":
            self.approvals.pop(str(data.get("call_id")), None)
            for row in self.tools.values():
                if row.call_id == data.get("call_id") and row.status == "approval":
                    row.status = "running"
        elif kind == "subagent_started":
            self.tasks[f"{item.workflow_id}:{data.get('id')}"] = Task(
                str(data.get("id")), str(data.get("agent"))
            )
        elif kind == "subagent_finished":
            task = self.tasks.get(f"{item.workflow_id}:{data.get('id')}")
            if task is not None:
                task.status = str(data.get("status"))
        elif kind == "final" and item.depth == 0:
            self.output = data.get("output")
            self.status = "completed"
        elif kind == "error" and item.depth == 0:
            self.status = "failed"
        self.log.append(f"{path:<24} {kind:<17} {describe(item)}")
        del self.log[:-MAX_LOG_LINES]

    # --- rendering ------------------------------------------------------------------------------

    def render(self) -> RenderableType:
        elapsed = _seconds(self.started, None)
        tokens = "?" if self.tokens is None else f"{self.tokens:,}"
        header = Text.assemble(
            ("run ", "dim"),
            (self.run_id, "bold"),
            ("  ·  ", "dim"),
            (self.status, "green" if self.status == "completed" else "yellow"),
            ("  ·  agent ", "dim"),
            (self.agent or "?", "bold cyan"),
            ("  ·  turn ", "dim"),
            (str(self.turn), "bold"),
            ("  ·  tokens ", "dim"),
            (tokens, "bold"),
            ("  ·  cost ", "dim"),
            (self.cost or "?", "bold"),
            ("  ·  ", "dim"),
            (f"{elapsed:.0f}s" if elapsed is not None else "", ""),
        )
        parts: list[RenderableType] = [header]
        if self.tools:
            table = Table(
                box=None, show_header=True, header_style="dim", pad_edge=False, expand=False
            )
            table.add_column("tool call")
            table.add_column("run")
            table.add_column("time", justify="right")
            table.add_column("")
            for row in list(self.tools.values())[-MAX_TOOL_ROWS:]:
                seconds = _seconds(row.started, row.ended)
                mark = {
                    "ok": "[green]✓[/green]",
                    "error": "[red]✗[/red]",
                    "approval": "[yellow]waiting for approval[/yellow]",
                    "unknown": "[red]? outcome unknown[/red]",
                }.get(row.status, "[yellow]…[/yellow]")
                table.add_row(
                    escape(row.summary),
                    escape(row.path),
                    "" if seconds is None else f"{seconds:.2f}s",
                    mark,
                )
            parts.append(table)
        if self.approvals:
            lines = [
                f"{escape(call_id)}  {escape(what)}" for call_id, what in self.approvals.items()
            ]
            hint = f"\n[dim]relaykit approve {escape(self.run_id)} CALL_ID [--reject][/dim]"
            parts.append(
                Panel("\n".join(lines) + hint, title="pending approvals", border_style="yellow")
            )
        if self.tasks:
            parts.append(
                Text(
                    "background: "
                    + ", ".join(f"{t.id} ({t.agent}) {t.status}" for t in self.tasks.values()),
                    style="magenta",
                )
            )
        for path, written in self.streaming.values():
            shown = (
                written if len(written) <= MAX_STREAM_CHARS else "…" + written[-MAX_STREAM_CHARS:]
            )
            parts.append(Panel(Text(shown), title=f"{path} is writing", border_style="cyan"))
        if self.log:
            parts.append(Text("\n".join(self.log), style="dim"))
        return Group(*parts)


async def _refresh_usage(handle: RunHandle, state: WatchState) -> None:
    try:
        snapshot = await handle.state()
    except Exception:  # noqa: BLE001 - tokens are nice to have; the view goes on without them
        return
    state.tokens = snapshot.usage.total_tokens
    state.requests = snapshot.usage.requests
    state.cost = cost_text(snapshot.usage)
    if state.status not in ("completed", "failed"):
        state.status = snapshot.status


async def _closed_status(handle: RunHandle) -> str | None:
    description = await handle.workflow.describe()
    status = description.status
    if status in (None, WorkflowExecutionStatus.RUNNING):
        return None
    return {
        WorkflowExecutionStatus.COMPLETED: "completed",
        WorkflowExecutionStatus.FAILED: "failed",
        WorkflowExecutionStatus.CANCELED: "cancelled",
        WorkflowExecutionStatus.TERMINATED: "terminated",
        WorkflowExecutionStatus.TIMED_OUT: "timed out",
    }.get(status, status.name.lower())


async def watch_run(
    handle: RunHandle,
    console: Console,
    *,
    from_offset: int | str = 0,
    plain: bool | None = None,
    on_cursor: Callable[[str], None] | None = None,
) -> WatchState:
    """Follow ``handle`` until the run ends; returns what was seen."""
    state = WatchState(run_id=handle.id)
    finished_already = await _closed_status(handle) is not None
    live_view = not finished_already and console.is_terminal and not plain
    stream = handle.stream(from_offset=from_offset, deltas=live_view)
    last_refresh = 0.0
    if live_view:
        with Live(get_renderable=state.render, console=console, refresh_per_second=8):
            async for item in stream:
                state.apply(item)
                if on_cursor is not None:
                    on_cursor(state.cursor)
                if not item.is_delta and time.monotonic() - last_refresh > STATE_REFRESH_SECONDS:
                    last_refresh = time.monotonic()
                    await _refresh_usage(handle, state)
    else:
        async for item in stream:
            state.apply(item)
            if on_cursor is not None:
                on_cursor(state.cursor)
            console.print(log_line(item), highlight=False, markup=False, soft_wrap=True)
    await _refresh_usage(handle, state)
    state.status = await _closed_status(handle) or state.status
    return state


# --- relaykit runs ----------------------------------------------------------------------------


def age(started: datetime | None, now: datetime | None = None) -> str:
    if started is None:
        return "?"
    seconds = int(((now or datetime.now(UTC)) - started).total_seconds())
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{max(seconds, 0)}s"


def waiting_text(waiting: RunWaiting | None, now: datetime | None = None) -> str:
    """What an open run waits for, in a table cell."""
    if waiting is None:
        return ""
    words = {
        "approval": "approval",
        "unknown_outcome": "unknown outcome",
        "budget": "budget",
        "parent_budget": "parent's budget",
        "paused": "paused",
        "rate_limit": "rate limit",
        "backoff": "backoff",
        "stuck": "stuck",
    }
    text = words.get(waiting.reason, waiting.reason)
    if waiting.reason == "backoff" and waiting.next_try is not None:
        wait = max(int((waiting.next_try - (now or datetime.now(UTC))).total_seconds()), 0)
        text += f" (attempt {waiting.attempt}, in {wait}s)"
    return text


def runs_table(rows: list[RunRow]) -> Table:
    table = Table(box=None, header_style="bold", pad_edge=False)
    for column, justify in (
        ("RUN", "left"),
        ("STATUS", "left"),
        ("WAITING", "left"),
        ("AGENT", "left"),
        ("TENANT", "left"),
        ("AGE", "right"),
        ("ACTIVE", "right"),
        ("TOKENS", "right"),
        ("COST", "right"),
        ("BUILD", "left"),
    ):
        table.add_column(column, justify=justify)  # type: ignore[arg-type]
    for row in rows:
        name = row.run_id if row.parent is None else f"  {row.run_id}"
        table.add_row(
            escape(name),
            row.status,
            waiting_text(row.waiting),
            escape(row.agent),
            escape(row.tenant or ""),
            age(row.started),
            age(row.last_activity),
            "" if row.tokens is None else f"{row.tokens:,}",
            "" if row.cost_usd is None else format_usd(row.cost_usd),
            escape(row.build_id or ""),
        )
    return table
