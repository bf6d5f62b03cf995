"""The one tool path: every call of every kind of tool, preflight then execute.

lovia's ``tool_calls.py``: what applies to every call happens here, once, for every kind
(:class:`relaykit.workflows.tool_kind.ToolKind`: function tools, MCP tools, agents as tools,
the subagent tools, handoffs):

1. **what the model wrote** (:meth:`ToolPath.check`): call ids made unique, arguments that are
   not a JSON object recorded as such (:mod:`relaykit.model_output`);
2. **preflight**, in call order, before any call starts: the ``tool_call`` event, the
   argument check, which calls wait for a person and the order of the turn around them
   (:meth:`Approvals.gates`); a *barrier* kind
   (a handoff) is checked here (loop guard, arguments) and the first valid one is kept, a
   second one rejected unrun;
3. **execute**, the other calls concurrently (activities, child workflows), each after the
   approval decision it waits for: unknown tool, loop guard
   (:mod:`relaykit.workflows.loop_guard`), the kind's own argument check
   (:meth:`ToolKind.prepare`), the tool's approval rule (user code, asked once per call and
   guarded: a rule that raises is the call's error result, :func:`approval_rule`), a person's
   decision when the rule says one is needed, then the kind runs the call
   (:meth:`ToolKind.execute`), its usage counts towards the budget and its result is cut to the
   kind's ``max_output_chars`` with the marker (:func:`relaykit.tools.cap_output`) (in runs
   that record decisions by the local activity, the checks of a call that waits for no
   approval decision are made in preflight, so that the turn's decisions are recorded at once:
   :mod:`relaykit.workflows.call_decisions`);
4. the barrier runs alone, in request order (lovia's: after the calls before it, before the
   calls after it; in runs recorded before that rule, after all of them); the results are
   returned in call order, each with its ``tool_result`` event, and the turn loop puts them in
   the transcript and makes the handoff's switch.

Each decision that depends on the agents' definitions (is there such a tool, is the call
refused, does it wait for a person and for how long) is made once and recorded
(:mod:`relaykit.workflows.call_decisions`); a replay goes on with the recorded decision instead
of today's, and a call of a tool that today's code no longer defines replays as the kind it was
(:mod:`relaykit.workflows.call_record`, docs/deploy.md).

A new kind of tool is one module implementing :class:`ToolKind`, listed in
:func:`relaykit.workflows.tool_table.build_table`.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import workflow

from relaykit.agent import Agent, Handoff
from relaykit.messages import Message, ToolCall, ToolSpec
from relaykit.model_output import check_calls, check_ids_needed, parse_object
from relaykit.tools import cap_output
from relaykit.workflows.agent_tools import ChildIds
from relaykit.workflows.approvals import Approvals, Gate
from relaykit.workflows.call_decisions import CallDecisions
from relaykit.workflows.call_record import TIMEOUT_ON_REPLAY, Ask, Slot
from relaykit.workflows.eval_calls import RecordedTools
from relaykit.workflows.loop_guard import check_repeat
from relaykit.workflows.mcp_tools import MCPTools
from relaykit.workflows.run_state import Run, head
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.tool_kind import (
    PATCH_BAD_ARGUMENTS,
    Prepared,
    ToolKind,
    ToolResult,
    approval_rule,
)
from relaykit.workflows.tool_table import AgentTools, build_table

PATCH_CALL_IDS = "relaykit.unique-call-ids"


class ToolPath:
    """The tool calls of one run (see the module docstring)."""

    def __init__(self, run: Run, approvals: Approvals, tasks: SubagentTasks) -> None:
        self.run = run
        self.approvals = approvals
        self.tasks = tasks
        self.mcp = MCPTools()
        self.child_ids = ChildIds(run)
        self._tools: dict[str, AgentTools] = {}
        self._argument_problems: dict[str, str | None] = {}
        self.decisions = CallDecisions(
            run,
            approvals,
            tasks,
            self.child_ids,
            check=self._check,
            ask=self._ask,
            argument_problem=self._argument_problem,
        )
        self._rules: dict[int, bool | Message] = {}
        """This turn's answers of the tools' approval rules, by call object (see :meth:`_rule`)."""
        evaluation = run.input.evaluation
        self.recorded = RecordedTools(run, evaluation) if evaluation is not None else None
        """A candidate run of an evaluation: its calls answered from the recording."""

    # --- what an agent may call -----------------------------------------------------------------

    async def prepare(self, agent: Agent) -> None:
        """Before a model call: list the agent's MCP tools (an activity, once per workflow run)."""
        if await self.mcp.prepare(self.run, agent):
            self._tools.pop(agent.name, None)

    def tools(self, agent: Agent) -> AgentTools:
        """Built once per agent (and again after new MCP listings): it depends only on code."""
        known = self._tools.get(agent.name)
        if known is None:
            known = self._tools[agent.name] = build_table(
                self.run, self.approvals, self.tasks, self.mcp, self.child_ids, agent
            )
        return known

    def tool_specs(self, agent: Agent) -> list[ToolSpec]:
        return self.tools(agent).specs

    # --- what the model wrote -------------------------------------------------------------------

    def check(self, message: Message) -> tuple[list[ToolCall], Message, bool]:
        """The calls to run and the message to record (:mod:`relaykit.model_output`),
        and whether the message differs from what the provider sent."""
        if not message.tool_calls:
            return [], message, False
        fix_ids = check_ids_needed(message) and self.run.patched(PATCH_CALL_IDS)
        checked = check_calls(
            message, self.run.state.turn, fix_ids=fix_ids, run_key=workflow.info().workflow_id
        )
        self._argument_problems = checked.problems
        return checked.calls, checked.recorded, checked.changed

    def _argument_problem(self, call: ToolCall) -> str | None:
        """Why a call's arguments cannot reach any tool (not a JSON object), as the error
        result the model reads; ``None`` when they can."""
        if call.arguments in self._argument_problems:  # parsed once, by check()
            problem = self._argument_problems[call.arguments]
        else:
            problem = parse_object(call.arguments)[1]
        if problem is None or not self.run.patched(PATCH_BAD_ARGUMENTS):
            return None
        return (
            f"Invalid arguments for tool {call.name!r}: {problem}. The call was not run; "
            "call it again with a JSON object of arguments."
        )

    # --- one turn's calls -----------------------------------------------------------------------

    async def run_calls(
        self, agent: Agent, calls: list[ToolCall], routes: dict[str, str] | None = None
    ) -> tuple[list[Message], tuple[Handoff, str | None] | None]:
        """Run one turn's calls (see the module docstring); returns their results in call
        order, for the transcript, and the handoff to switch to. ``routes``: what the model call
        recorded about the tools it calls (:mod:`relaykit.workflows.call_record`)."""
        run = self.run
        table = self.tools(agent)
        mode = run.calls.mode()
        self._rules = {}
        slots = [Slot(run.state.turn, index) for index in range(len(calls))]
        results: list[Message | None] = [None] * len(calls)
        concurrent: list[tuple[int, Any]] = []
        barrier: tuple[int, ToolCall, ToolKind, Prepared] | None = None
        before = None  # [lovia semantics] concurrent[:before] run before the barrier
        decisions, plan = self.decisions, None
        decisions.tasks.starting = 0  # the turn's spawns are counted from here
        if mode == "recorded":  # decided before any call starts, by one local activity
            plan = await decisions.decide_turn(agent, table, calls, slots, routes or {})
            gates = plan.gates
        else:
            gates = decisions.gates(agent, table, calls, slots, mode)
        for index, call in enumerate(calls):
            if plan is not None:
                kind = plan.kinds[index]
            else:
                kind = decisions.kind(agent, table, call, slots[index], mode, routes or {})
            data: dict[str, Any] = {
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
            if plan is not None:
                data.update(plan.events[index])
            elif kind is not None:
                data.update(kind.call_event(call))
            run.emit("tool_call", data)
            problem = self._argument_problem(call)
            if problem is not None:
                results[index] = run.tool_message(call, problem, is_error=True)
                continue
            if kind is not None and kind.barrier:
                if plan is not None:
                    outcome = plan.admitted[index]
                else:
                    first = barrier[1] if barrier is not None else None
                    outcome = decisions.preflight_barrier(
                        agent, table, kind, call, slots[index], first
                    )
                if isinstance(outcome, Message):
                    results[index] = outcome
                else:
                    barrier = (index, call, kind, outcome)
                    if run.setup_flag("handoff_in_request_order"):
                        before = len(concurrent)
                continue
            admitted = plan.admitted.get(index) if plan is not None else None
            concurrent.append(
                (index, self._gated(agent, table, kind, call, slots[index], gates[index], admitted))
            )
        # [lovia semantics] request order: the calls before the handoff, then the handoff alone
        # (a barrier), then the calls after it; runs recorded before run the handoff last.
        earlier = concurrent[:before] if before is not None else concurrent
        later = concurrent[before:] if before is not None else []
        outcomes = await asyncio.gather(*(coro for _, coro in earlier))
        for (index, _), outcome in zip(earlier, outcomes, strict=True):
            results[index] = outcome
        switch = None
        if barrier is not None:
            index, call, kind, prepared = barrier
            results[index], switch = await self._run_prepared(agent, kind, prepared, slots[index])
        outcomes = await asyncio.gather(*(coro for _, coro in later))
        for (index, _), outcome in zip(later, outcomes, strict=True):
            results[index] = outcome
        done: list[Message] = []
        for message in results:
            assert message is not None
            done.append(message)
            run.emit(
                "tool_result",
                {
                    "call_id": message.tool_call_id,
                    "name": message.name,
                    "content": head(message.content),
                    "is_error": message.is_error,
                },
            )
        return done, switch

    # --- deciding each call (relaykit.workflows.call_decisions) ---------------------------------

    def _ask(self, table: AgentTools, call: ToolCall) -> Ask | None:
        if not self._approval_hint(table, call):
            return None
        return "untimed" if table.kinds[call.name].approval_timeout is None else "timed"

    def _approval_hint(self, table: AgentTools, call: ToolCall) -> bool:
        """Whether ``call`` will wait for a person (invalid calls never do: they fail first)."""
        kind = table.kinds.get(call.name)
        return kind is not None and not kind.barrier and self._rule(kind, call) is True

    def _rule(self, kind: ToolKind, call: ToolCall) -> bool | Message:
        """:func:`approval_rule`, asked once per call of the turn, for every kind: a call whose
        rule raised before the turn started is refused even if the rule answers later."""
        if id(call) not in self._rules:
            rule = approval_rule(kind, call)
            self._rules[id(call)] = (
                rule if isinstance(rule, bool) else self.run.tool_message(call, rule, is_error=True)
            )
        return self._rules[id(call)]

    def _check(
        self, agent: Agent, table: AgentTools, kind: ToolKind | None, call: ToolCall
    ) -> Prepared | Message:
        run = self.run
        if kind is None:
            known = ", ".join(spec.name for spec in table.specs) or "none"
            return run.tool_message(
                call, f"Unknown tool {call.name!r}. Available tools: {known}.", is_error=True
            )
        repeated = check_repeat(
            run.state, call, agent.max_repeated_calls, kind.guard_patch
        )  # loop guard
        if repeated is not None:
            return run.tool_message(call, repeated, is_error=False)
        prepared = kind.prepare(call)
        if isinstance(prepared, ToolResult):
            return run.tool_message(call, prepared.content, is_error=prepared.is_error)
        rule = self._rule(kind, call)
        if isinstance(rule, Message):
            return rule
        prepared.needs_approval = rule
        refused = kind.refusal(prepared)
        if refused is not None:
            return run.tool_message(call, refused.content, is_error=refused.is_error)
        return prepared

    def _approval(self, kind: ToolKind, prepared: Prepared, slot: Slot) -> tuple[bool, Any]:
        """Whether the call waits for a person, and its time limit: decided once, before the
        turn's calls start (:class:`CallDecisions`), and recorded, so turning ``needs_approval``
        on or off (or changing ``approval_timeout``) changes only later calls."""
        if self.run.calls.mode() == "today":  # a run from before decisions were recorded
            return prepared.needs_approval, kind.approval_timeout
        ask = self.decisions.asks.get(slot)
        if ask is None:
            return False, None
        if ask == "untimed":
            return True, None
        return True, kind.approval_timeout or TIMEOUT_ON_REPLAY

    # --- running them ---------------------------------------------------------------------------

    async def _gated(
        self,
        agent: Agent,
        table: AgentTools,
        kind: ToolKind | None,
        call: ToolCall,
        slot: Slot,
        gate: Gate,
        admitted: Prepared | Message | None,
    ) -> Message:
        """A call after the approval decision it waits for; ``admitted``: decided before the
        turn's calls started (runs that record decisions by the local activity)."""
        wait_for, decided = gate
        try:
            if wait_for is not None:
                await wait_for.wait()
            if admitted is None and self.run.calls.mode() == "recorded":
                admitted = await self.decisions.admit_gated(agent, table, kind, call)
            elif admitted is None:
                admitted = self.decisions.admit(agent, table, kind, call, slot)
            if isinstance(admitted, Message):
                return admitted
            assert kind is not None
            message, _ = await self._run_prepared(agent, kind, admitted, slot)
            return message
        finally:
            self.approvals.release(call, decided)

    async def _run_prepared(
        self, agent: Agent, kind: ToolKind, prepared: Prepared, slot: Slot
    ) -> tuple[Message, tuple[Handoff, str | None] | None]:
        run, call = self.run, prepared.call
        if self.recorded is not None and not kind.barrier:  # an evaluation's candidate run
            answered = self.recorded.answer(kind, call)
            if isinstance(answered, ToolResult):
                return run.tool_message(call, answered.content, is_error=answered.is_error), None
            prepared.evaluation = answered  # a recorded child to run against, or live
        needed, timeout = self._approval(kind, prepared, slot)
        if needed:
            refusal = await self.approvals.decide(agent, kind, call, timeout)
            if refusal is not None:
                return run.tool_message(call, refusal.content, is_error=refusal.is_error), None
        result = await kind.execute(prepared)
        if result.usage is not None:  # a child's usage: the budget covers the whole tree
            run.add_usage(result.usage)
        content = result.content
        if run.setup_flag("capped_outputs"):  # every kind's (an agent tool's too); runs from
            content = cap_output(content, kind.max_output_chars)  # before: whole
        return run.tool_message(call, content, is_error=result.is_error), result.switch
