"""Watching a run live: its events, its child runs' events, and the model's text as it is written.

Design (the measurements behind it are in ``docs/observability.md``):

- **Events** are the run's own ordered log (:class:`relaykit.runs.RunEvent`, the ``events``
  query). Reading it is a query: it writes no event, however many people watch. (One exception,
  Temporal's own: a query that reaches a run while a workflow task waits for its local activity
  makes the core SDK end that task early and run another one for the rest, three events with no
  command. The run does the same work either way.)
- **Child runs** (agent-as-tool children and background subagents) keep their own logs. The
  stream follows them *client-side*: a parent's ``tool_call`` event for an agent tool and its
  ``subagent_started`` event name the child's workflow id, and the stream reads that child's log
  as well. Children's events already carry the full run path from the root (a child run starts
  with its parent's path), so nothing is rewritten. Signalling every child event up to the parent
  would instead add a signal, and a workflow task, to the history of every ancestor per child
  turn; following children from the client costs their history nothing.
- **Token deltas** never enter workflow history. A streaming model call (``ModelSpec.stream``)
  heartbeats the text written so far (:class:`ModelProgress`); Temporal keeps the latest
  heartbeat details of a pending activity on the server, where ``DescribeWorkflowExecution``
  shows them to any client on any machine. Heartbeat details are not history events, and the
  final message reaches history once, as the activity's result.

Polling is cheap: each round costs one ``describe`` per open run (served by the Temporal server,
no worker involved); the ``events`` query (served by a worker) runs only when the run's history
length changed, which is the only time its log can have grown.

Ordering guarantees of :func:`stream_run`:

- events of one run come in ``seq`` order, each exactly once (resume with a cursor);
- a child's events come after the parent event that started it, and an agent-as-tool child's
  events all come before the parent's ``tool_result`` for that call (likewise for a finished
  background task and the parent's ``subagent_finished``);
- before each ``message`` event, the ``delta`` items since the run's previous model call (or
  since a delta with ``reset``) add up to the message's text: whatever the stream did not see
  live is sent as one last delta.

An approval requested inside a child run is also recorded by each ancestor (that is how it
reaches the root); the merged stream shows it once, from the run that owns the call.
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.client import Client, WorkflowExecutionStatus, WorkflowHandle
from temporalio.service import RPCError, RPCStatusCode

from relaykit.errors import RelaykitError
from relaykit.runs import MODEL_ACTIVITY, RunEvent, RunSnapshot

DELTA = "delta"
"""``StreamEvent.kind`` of a piece of model text (every other kind is a :class:`RunEvent` kind)."""

DEFAULT_POLL_INTERVAL = 0.1
"""Seconds between two reads of a run that had nothing new."""
DEFAULT_DELTA_INTERVAL = timedelta(milliseconds=200)
"""How often a streaming model call sends its text to the server at most (the worker's
``max_heartbeat_throttle_interval``)."""
MAX_STREAMED_CHARS = 64_000
"""A model call stops publishing its text past this size (the message event still has it all)."""
QUERY_TIMEOUT = timedelta(seconds=15)


# --------------------------------------------------------------------------------------------
# Worker side: publishing the text of a streaming model call
# --------------------------------------------------------------------------------------------


class ModelProgress(BaseModel):
    """Heartbeat details of a streaming model call: the text this attempt has written so far.

    The attempt is part of it because Temporal keeps the previous attempt's details until the
    new attempt heartbeats for the first time.
    """

    attempt: int
    text: str = ""
    truncated: bool = False
    waiting: str | None = None
    """Why the call has not been sent yet (``"rate limited by openai until 12:04:31"``: see
    :mod:`relaykit.models.backpressure`); ``None`` once it is."""


class DeltaPublisher:
    """Collects the pieces of one model call and heartbeats the text so far.

    ``heartbeat`` is called by the provider code on every stream event. Each call would encode
    the whole text again, so calls closer than ``interval`` are folded into one sent at the end
    of the interval (the Temporal worker throttles what reaches the server on top of this).
    """

    def __init__(
        self,
        send: Any,
        attempt: int,
        *,
        interval: float = 0.05,
        max_chars: int = MAX_STREAMED_CHARS,
    ) -> None:
        self._send = send
        self._attempt = attempt
        self._interval = interval
        self._max_chars = max_chars
        self._parts: list[str] = []
        self._chars = 0
        self._truncated = False
        self._last_sent = 0.0
        self._trailing: asyncio.TimerHandle | None = None

    @property
    def text(self) -> str:
        return "".join(self._parts)

    def on_delta(self, piece: str) -> None:
        if self._truncated or not piece:
            return
        room = self._max_chars - self._chars
        if len(piece) > room:
            piece = piece[:room]
            self._truncated = True
        self._parts.append(piece)
        self._chars += len(piece)
        # The provider code heartbeats before handing over an event's text: publish it too.
        self.heartbeat()

    def heartbeat(self) -> None:
        now = time.monotonic()
        if now - self._last_sent >= self._interval:
            self._flush()
        elif self._trailing is None:
            loop = asyncio.get_running_loop()
            delay = self._interval - (now - self._last_sent)
            self._trailing = loop.call_later(delay, self._flush)

    def _flush(self) -> None:
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None
        self._last_sent = time.monotonic()
        if len(self._parts) > 1:
            self._parts = [self.text]
        self._send(ModelProgress(attempt=self._attempt, text=self.text, truncated=self._truncated))

    def close(self) -> None:
        if self._trailing is not None:
            self._trailing.cancel()
            self._trailing = None


# --------------------------------------------------------------------------------------------
# Client side: what a stream yields, and where to resume it
# --------------------------------------------------------------------------------------------


class StreamEvent(BaseModel):
    """One item of a run's live stream: a :class:`RunEvent` of the run or of one of its child
    runs, or (``kind == "delta"``) a piece of text a model is writing.

    ``seq`` is the event's place in the log of the run that produced it (``workflow_id``); for
    a delta it is the ``seq`` the run's next event will have. ``cursor`` resumes the stream right
    after this item: ``handle.stream(from_offset=item.cursor)``.
    """

    kind: str
    seq: int
    agent: str
    turn: int
    run_path: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime | None = None
    workflow_id: str
    depth: int = 0
    """0 for the root run's own items, 1 for its children's, and so on."""
    cursor: str = ""

    @property
    def is_delta(self) -> bool:
        return self.kind == DELTA


ChildKind = Literal["tool", "task"]


class RunCursor(BaseModel):
    """Where the stream stands in one run's log."""

    seq: int = 0
    parent: str | None = None
    key: str | None = None
    """The parent's call id (agent tool) or task id (subagent) that started this run."""
    kind: ChildKind | None = None
    depth: int = 0
    done: bool = False
    delta: tuple[str, int, int] | None = None
    """(activity id, attempt, characters already yielded) of the model call being streamed."""


class StreamCursor(BaseModel):
    """Resume point of a stream over a run and its children (opaque to most callers: pass the
    ``cursor`` string of the last :class:`StreamEvent` you handled)."""

    root: str
    runs: dict[str, RunCursor] = Field(default_factory=dict)

    def encode(self) -> str:
        raw = json.dumps(self.model_dump(exclude_defaults=True), separators=(",", ":"))
        return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")

    @classmethod
    def decode(cls, token: str) -> StreamCursor:
        try:
            raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
            return cls.model_validate_json(raw)
        except ValueError as exc:
            raise RelaykitError(
                f"not a stream cursor: {token[:40]!r}",
                hint="pass the `cursor` of a StreamEvent, or an event sequence number",
            ) from exc


@dataclass
class _Delta:
    activity_id: str
    attempt: int
    chars: int = 0
    text: str | None = ""
    """What was yielded (``None`` after a resume: only its length is known)."""


@dataclass
class _Run:
    id: str
    handle: WorkflowHandle[Any, Any]
    seq: int = 0
    parent: str | None = None
    key: str | None = None
    kind: ChildKind | None = None
    depth: int = 0
    done: bool = False
    seen: bool = False
    history_length: int | None = None
    agent: str = ""
    turn: int = 0
    run_path: list[str] = field(default_factory=list)
    delta: _Delta | None = None


_OPEN = (None, WorkflowExecutionStatus.RUNNING, WorkflowExecutionStatus.CONTINUED_AS_NEW)


class RunStream:
    """Reads a run (and its child runs) and yields :class:`StreamEvent` items in order."""

    def __init__(
        self,
        client: Client,
        workflow_id: str,
        from_offset: int | str | StreamCursor = 0,
        *,
        children: bool = True,
        deltas: bool = True,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> None:
        self.client = client
        self.children = children
        self.deltas = deltas
        self.poll_interval = poll_interval
        self.runs: dict[str, _Run] = {}
        self.owners: dict[str, str] = {}
        """Approval call id → workflow id of the run that owns the call."""
        if isinstance(from_offset, str) and not from_offset.lstrip("-").isdigit():
            from_offset = StreamCursor.decode(from_offset)
        if isinstance(from_offset, StreamCursor):
            if from_offset.root != workflow_id:
                raise RelaykitError(
                    f"the cursor belongs to run {from_offset.root!r}, not {workflow_id!r}"
                )
            for wid, rc in from_offset.runs.items():
                run = self._add(wid, rc.parent, rc.key, rc.kind, seq=rc.seq)
                run.done, run.depth = rc.done, rc.depth
                if rc.delta is not None:
                    run.delta = _Delta(rc.delta[0], rc.delta[1], rc.delta[2], None)
            if workflow_id not in self.runs:
                self._add(workflow_id, None, None, None)
        else:
            self._add(workflow_id, None, None, None, seq=max(int(from_offset), 0))
        self.root = self.runs[workflow_id]

    def _add(
        self, wid: str, parent: str | None, key: str | None, kind: ChildKind | None, seq: int = 0
    ) -> _Run:
        run = self.runs.get(wid)
        if run is None:
            run = _Run(wid, self.client.get_workflow_handle(wid), seq, parent, key, kind)
            if parent is not None and parent in self.runs:
                run.depth = self.runs[parent].depth + 1
            self.runs[wid] = run
        return run

    def cursor(self) -> str:
        return StreamCursor(
            root=self.root.id,
            runs={
                r.id: RunCursor(
                    seq=r.seq,
                    parent=r.parent,
                    key=r.key,
                    kind=r.kind,
                    depth=r.depth,
                    done=r.done,
                    delta=(r.delta.activity_id, r.delta.attempt, r.delta.chars)
                    if r.delta
                    else None,
                )
                for r in self.runs.values()
                # A finished child is not needed to resume: its parent's later events no
                # longer refer to it.
                if r is self.root or not r.done
            },
        ).encode()

    # --- the loop -------------------------------------------------------------------------------

    async def __aiter__(self) -> AsyncIterator[StreamEvent]:
        while True:
            progressed = False
            for run in list(self.runs.values()):
                if run.done:
                    continue
                async for item in self._poll(run):
                    progressed = True
                    yield item
            if self.root.done:
                # Children still open now were abandoned by the root (detached tasks): read what
                # they have, once, and stop.
                for run in list(self.runs.values()):
                    if not run.done:
                        async for item in self._poll(run, last=True):
                            yield item
                return
            if not progressed:
                await asyncio.sleep(self.poll_interval)

    async def _drain(self, run: _Run) -> AsyncIterator[StreamEvent]:
        """Read ``run`` to its end: its parent has its result (or its report), so it has ended
        or is about to; a run that does not exist by now was never started."""
        while not run.done:
            got = False
            async for item in self._poll(run, missing_is_final=True):
                got = True
                yield item
            if not got and not run.done:
                await asyncio.sleep(self.poll_interval)

    async def _poll(
        self, run: _Run, *, last: bool = False, missing_is_final: bool = False
    ) -> AsyncIterator[StreamEvent]:
        try:
            description = await run.handle.describe()
        except RPCError as exc:
            if exc.status != RPCStatusCode.NOT_FOUND:
                raise
            if run is self.root:
                raise RelaykitError(f"no run with id {run.id!r}") from None
            if run.seen or last or missing_is_final:
                run.done = True
            return
        run.seen = True
        closed = description.status not in _OPEN
        length = description.raw_description.workflow_execution_info.history_length
        got_events = False
        if closed or length != run.history_length:
            events = await self._events(run)
            run.history_length = length
            for event in events:
                got_events = True
                async for item in self._on_event(run, event):
                    yield item
        if closed:
            run.done = True
            run.delta = None
        elif self.deltas and not got_events and not last:
            # Only when the log had nothing new: this description was taken before the query,
            # so a model call it shows as pending has not produced its message event yet.
            async for item in self._deltas(run, description):
                yield item

    async def _events(self, run: _Run) -> list[RunEvent]:
        try:
            events: list[RunEvent] = await run.handle.query(
                "events", run.seq, result_type=list[RunEvent], rpc_timeout=QUERY_TIMEOUT
            )
            return events
        except RPCError as exc:
            raise RelaykitError(
                f"cannot read the events of run {run.id!r}: {exc.message}",
                hint="reading a run's events is a query: a worker serving its task queue must be "
                "running (also for finished runs)",
            ) from None

    # --- events ---------------------------------------------------------------------------------

    def _item(self, run: _Run, **fields: Any) -> StreamEvent:
        return StreamEvent(workflow_id=run.id, depth=run.depth, **fields)

    async def _on_event(self, run: _Run, event: RunEvent) -> AsyncIterator[StreamEvent]:
        if event.seq < run.seq:
            return
        data = event.data
        if self.children:
            child = self._child_for(run, event)
            if child is not None and not child.done:
                async for item in self._drain(child):
                    yield item
        if event.kind == "message" and self.deltas:
            run.seq = event.seq
            tail = self._close_delta(run, str(data.get("text", "")))
            if tail is not None:
                yield self._stamp(tail)
        # A steer abandons the text of the call in flight: what follows is a new call's.
        if event.kind in ("message", "context_compacted", "continued_as_new", "steered"):
            run.delta = None
        run.seq = event.seq + 1
        run.agent, run.turn, run.run_path = event.agent, event.turn, list(event.run_path)
        if event.kind == "handoff" and event.data.get("to"):
            # The event carries its emitter's path (the source); what follows is the target's.
            run.agent = str(event.data["to"])
            run.run_path = [*event.run_path, run.agent]
        if self.children:
            self._discover(run, event)
        if self._duplicate(run, event):
            return
        yield self._stamp(self._item(run, **event.model_dump()))

    def _stamp(self, item: StreamEvent) -> StreamEvent:
        item.cursor = self.cursor()
        return item

    def _child_for(self, run: _Run, event: RunEvent) -> _Run | None:
        """The child whose events must all come before ``event`` of its parent."""
        key: str | None = None
        kind: ChildKind
        if event.kind == "tool_result":
            key, kind = event.data.get("call_id"), "tool"
        elif event.kind == "subagent_finished" and event.data.get("status") in (
            "finished",
            "failed",
        ):
            key, kind = event.data.get("id"), "task"
        else:
            return None
        for child in self.runs.values():
            if child.parent == run.id and child.key == key and child.kind == kind:
                return child
        return None

    def _discover(self, run: _Run, event: RunEvent) -> None:
        wid = event.data.get("workflow_id")
        if not isinstance(wid, str) or not wid or wid == run.id:
            return
        if event.kind == "tool_call":
            self._add(wid, run.id, event.data.get("call_id"), "tool")
        elif event.kind == "subagent_started":
            self._add(wid, run.id, event.data.get("id"), "task")

    def _duplicate(self, run: _Run, event: RunEvent) -> bool:
        """Approval events an ancestor recorded for a child's call (shown once, by the owner)."""
        if not self.children:
            return False
        call_id = event.data.get("call_id")
        if event.kind == "approval_requested" and isinstance(call_id, str):
            owner = event.data.get("workflow_id") or run.id
            self.owners.setdefault(call_id, owner)
        elif event.kind == "approval_answered" and isinstance(call_id, str):
            owner = self.owners.get(call_id, run.id)
        else:
            return False
        # Every descendant's id starts with the root's: the stream follows (or followed) it.
        return owner != run.id and owner.startswith(f"{self.root.id}/")

    # --- model text -----------------------------------------------------------------------------

    def _delta_item(self, run: _Run, text: str, *, reset: bool) -> StreamEvent:
        assert run.delta is not None
        data: dict[str, Any] = {
            "text": text,
            "call": run.delta.activity_id,
            "attempt": run.delta.attempt,
        }
        if reset:
            data["reset"] = True
        agent = run.run_path[-1] if run.run_path else run.agent
        return self._item(
            run,
            kind=DELTA,
            seq=run.seq,
            agent=agent,
            turn=run.turn,
            run_path=run.run_path,
            data=data,
        )

    def _close_delta(self, run: _Run, message: str) -> StreamEvent | None:
        """The model call that wrote ``message`` is over: send what the stream did not see.

        The delta stays open (with all of ``message`` counted) until the message event itself
        is yielded, so a stream resumed in between does not send the text again.
        """
        open_ = run.delta
        if open_ is None:
            if not message:
                return None
            run.delta = _Delta("", 0, len(message), message)
            return self._delta_item(run, message, reset=False)
        if open_.text is None or message.startswith(open_.text):
            tail, reset = message[open_.chars :], False
        else:
            tail, reset = message, True
        open_.chars, open_.text = len(message), message
        if not tail and not reset:
            return None
        return self._delta_item(run, tail, reset=reset)

    async def _deltas(self, run: _Run, description: Any) -> AsyncIterator[StreamEvent]:
        for pending in description.raw_description.pending_activities:
            if pending.activity_type.name != MODEL_ACTIVITY:
                continue
            payloads = list(pending.heartbeat_details.payloads)
            if not payloads:
                continue
            try:
                [progress] = await self.client.data_converter.decode(payloads, [ModelProgress])
            except Exception:  # noqa: BLE001 - not ours (an older worker): nothing to show
                continue
            if not isinstance(progress, ModelProgress) or progress.attempt != pending.attempt:
                continue  # the previous attempt's text, until the new attempt heartbeats
            reset = False
            open_ = run.delta
            if open_ is None or open_.activity_id != pending.activity_id:
                run.delta = _Delta(pending.activity_id, pending.attempt)
                await self._refresh_position(run)
            elif open_.attempt != pending.attempt:
                reset = open_.chars > 0
                run.delta = _Delta(pending.activity_id, pending.attempt)
            delta = run.delta
            assert delta is not None
            if len(progress.text) > delta.chars or reset:
                piece = progress.text[delta.chars :]
                delta.chars = len(progress.text)
                if delta.text is not None:
                    delta.text += piece
                yield self._stamp(self._delta_item(run, piece, reset=reset))

    async def _refresh_position(self, run: _Run) -> None:
        """A new model call: learn its turn and agent (the last event may be from the previous
        turn)."""
        try:
            snapshot: RunSnapshot = await run.handle.query(
                "state", result_type=RunSnapshot, rpc_timeout=QUERY_TIMEOUT
            )
        except RPCError:
            return
        run.turn = snapshot.turn
        if not run.run_path or run.run_path[-1] != snapshot.agent:
            run.run_path = (
                [*run.run_path[:-1], snapshot.agent] if run.run_path else [snapshot.agent]
            )
        run.agent = snapshot.agent


def stream_run(
    client: Client,
    workflow_id: str,
    from_offset: int | str | StreamCursor = 0,
    *,
    children: bool = True,
    deltas: bool = True,
    poll_interval: float = DEFAULT_POLL_INTERVAL,
) -> AsyncIterator[StreamEvent]:
    """The live stream of run ``workflow_id`` (see :meth:`relaykit.RunHandle.stream`)."""
    return RunStream(
        client,
        workflow_id,
        from_offset,
        children=children,
        deltas=deltas,
        poll_interval=poll_interval,
    ).__aiter__()
