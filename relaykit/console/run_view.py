"""What a run's page shows, read from Temporal: the run's own queries (``state``, ``events``),
its description, and visibility for its children (``RelayParentRun``), recursively.

Nothing here writes: reading a run adds nothing to its history. A run whose worker does not
answer (none polls its queue, or a codec this process lacks) still has a page: the parts that
need the worker say why they are missing.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus
from temporalio.service import RPCError, RPCStatusCode

from relaykit.client import get_run
from relaykit.console.listing import ConsoleRow, children_query, row_of
from relaykit.runs import RunEvent, RunSnapshot

QUERY_TIMEOUT = 5.0
CHILD_DEPTH = 4
CHILDREN_PER_RUN = 100

CONVERSATION_KINDS = frozenset(
    {
        "run_started",
        "message",
        "tool_call",
        "tool_result",
        "tool_outcome_unknown",
        "handoff",
        "approval_requested",
        "approval_answered",
        "message_injected",
        "steered",
        "paused",
        "resumed",
        "budget_reached",
        "budget_changed",
        "subagent_started",
        "subagent_finished",
        "error",
        "final",
    }
)


class RunNotFound(Exception):
    pass


@dataclass
class ChildNode:
    row: ConsoleRow
    children: list[ChildNode] = field(default_factory=list)


@dataclass
class RunView:
    run_id: str
    status: str
    open: bool
    task_queue: str
    row: ConsoleRow
    snapshot: RunSnapshot | None = None
    events: list[RunEvent] = field(default_factory=list)
    unreadable: str | None = None
    """Why the run's own queries could not be read, when they could not."""
    children: list[ChildNode] = field(default_factory=list)
    cost_by_agent: dict[str, float] = field(default_factory=dict)

    @property
    def last_turn(self) -> int:
        return max((event.turn for event in self.events), default=0)


def _why(exc: BaseException) -> str:
    from relaykit.codec import describe_decode_error

    decoded = describe_decode_error(exc)
    if decoded is not None:
        return str(decoded)
    if isinstance(exc, TimeoutError):
        return f"no worker answered within {QUERY_TIMEOUT:g} s"
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


async def _children(client: Client, run_id: str, depth: int) -> list[ChildNode]:
    if depth <= 0:
        return []
    nodes = [
        ChildNode(row_of(execution))
        async for execution in client.list_workflows(children_query(run_id), limit=CHILDREN_PER_RUN)
    ]
    nodes.sort(key=lambda node: (node.row.started is None, node.row.started))
    grand = await asyncio.gather(*(_children(client, n.row.run_id, depth - 1) for n in nodes))
    for node, below in zip(nodes, grand, strict=True):
        node.children = below
    return nodes


def _walk(nodes: list[ChildNode]) -> list[ConsoleRow]:
    rows = []
    for node in nodes:
        rows.append(node.row)
        rows.extend(_walk(node.children))
    return rows


def cost_by_agent(events: list[RunEvent], children: list[ChildNode]) -> dict[str, float]:
    """USD per agent: the run's own model calls by the agent that made them, and each child
    run's own total under its agent (calls without a price count nothing)."""
    costs: dict[str, float] = defaultdict(float)
    for event in events:
        if event.kind == "model_call" and event.data.get("cost") is not None:
            costs[event.agent] += float(event.data["cost"])
    for row in _walk(children):
        if row.cost:
            costs[row.agent or row.run_id] += row.cost
    return dict(sorted(costs.items(), key=lambda item: -item[1]))


async def read_run(client: Client, run_id: str) -> RunView:
    handle = get_run(client, run_id)
    try:
        description = await handle.workflow.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise RunNotFound(run_id) from None
        raise
    row = row_of(description)
    view = RunView(
        run_id=run_id,
        status=row.status,
        open=description.status == WorkflowExecutionStatus.RUNNING,
        task_queue=description.task_queue,
        row=row,
    )
    children = asyncio.ensure_future(_children(client, run_id, CHILD_DEPTH))
    try:
        view.events = await asyncio.wait_for(handle.events(), QUERY_TIMEOUT)
        if view.open:
            view.snapshot = await asyncio.wait_for(handle.state(), QUERY_TIMEOUT)
    except RPCError as exc:
        if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
            children.cancel()
            raise  # Temporal itself is gone: the page that says so and retries
        view.unreadable = f"Temporal: {exc.message}"  # e.g. no worker polls its task queue
    except Exception as exc:  # noqa: BLE001 - the page says why
        view.unreadable = _why(exc)
    view.children = await children
    view.cost_by_agent = cost_by_agent(view.events, view.children)
    return view


async def events_since(client: Client, run_id: str, offset: int) -> list[RunEvent]:
    """The run's events from ``offset`` on (the live part of a run's page polls this)."""
    return await asyncio.wait_for(get_run(client, run_id).events(offset), QUERY_TIMEOUT)


def arguments_text(raw: Any) -> str:
    """A tool call's arguments as indented JSON (as the model wrote them when not JSON)."""
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return str(raw)
    return json.dumps(raw, indent=2, ensure_ascii=False)
