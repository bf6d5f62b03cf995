"""Deciding each tool call once, and recording it, for the one tool path.

The tool path (:mod:`relaykit.workflows.tool_path`) asks here what answers a call (its kind, or
none: an unknown tool), which calls wait for a person and which wait for an earlier call's
approval decision, and whether a call is admitted (loop guard, arguments, its kind's own check)
or refused. Those decisions depend on the agents' definitions, which a deploy may change, so
each is made once and recorded (:mod:`relaykit.workflows.call_record`):

- runs with ``RunSetup.recorded_decisions``: a turn's decisions are made before any of its calls
  starts and recorded by one local activity (:meth:`CallDecisions.decide_turn`); a call that
  waits for an earlier approval decision is admitted after that wait, recorded by one more
  (:meth:`CallDecisions.admit_gated`). One code path, live or replayed: where today's
  definitions decide otherwise than the recorded codes, what deciding changed is undone and the
  recorded codes are applied;
- runs recorded before: a patch marker per decision, written live and read back on replay
  (:meth:`CallDecisions.kind`, :meth:`CallDecisions.gates`, :meth:`CallDecisions.admit`), or
  today's definitions for runs from before decisions were recorded at all.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relaykit.agent import Agent
from relaykit.messages import Message, ToolCall
from relaykit.workflows.agent_tools import ChildIds
from relaykit.workflows.approvals import Approvals, Gate
from relaykit.workflows.call_record import (
    REFUSED,
    REFUSED_ON_REPLAY,
    UNKNOWN,
    WAITS,
    Ask,
    Mode,
    Slot,
    ask_code,
    asked,
)
from relaykit.workflows.loop_guard import check_repeat, guard_snapshot, restore_guard
from relaykit.workflows.run_state import Run
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.tool_kind import Prepared, ToolKind
from relaykit.workflows.tool_table import AgentTools, stand_in

Check = Callable[[Agent, AgentTools, ToolKind | None, ToolCall], Prepared | Message]
"""Today's checks of a call (unknown tool, loop guard, arguments, the kind's own refusal)."""


@dataclass
class TurnPlan:
    """What was decided about a turn's calls before any of them starts."""

    codes: list[str]
    """Per call: the recorded decision codes (:mod:`relaykit.workflows.call_record`)."""
    kinds: list[ToolKind | None] = field(default_factory=list)
    gates: list[Gate] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    """Per call: what its kind adds to its ``tool_call`` event (named before it is admitted)."""
    admitted: dict[int, Prepared | Message] = field(default_factory=dict)
    """The handoffs and the calls that wait for no earlier approval decision: the call to run,
    or the result the model reads instead. The others are admitted after their wait."""


def second_handoff(run: Run, call: ToolCall, first: ToolCall) -> Message:
    return run.tool_message(
        call,
        "Rejected: only the first handoff of a turn runs; the conversation is "
        f"already being handed over by {first.name}.",
        is_error=True,
    )


class CallDecisions:
    """The decisions of one run's tool calls (see the module docstring)."""

    def __init__(
        self,
        run: Run,
        approvals: Approvals,
        tasks: SubagentTasks,
        child_ids: ChildIds,
        check: Check,
        ask: Callable[[AgentTools, ToolCall], Ask | None],
        argument_problem: Callable[[ToolCall], str | None],
    ) -> None:
        self.run = run
        self.approvals = approvals
        self.tasks = tasks
        self.child_ids = child_ids
        self.check = check
        self.ask = ask
        self.argument_problem = argument_problem
        self.asks: dict[Slot, Ask | None] = {}
        """This turn's calls that wait for a person."""

    # --- recorded by the local activity ---------------------------------------------------------

    async def decide_turn(
        self,
        agent: Agent,
        table: AgentTools,
        calls: list[ToolCall],
        slots: list[Slot],
        routes: dict[str, str],
    ) -> TurnPlan:
        """Decide the turn's calls with today's definitions, record the decisions, and go on
        with those that stand. Live they are the same; a replay whose definitions decide
        otherwise undoes what deciding changed (the loop guard's counts, the child ids named,
        spawns counted) and decides again as recorded."""
        run = self.run
        saved = guard_snapshot(run.state, calls), self.child_ids.mark()
        plan = self._plan(agent, table, calls, slots, routes, None)
        recorded = await run.calls.record(plan.codes)
        if recorded == plan.codes or len(recorded) != len(calls):
            return plan
        restore_guard(run.state, saved[0])
        self.child_ids.rewind(saved[1])
        self.tasks.starting = 0
        return self._plan(agent, table, calls, slots, routes, recorded)

    def _plan(
        self,
        agent: Agent,
        table: AgentTools,
        calls: list[ToolCall],
        slots: list[Slot],
        routes: dict[str, str],
        recorded: list[str] | None,
    ) -> TurnPlan:
        """The turn's decisions, in the order the live path makes them (the kind that answers
        each call; which calls wait for a person and which for an earlier decision; the
        handoffs, then the other calls that wait for nothing, admitted in call order), with
        their codes: today's, or ``recorded``, which then stand."""
        plan = TurnPlan(codes=list(recorded) if recorded is not None else [""] * len(calls))
        codes = plan.codes
        for index, call in enumerate(calls):
            kind = table.kinds.get(call.name)
            if recorded is None and kind is None:
                codes[index] += UNKNOWN
            elif UNKNOWN in codes[index]:  # unknown then (today's code may define it)
                kind = None
            elif kind is None:  # known then, gone now: the kind it was
                kind = stand_in(
                    self.run, self.approvals, self.tasks, self.child_ids, agent, call, routes
                )
            plan.kinds.append(kind)
            plan.events.append(kind.call_event(call) if kind is not None else {})
        if recorded is None:
            asks = [self.ask(table, call) for call in calls]
            in_order = agent.approval_order == "request_order"
        else:
            asks = [asked(code) for code in codes]
            in_order = any(WAITS in code for code in codes)
        plan.gates = self.approvals.gates(calls, [ask is not None for ask in asks], in_order)
        if recorded is None:
            for index, (ask, (wait_for, _)) in enumerate(zip(asks, plan.gates, strict=True)):
                codes[index] += ask_code(ask) + (WAITS if wait_for is not None else "")
        self.asks = dict(zip(slots, asks, strict=True))
        barriers = [i for i, kind in enumerate(plan.kinds) if kind is not None and kind.barrier]
        others = [i for i in range(len(calls)) if i not in barriers and plan.gates[i][0] is None]
        first: ToolCall | None = None
        for index in [*barriers, *others]:
            call, kind = calls[index], plan.kinds[index]
            if self.argument_problem(call) is not None:  # read from the recorded text alone
                continue
            refused = None if recorded is None else REFUSED in codes[index]
            outcome = self._settle(agent, table, kind, call, refused)
            if kind is not None and kind.barrier and not isinstance(outcome, Message):
                if first is None:
                    first = call
                else:
                    outcome = second_handoff(self.run, call, first)
            if recorded is None and isinstance(outcome, Message) and kind is not None:
                codes[index] += REFUSED
            plan.admitted[index] = outcome
        return plan

    async def admit_gated(
        self, agent: Agent, table: AgentTools, kind: ToolKind | None, call: ToolCall
    ) -> Prepared | Message:
        """A call that waited for an earlier call's approval decision, admitted now: recorded
        for every such call (the turn's recorded codes say which), but an unknown one, whose
        refusal the turn recorded."""
        verdict = self.check(agent, table, kind, call)
        if kind is None:
            return verdict
        refused = isinstance(verdict, Message)
        recorded = await self.run.calls.record([REFUSED if refused else ""])
        if recorded == [REFUSED] and not refused:  # refused then, not today
            return self.run.tool_message(call, REFUSED_ON_REPLAY, is_error=True)
        if recorded == [""] and refused:  # ran then
            return self._settle(agent, table, kind, call, False)
        return verdict

    def _settle(
        self,
        agent: Agent,
        table: AgentTools,
        kind: ToolKind | None,
        call: ToolCall,
        refused: bool | None,
    ) -> Prepared | Message:
        """Admit a call by today's checks (``refused`` is ``None``), or as recorded."""
        run = self.run
        if refused is False and kind is not None:  # it ran
            check_repeat(run.state, call, agent.max_repeated_calls, kind.guard_patch, ran=True)
            return kind.replayed(call)
        verdict = self.check(agent, table, kind, call)
        if refused and not isinstance(verdict, Message):  # refused then, not today
            return run.tool_message(call, REFUSED_ON_REPLAY, is_error=True)
        return verdict

    # --- recorded by a patch marker each (runs recorded before) ---------------------------------

    def kind(
        self,
        agent: Agent,
        table: AgentTools,
        call: ToolCall,
        slot: Slot,
        mode: Mode,
        routes: dict[str, str],
    ) -> ToolKind | None:
        """The kind that answers ``call``: today's, or on replay the one the run called then.
        An unknown tool is refused here, before any command of the turn, and recorded so."""
        record = self.run.calls
        kind = table.kinds.get(call.name)
        if mode == "replay":
            if record.unknown(slot):  # unknown then (today's code may define it)
                return None
            if kind is None:  # known then, gone now: the kind it was
                kind = stand_in(
                    self.run, self.approvals, self.tasks, self.child_ids, agent, call, routes
                )
        elif mode == "live" and kind is None:
            record.record_unknown(slot)
        return kind

    def gates(
        self,
        agent: Agent,
        table: AgentTools,
        calls: list[ToolCall],
        slots: list[Slot],
        mode: Mode,
    ) -> list[Gate]:
        """Which calls will wait for a person, and the order of the turn's calls around them:
        decided on the live path before any call starts (and recorded for each call that
        waits), read back on replay."""
        record = self.run.calls
        asks: list[Ask | None]
        if mode == "replay":
            asks = [record.asked(slot) for slot in slots]
        else:
            asks = [self.ask(table, call) for call in calls]
        if mode == "live":
            for slot, ask in zip(slots, asks, strict=True):
                if ask is not None:
                    record.record_asked(slot, ask)
        self.asks = dict(zip(slots, asks, strict=True))
        wanted = [ask is not None for ask in asks]
        in_order = agent.approval_order == "request_order"
        if not record.bounded:  # runs recorded before: today's order
            return self.approvals.gates(calls, wanted, in_order)
        turn = slots[0].turn
        if mode == "replay":  # whether later calls waited, as the live path recorded it
            in_order = record.waited(turn)
        gates = self.approvals.gates(calls, wanted, in_order)
        if mode == "live" and any(wait_for is not None for wait_for, _ in gates):
            record.record_waited(turn)
        return gates

    def admit(
        self, agent: Agent, table: AgentTools, kind: ToolKind | None, call: ToolCall, slot: Slot
    ) -> Prepared | Message:
        """Unknown tool, loop guard, the kind's own argument check: the call to run, or the
        result the model reads instead. Live, a refusal is recorded; on replay the recorded
        decision stands, whatever today's definitions say."""
        run = self.run
        mode = run.calls.mode()
        if mode == "replay" and kind is not None and not run.calls.refused(slot):  # it ran
            check_repeat(run.state, call, agent.max_repeated_calls, kind.guard_patch, ran=True)
            return kind.replayed(call)
        verdict = self.check(agent, table, kind, call)
        if mode == "live" and isinstance(verdict, Message) and kind is not None:
            run.calls.record_refused(slot)  # (an unknown tool is recorded by kind())
        if mode == "replay" and not isinstance(verdict, Message):  # refused then, not today
            return run.tool_message(call, REFUSED_ON_REPLAY, is_error=True)
        return verdict

    def preflight_barrier(
        self,
        agent: Agent,
        table: AgentTools,
        kind: ToolKind,
        call: ToolCall,
        slot: Slot,
        first: ToolCall | None,
    ) -> Prepared | Message:
        """A handoff, admitted before the turn's other calls start; a second one is refused
        (and recorded, as every refusal)."""
        admitted = self.admit(agent, table, kind, call, slot)
        if isinstance(admitted, Message) or first is None:
            return admitted
        if self.run.calls.mode() == "live":
            self.run.calls.record_refused(slot)
        return second_handoff(self.run, call, first)
