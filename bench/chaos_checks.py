"""The fuzzer's invariants, read from what is outside the workers: Temporal histories (every
run of every continue-as-new chain, every child), the scripted model server's recorded requests
and the file every write appends its start to."""

from __future__ import annotations

import collections
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.history.v1 import History
from temporalio.client import Client

from bench.chaos_model import (
    content_text,
    conversation,
    is_summary,
    is_top_level,
    turn_of,
    whole_text,
)
from relaykit.testing.scripted_server import ScriptedRequest

BENIGN_TASK_FAILURES = {
    # The server refused the task's completion because a signal or update arrived while it ran;
    # the SDK runs the task again with it. Temporal's own optimistic concurrency, not a fault.
    "WORKFLOW_TASK_FAILED_CAUSE_UNHANDLED_COMMAND",
    # A worker was told to drop its cached copy of the run (sticky queue reset after a kill).
    "WORKFLOW_TASK_FAILED_CAUSE_RESET_STICKY_TASK_QUEUE",
}
WRITE_KINDS = ("charge", "work", "handoff")
"""Starts that must happen once per call: the two write tools and the ``on_handoff`` callback."""


# --- histories -----------------------------------------------------------------------------------


async def workflow_tree(client: Client, workflow_id: str, run_id: str | None) -> list[Any]:
    """(workflow id, run id, events) of the run, every later run of its continue-as-new chain,
    and every child workflow, recursively."""
    found: list[Any] = []
    todo: list[tuple[str, str | None]] = [(workflow_id, run_id)]
    seen: set[tuple[str, str | None]] = set()
    while todo:
        wid, rid = todo.pop()
        if (wid, rid) in seen:
            continue
        seen.add((wid, rid))
        handle = client.get_workflow_handle(wid, run_id=rid)
        events = [e async for e in handle.fetch_history_events()]
        found.append((wid, rid, events))
        for e in events:
            if e.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                child = e.child_workflow_execution_started_event_attributes.workflow_execution
                todo.append((child.workflow_id, child.run_id))
            elif e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                attrs = e.workflow_execution_continued_as_new_event_attributes
                todo.append((wid, attrs.new_execution_run_id))
    return found


def task_failures(tree: Iterable[Any]) -> tuple[list[str], list[str]]:
    """Workflow task failures in the tree: (wedges, benign ones), one line each with the
    workflow, the cause and the failure's message."""
    wedges: list[str] = []
    benign: list[str] = []
    for wid, _rid, events in tree:
        for e in events:
            if e.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                continue
            attrs = e.workflow_task_failed_event_attributes
            cause = WorkflowTaskFailedCause.Name(attrs.cause)
            message = attrs.failure.message.strip().splitlines()[0] if attrs.failure.message else ""
            if not message and attrs.failure.HasField("application_failure_info"):
                message = f"(no message) {attrs.failure.application_failure_info.type}"
            if attrs.failure.stack_trace:  # where it was raised: the last frame
                frames = [ln.strip() for ln in attrs.failure.stack_trace.splitlines() if ln.strip()]
                message += f" at {frames[-2] if len(frames) > 1 else frames[-1]}"
            line = f"{wid} event {e.event_id}: {cause}: {message[:300]}"
            (benign if cause in BENIGN_TASK_FAILURES else wedges).append(line)
    return wedges, benign


def save_failed_histories(tree: Iterable[Any], folder: Path) -> None:
    """Each workflow run of the tree with a failed workflow task, as ``history-<n>.json``
    (the format ``temporal workflow show -o json`` writes, with the workflow id added, which
    ``WorkflowHistory.from_json`` and ``relaykit replay-check --histories`` read)."""
    for n, (wid, _rid, events) in enumerate(tree):
        if any(e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED for e in events):
            history = History(events=list(events))
            (folder / f"history-{n}.json").write_text(
                json.dumps({"workflow_id": wid, **MessageToDict(history)})
            )


# --- writes --------------------------------------------------------------------------------------


def repeated_writes(log: Path) -> list[str]:
    """Write starts seen more than once for one key (a call's idempotency key, or a handoff's
    workflow and turn). No person can approve a write again here: the write tools keep the
    default ``on_unknown="report"``, so a second start is always a silent repeat."""
    if not log.exists():
        return []
    starts = collections.Counter(
        tuple(line.split(" ", 1)) for line in log.read_text(encoding="utf-8").splitlines() if line
    )
    return [
        f"{kind} {key} started {n} times"
        for (kind, key), n in sorted(starts.items())
        if kind in WRITE_KINDS and n > 1
    ]


def mcp_write_starts(log: Path) -> collections.Counter[str]:
    """Starts of the MCP server's write (``slow_write``) by the call's ref, from the log the
    server appends to (``pid tool phase argument``)."""
    if not log.exists():
        return collections.Counter()
    starts: collections.Counter[str] = collections.Counter()
    for line in log.read_text(encoding="utf-8").splitlines():
        parts = line.split(" ", 3)
        if len(parts) == 4 and parts[1:3] == ["slow_write", "start"]:
            starts[parts[3]] += 1
    return starts


def mcp_write_calls(trees: Iterable[list[Any]]) -> collections.Counter[str]:
    """The MCP write's calls by ref, from the runs' histories: one scheduled activity per call
    (a fork runs the turns after its fork point again, with the same refs, as calls of its own).
    """
    calls: collections.Counter[str] = collections.Counter()
    for tree in trees:
        for _, _, events in tree:
            for e in events:
                if e.event_type != EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                    continue
                attrs = e.activity_task_scheduled_event_attributes
                if attrs.activity_type.name != "mcp:docs/slow_write":
                    continue
                try:
                    request = json.loads(attrs.input.payloads[0].data)
                    ref = json.loads(request.get("arguments") or "{}").get("ref", "")
                except (ValueError, IndexError, AttributeError):
                    continue
                calls[json.dumps(ref, ensure_ascii=False)] += 1
    return calls


def repeated_mcp_writes(log: Path, calls: collections.Counter[str]) -> list[str]:
    """An MCP write started more often than it was called (after a server or worker kill, the
    outcome of a claimed write is unknown and it is not sent again)."""
    return [
        f"MCP slow_write {ref} started {n} times for {calls[ref]} call(s)"
        for ref, n in sorted(mcp_write_starts(log).items())
        if n > calls[ref]
    ]


def repeated_reads(log: Path) -> list[str]:
    """Starts of the approval-gated read (``lookup``) seen more than once for one call: with no
    worker killed or stopped, an answered approval runs its tool once, however many answers
    raced for it."""
    if not log.exists():
        return []
    starts = collections.Counter(
        line.split(" ", 1)[1]
        for line in log.read_text(encoding="utf-8").splitlines()
        if line.startswith("lookup ")
    )
    return [f"lookup {key} started {n} times" for key, n in sorted(starts.items()) if n > 1]


def write_starts(log: Path) -> int:
    if not log.exists():
        return 0
    return sum(
        1
        for line in log.read_text(encoding="utf-8").splitlines()
        if line.split(" ", 1)[0] in WRITE_KINDS
    )


# --- model requests ------------------------------------------------------------------------------


def requests_of_run(
    requests: list[ScriptedRequest], fork_mark: str | None
) -> list[ScriptedRequest]:
    """The top-level requests of the original run (no fork mark) or of the fork with that mark.
    A fork's are found by its mark alone, not by the task they start with: a fork that lost
    the task (started from a summary prompt, say) must be compared, not skipped."""
    out = []
    for req in requests:
        if is_summary(req):
            continue
        said = whole_text(req)
        if fork_mark is None and is_top_level(req) and "FORK-" not in said:
            out.append(req)
        elif fork_mark is not None and fork_mark in said:
            out.append(req)
    return out


def _normal(message: dict[str, Any]) -> tuple[Any, ...]:
    calls = tuple(
        (c.get("id"), c.get("function", {}).get("name"), c.get("function", {}).get("arguments"))
        for c in message.get("tool_calls") or ()
    )
    return (message.get("role"), content_text(message), calls, message.get("tool_call_id"))


def through_last_turn(messages: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    """Up to the last model message and the results of its calls (what a fork keeps)."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
    if last < 0:
        return [_normal(m) for m in messages]
    ids = {c.get("id") for c in messages[last].get("tool_calls") or ()}
    end = last + 1
    while (
        end < len(messages)
        and messages[end].get("role") == "tool"
        and messages[end].get("tool_call_id") in ids
    ):
        end += 1
    return [_normal(m) for m in messages[:end]]


NOT_COMPARED = "not compared"


def fork_mismatch(requests: list[ScriptedRequest], mark: str, at_turn: int) -> str | None:
    """Why the fork's first request is not the original's request at turn ``at_turn + 1``
    (up to that turn's tool results), ``None`` when it is, or :data:`NOT_COMPARED` when there
    is nothing to compare."""
    mine = requests_of_run(requests, mark)
    if not mine:
        return NOT_COMPARED  # the fork made no model call (cancelled or failed first)
    sent = [m for m in conversation(mine[0]) if mark not in content_text(m)]
    forked = through_last_turn(sent)
    if forked and forked[-1][0] == "assistant" and not forked[-1][2]:
        return NOT_COMPARED  # forked from a final answer: the original has no next request
    originals = [r for r in requests_of_run(requests, None) if turn_of(r) == at_turn + 1]
    if not originals:
        return f"fork at turn {at_turn}: the original never sent a request for turn {at_turn + 1}"
    for req in originals:
        if through_last_turn(conversation(req)) == forked:
            return None
    want = through_last_turn(conversation(originals[-1]))
    diff = next(
        (i for i, (a, b) in enumerate(zip(want, forked, strict=False)) if a != b),
        min(len(want), len(forked)),
    )

    def show(ms: list[tuple[Any, ...]]) -> str:
        return repr(ms[diff])[:200] if diff < len(ms) else "(nothing)"

    return (
        f"fork at turn {at_turn}: its first request ({len(forked)} messages) differs from the "
        f"original's turn-{at_turn + 1} request ({len(want)} messages) at message {diff}: "
        f"original {show(want)} vs fork {show(forked)}"
    )


def steer_problems(
    requests: list[ScriptedRequest], mark: str, fork_mark: str | None, completed: bool
) -> list[str]:
    """An accepted steer or send reaches the run's model at most once per request, and at
    least once when the run completed."""
    mine = requests_of_run(requests, fork_mark)
    problems = [
        f"{mark} appears {n} times in request {req.index}"
        for req in mine
        if (n := whole_text(req).count(mark)) > 1
    ]
    if completed and not any(mark in whole_text(req) for req in mine):
        problems.append(f"{mark} was accepted but never reached the model of a completed run")
    return problems
