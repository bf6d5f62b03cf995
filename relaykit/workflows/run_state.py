"""The one owner of a run's state.

A run's state is data: :class:`relaykit.runs.RunState`, a pydantic model below everything, which
a continue-as-new carries to the next workflow run and queries read. :class:`Run` holds it for
one workflow run, together with what lives only as long as that workflow run (the background
signal tasks), and it is the only place with the primitives that change what people see of it:
the event log (:meth:`Run.emit`), the status, usage and the budget, and the typed failure that
ends the run (:meth:`Run.fail`).

Direction of data: :mod:`relaykit.workflows.loop` drives the run and is the only module that
decides (turn, switch, finish); the tool path, approvals, handoffs, child runs, MCP and long runs
receive the :class:`Run` they work on and return an outcome. Each part of the state has one
writer (:data:`STATE_WRITERS`). None of them imports the loop, and this module imports no other
module of :mod:`relaykit.workflows` but the transcript seam.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any, NoReturn

from temporalio import workflow
from temporalio.exceptions import ApplicationError

from relaykit import errors
from relaykit.agent import Agent
from relaykit.graph import AgentGraph
from relaykit.messages import Message, ModelResponse, ToolCall, Usage
from relaykit.runs import (
    AGENT_RUN_WORKFLOW,
    EventKind,
    RunEvent,
    RunInput,
    RunState,
    share_field_sets,
)
from relaykit.workflows.call_record import CallRecord, stand_in_agent
from relaykit.workflows.context import ContextTransport
from relaykit.workflows.run_setup import recorded_setup

STATE_WRITERS: dict[str, str] = {
    # the turn: what the run is doing now
    "agent": "loop",
    "turn": "loop",
    "transcript": "loop",
    "transcript_offset": "loop",
    "task": "loop",
    "output_retries": "loop",
    "run_path": "loop",
    # what everyone shares, through Run's methods
    "events": "run_state",
    "event_offset": "run_state",
    "status": "run_state",
    "usage": "run_state",
    "setup": "run_state",
    "mailbox": "run_state",
    "mailbox_by": "run_state",
    "paused": "run_state",
    "paused_by": "run_state",
    "spend": "spend",
    # one mechanism each
    "pending_approvals": "approvals",
    "decisions": "approvals",
    "tasks": "subagent_tasks",
    "report_queue": "subagent_tasks",
    "tasks_started": "subagent_tasks",
    "agent_tools_started": "agent_tools",
    "repeats": "loop_guard",
    "decision_markers": "call_record",
    "context_ref": "context",
    "context_ref_count": "context",
    "static_refs": "context",
    "runs": "long_runs",
}
"""Each part of :class:`relaykit.runs.RunState` and the one module of ``relaykit.workflows`` that
writes it (``tests/test_state_writers.py`` reads the code to hold every module to it). The others
read it, or ask its writer. ``long_runs`` writes the copy a continue-as-new carries, never the
running state."""

MAX_EVENTS_KEPT = 2_000
EVENTS_KEPT_ACROSS_RUNS = 200


class Run:
    """One agent run's state and the writes everyone shares (build it with the run's input)."""

    def __init__(self, graph: AgentGraph, run_input: RunInput) -> None:
        self.graph = graph
        self.input = run_input
        self.transport = ContextTransport(run_input.transcript_transport)
        if run_input.state is not None:
            self.state = run_input.state
        else:
            self.state = RunState(
                agent=run_input.agent,
                run_path=[*run_input.run_path, run_input.agent],
            )
        self.on_change: Callable[[], None] | None = None
        """Called after state a person can see changed (the workflow updates its UI details)."""
        self.workflow_type = AGENT_RUN_WORKFLOW
        self._background: list[asyncio.Task[Any]] = []
        self._stand_ins: dict[str, Agent] = {}

    @property
    def current_agent(self) -> Agent:
        """The agent whose turn it is. One today's code no longer defines (the run switched to it
        under earlier code) is a stand-in while the run replays; the turn loop fails the run
        with ``UnknownAgent`` before its next live turn (:meth:`end_if_agent_gone`)."""
        agent = self.graph.agents.get(self.state.agent)
        if agent is None:
            agent = self._stand_ins.get(self.state.agent)
            if agent is None:
                agent = self._stand_ins[self.state.agent] = stand_in_agent(self.state.agent)
        return agent

    def check_serves_run(self) -> None:
        """The run's current agent is not defined here. Live, a start for an agent this worker
        does not serve fails the run (``UnknownAgent``). Replaying, the run may have switched
        to it under older code (the turn loop stands in for it until its next live turn), but
        when this worker defines none of the agents on the run's path, the run is another
        application's on a shared task queue: this workflow task fails, and the run waits for
        a worker that serves it, rather than ending here."""
        served = ", ".join(sorted(self.graph.agents))
        if not workflow.unsafe.is_replaying():
            raise ApplicationError(
                f"unknown agent {self.state.agent!r}; this worker serves: {served}",
                type=errors.UNKNOWN_AGENT,
                non_retryable=True,
            )
        path = [self.input.agent, *self.input.run_path, *self.state.run_path]
        if not any(name in self.graph.agents for name in path):
            raise RuntimeError(
                f"this worker serves none of the agents of run {workflow.info().workflow_id} "
                f"({' → '.join(dict.fromkeys(path))}); it serves: {served}"
            )

    def end_if_agent_gone(self) -> None:
        """Fail the run with ``UnknownAgent`` when the current agent is not defined by today's
        code and the run is about to decide something new with it (never while replaying what
        it already did)."""
        if self.state.agent in self.graph.agents or workflow.unsafe.is_replaying():
            return
        self.fail(
            f"agent {self.state.agent!r} is not defined by this worker's code (the run switched "
            "to it under earlier code); this worker serves: "
            + ", ".join(sorted(self.graph.agents)),
            errors.UNKNOWN_AGENT,
        )

    @property
    def calls(self) -> CallRecord:
        """The recorded decisions of this run's tool calls (``RunSetup.recorded_calls``, and
        how: ``recorded_decisions``)."""
        return CallRecord(
            self.setup_flag("recorded_calls"),
            self.setup_flag("recorded_decisions"),
            self.state if self.setup_flag("bounded_decision_markers") else None,
        )

    def setup_flag(self, name: str) -> bool:
        """A recorded choice of :class:`relaykit.runs.RunSetup` (the worker's configuration
        before it is recorded)."""
        source: Any = self.state.setup if self.state.setup is not None else self.graph
        return bool(getattr(source, name, False))

    def patched(self, patch_id: str) -> bool:
        """``workflow.patched`` for the changes made before runs recorded their call decisions:
        every run that records them has those changes, so no marker is written or read for
        them, and none lands between a call's recorded decisions, whose order a replay must
        match exactly (relaykit.workflows.call_record)."""
        if self.setup_flag("recorded_calls"):
            return True
        return workflow.patched(patch_id)

    def record_setup(self) -> None:
        """Decide, once per run, what depends on the worker's configuration and changes the
        commands a run issues (:func:`relaykit.workflows.run_setup.recorded_setup`), and keep it
        in the state a continue-as-new carries."""
        if self.state.setup is None:
            self.state.setup = recorded_setup(self.graph)

    # --- events and status ----------------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        data: dict[str, Any],
        *,
        agent: str | None = None,
        run_path: list[str] | None = None,
    ) -> None:
        events = self.state.events
        event = RunEvent(
            seq=self.state.event_offset + len(events),
            kind=kind,
            agent=agent or self.state.agent,
            turn=self.state.turn,
            run_path=list(self.state.run_path if run_path is None else run_path),
            data=data,
            at=workflow.now(),
        )
        share_field_sets(event)  # a run keeps up to MAX_EVENTS_KEPT of them
        events.append(event)
        if len(events) > MAX_EVENTS_KEPT:
            drop = len(events) - MAX_EVENTS_KEPT
            del events[:drop]
            self.state.event_offset += drop
        self._changed()

    def events_from(self, offset: int) -> list[RunEvent]:
        start = max(offset - self.state.event_offset, 0)
        return self.state.events[start:]

    def set_status(self, status: Any) -> None:
        self.state.status = status
        self._changed()

    def _changed(self) -> None:
        if self.on_change is not None:
            self.on_change()

    def tool_message(self, call: ToolCall, content: str, *, is_error: bool = False) -> Message:
        """A tool result in the transcript, attributed to the agent whose turn it is."""
        return Message.tool_result(call, content, is_error=is_error).model_copy(
            update={"agent": self.state.agent}
        )

    # --- what people send: messages and pauses (the workflow's signal and update handlers) ------

    def queue_message(self, text: str, by: str = "") -> int:
        """A user message for the next turn boundary and who sent it; returns its place."""
        self.state.mailbox.append(text)
        self.state.mailbox_by.append(by)
        return len(self.state.mailbox)

    def take_messages(self) -> list[tuple[str, str]]:
        """At a turn boundary: the queued messages in order, each with who sent it."""
        state = self.state  # messages carried from before names were kept come first, unnamed
        names = [""] * (len(state.mailbox) - len(state.mailbox_by)) + state.mailbox_by
        taken = list(zip(state.mailbox, names, strict=True))
        del state.mailbox[:], state.mailbox_by[:]
        return taken

    def set_paused(self, paused: bool, by: str = "") -> None:
        self.state.paused, self.state.paused_by = paused, by

    # --- usage, budget, failure -----------------------------------------------------------------

    def add_usage(self, usage: Usage, *, check: bool = True) -> None:
        """Count usage (also a child's) towards this run; the budget covers the whole tree."""
        self.state.usage = self.state.usage + usage
        if check:
            self.check_budget()

    def add_call_usage(self, agent: str, model: str, response: ModelResponse) -> None:
        """Count one model call of this run (priced by the model activity) and say its cost."""
        usage = response.usage.by(agent)
        priced = response.price_source is not None
        data = {"model": model, "input_tokens": usage.input_tokens}
        data |= {"cached_input_tokens": usage.cached_input_tokens}
        data |= {"output_tokens": usage.output_tokens, "price_source": response.price_source}
        self.emit("model_call", {**data, "cost": usage.cost_usd if priced else None}, agent=agent)
        self.add_usage(usage, check=False)

    def check_budget(self) -> None:
        budget = self.input.budget
        if budget is None:
            return
        usage = self.state.usage
        if budget.max_total_tokens is not None and usage.total_tokens > budget.max_total_tokens:
            self.fail(
                f"token budget exceeded: {usage.total_tokens} > {budget.max_total_tokens}",
                errors.BUDGET_EXCEEDED,
            )
        if budget.max_requests is not None and usage.requests > budget.max_requests:
            self.fail(
                f"request budget exceeded: {usage.requests} > {budget.max_requests}",
                errors.BUDGET_EXCEEDED,
            )

    def fail(self, message: str, kind: str) -> NoReturn:
        """End the run with a typed, non-retryable error that carries the usage so far."""
        self.emit("error", {"kind": kind, "message": message})
        self.set_status("failed")
        raise ApplicationError(
            message, self.state.usage.model_dump(), type=kind, non_retryable=True
        )

    @staticmethod
    def usage_from_failure(cause: BaseException | None) -> Usage:
        """Child runs put their usage in the details of their failure (see :meth:`fail`)."""
        if isinstance(cause, ApplicationError) and cause.details:
            try:
                return Usage.model_validate(cause.details[0])
            except ValueError:
                pass
        return Usage()

    def child_search_attributes(self, agent: str) -> Any:
        """What a child run of ``agent`` starts with: its parent, and in runs that upsert only
        what changed, its agent and status too (the child's first task then writes nothing)."""
        if not self.setup_flag("search_attributes"):
            return None
        from temporalio.common import SearchAttributePair, TypedSearchAttributes

        from relaykit.search_attributes import (
            RELAY_EVAL_OF,
            RELAY_PARENT_RUN,
            keyword,
            started_pairs,
        )

        parent = keyword(workflow.info().workflow_id)
        pairs: list[Any] = [SearchAttributePair(RELAY_PARENT_RUN, parent)]
        if self.setup_flag("changed_attributes"):
            pairs += started_pairs(
                agent,
                now=workflow.now(),
                cost=self.setup_flag("cost_attribute"),
                listed=self.setup_flag("list_attributes"),
            )
        evaluation = self.input.evaluation
        if evaluation is not None and evaluation.mark:  # a candidate's children are candidates
            pairs.append(SearchAttributePair(RELAY_EVAL_OF, keyword(evaluation.recorded_run)))
        return TypedSearchAttributes(pairs)

    # --- background signals ---------------------------------------------------------------------

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background (signals sent from handlers); awaited before the end."""
        self._background.append(asyncio.ensure_future(coro))

    async def drain_background(self, *, clear: bool = False) -> None:
        if self._background:
            await asyncio.gather(*self._background)
            if clear:
                self._background.clear()


def head(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def signal_workflow(workflow_id: str, signal: str, payload: Any) -> None:
    """Signal another run; one that has ended has nothing to deliver to, which is not an error."""
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(signal, payload)
    except Exception as exc:  # noqa: BLE001 - the target may have ended; nothing to deliver to
        workflow.logger.info("signal %s to %s failed: %s", signal, workflow_id, exc)
