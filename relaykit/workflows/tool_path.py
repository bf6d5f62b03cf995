"""The one tool path: every call of every kind of tool, preflight then execute.

lovia's ``tool_calls.py``: what applies to every call happens here, once, for every kind
(:class:`relaykit.workflows.tool_kind.ToolKind`: function tools, MCP tools, agents as tools,
the subagent tools, handoffs):

1. **what the model wrote** (:meth:`ToolPath.check`): call ids made unique, arguments that are
   not a JSON object recorded as such (:mod:`relaykit.model_output`);
2. **preflight**, in call order, before any call starts: the ``tool_call`` event, the
   argument check, the approval order of the turn (:meth:`Approvals.gates`); a *barrier* kind
   (a handoff) is checked here (loop guard, arguments) and the first valid one is kept, a
   second one rejected unrun;
3. **execute**, the other calls concurrently (activities, child workflows), each after the
   approval decision it waits for: unknown tool, loop guard
   (:mod:`relaykit.workflows.loop_guard`), the kind's own argument check
   (:meth:`ToolKind.prepare`), a person's decision when the kind says one is needed, then the
   kind runs the call (:meth:`ToolKind.execute`) and its usage counts towards the budget;
4. the barrier runs alone, in request order (lovia's: after the calls before it, before the
   calls after it; in runs recorded before that rule, after all of them); the results are
   returned in call order, each with its ``tool_result`` event, and the turn loop puts them in
   the transcript and makes the handoff's switch.

A new kind of tool is one module implementing :class:`ToolKind`, listed in :meth:`_build`.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from temporalio import workflow

from relaykit.agent import Agent, AgentTool, Handoff
from relaykit.handoff import as_handoff
from relaykit.messages import Message, ToolCall, ToolSpec
from relaykit.model_output import check_calls, check_ids_needed, parse_object
from relaykit.tool_args import SUBAGENT_TOOLS
from relaykit.tools import Tool
from relaykit.workflows.agent_tools import AgentToolKind, ChildIds
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.function_tools import FunctionTool
from relaykit.workflows.handoffs import HandoffTool
from relaykit.workflows.loop_guard import check_repeat
from relaykit.workflows.mcp_tools import MCPTools
from relaykit.workflows.run_state import Run, head
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.subagent_tools import SubagentTool
from relaykit.workflows.tool_kind import PATCH_BAD_ARGUMENTS, Prepared, ToolKind, ToolResult

PATCH_CALL_IDS = "relaykit.unique-call-ids"


@dataclass
class AgentTools:
    """What one agent may call: by name, and the specs the model is shown (in their order)."""

    kinds: dict[str, ToolKind] = field(default_factory=dict)
    specs: list[ToolSpec] = field(default_factory=list)


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

    # --- what an agent may call -----------------------------------------------------------------

    async def prepare(self, agent: Agent) -> None:
        """Before a model call: list the agent's MCP tools (an activity, once per workflow run)."""
        if await self.mcp.prepare(self.run, agent):
            self._tools.pop(agent.name, None)

    def tools(self, agent: Agent) -> AgentTools:
        """Built once per agent (and again after new MCP listings): it depends only on code."""
        known = self._tools.get(agent.name)
        if known is None:
            known = self._tools[agent.name] = self._build(agent)
        return known

    def tool_specs(self, agent: Agent) -> list[ToolSpec]:
        return self.tools(agent).specs

    def _build(self, agent: Agent) -> AgentTools:
        run = self.run
        lovia_names = run.setup_flag("lovia_tool_names")  # [lovia semantics] names, aliases
        kinds: list[ToolKind] = []
        aliases: list[ToolKind] = []
        for entry in agent.tools:
            if isinstance(entry, AgentTool):
                kinds.append(AgentToolKind(run, entry, self.child_ids, entry.run_name(lovia_names)))
                if lovia_names and entry.legacy_name != entry.name:  # a call recorded before
                    aliases.append(AgentToolKind(run, entry, self.child_ids, entry.legacy_name))
            elif isinstance(entry, Tool):
                kinds.append(FunctionTool(run, self.approvals, agent, entry))
        handoffs: list[ToolKind] = []
        handoff_aliases: list[ToolKind] = []
        for handoff in map(as_handoff, agent.handoffs):
            own = handoff.run_name(lovia_names)
            handoffs.append(HandoffTool(run, agent.name, handoff, own, own))
            if lovia_names and handoff.legacy_name != own:
                handoff_aliases.append(
                    HandoffTool(run, agent.name, handoff, handoff.legacy_name, own)
                )
        subagents: list[ToolKind] = []
        if agent.subagents is not None:
            shown = {spec.name: spec for spec in self.tasks.tool_specs(agent)}
            subagents = [
                SubagentTool(run, self.tasks, agent, name, shown.get(name))
                for name in SUBAGENT_TOOLS
            ]
        mcp: list[ToolKind] = list(self.mcp.kinds(run, self.approvals, agent))
        table = AgentTools()
        for kind in [*kinds, *handoffs, *subagents, *mcp]:
            spec = kind.spec()
            if spec is not None:
                table.specs.append(spec)
        # Which kind answers a name (a later one wins): MCP tools (whose names avoid all the
        # others), the subagent tools, agent tools by the name an earlier run used, function and
        # agent tools, handoffs by their earlier name, handoffs.
        for kind in [*mcp, *subagents, *aliases, *kinds]:
            table.kinds[kind.name] = kind
        for kind in handoff_aliases:  # never in place of another handoff's own name
            if not (kind.name in table.kinds and table.kinds[kind.name].barrier):
                table.kinds[kind.name] = kind
        for kind in handoffs:
            table.kinds[kind.name] = kind
        return table

    # --- what the model wrote -------------------------------------------------------------------

    def check(self, message: Message) -> tuple[list[ToolCall], Message, bool]:
        """The calls to run and the message to record (:mod:`relaykit.model_output`),
        and whether the message differs from what the provider sent."""
        if not message.tool_calls:
            return [], message, False
        fix_ids = check_ids_needed(message) and workflow.patched(PATCH_CALL_IDS)
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
        if problem is None or not workflow.patched(PATCH_BAD_ARGUMENTS):
            return None
        return (
            f"Invalid arguments for tool {call.name!r}: {problem}. The call was not run; "
            "call it again with a JSON object of arguments."
        )

    # --- one turn's calls -----------------------------------------------------------------------

    async def run_calls(
        self, agent: Agent, calls: list[ToolCall]
    ) -> tuple[list[Message], tuple[Handoff, str | None] | None]:
        """Run one turn's calls (see the module docstring); returns their results in call
        order, for the transcript, and the handoff to switch to."""
        run = self.run
        table = self.tools(agent)
        results: list[Message | None] = [None] * len(calls)
        concurrent: list[tuple[int, Any]] = []
        barrier: tuple[int, ToolCall, ToolKind, Prepared] | None = None
        before = None  # [lovia semantics] concurrent[:before] run before the barrier
        gates = self.approvals.gates(agent, calls, lambda call: self._approval_hint(table, call))
        for index, call in enumerate(calls):
            kind = table.kinds.get(call.name)
            data: dict[str, Any] = {
                "call_id": call.id,
                "name": call.name,
                "arguments": call.arguments,
            }
            if kind is not None:
                data.update(kind.call_event(call))
            run.emit("tool_call", data)
            problem = self._argument_problem(call)
            if problem is not None:
                results[index] = run.tool_message(call, problem, is_error=True)
                continue
            if kind is not None and kind.barrier:
                outcome = self._preflight_barrier(agent, kind, call, barrier)
                if isinstance(outcome, Message):
                    results[index] = outcome
                else:
                    barrier = (index, call, kind, outcome)
                    if run.setup_flag("handoff_in_request_order"):
                        before = len(concurrent)
                continue
            wait_for, decided = gates[index]
            concurrent.append((index, self._gated(agent, table, kind, call, wait_for, decided)))
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
            results[index], switch = await self._run_prepared(agent, kind, prepared)
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

    def _approval_hint(self, table: AgentTools, call: ToolCall) -> bool:
        """Whether ``call`` will wait for a person (invalid calls never do: they fail first)."""
        kind = table.kinds.get(call.name)
        return kind is not None and not kind.barrier and kind.approval_hint(call)

    def _preflight_barrier(
        self,
        agent: Agent,
        kind: ToolKind,
        call: ToolCall,
        first: tuple[int, ToolCall, ToolKind, Prepared] | None,
    ) -> Prepared | Message:
        run = self.run
        repeated = check_repeat(
            run.state, call, agent.max_repeated_calls, kind.guard_patch
        )  # loop guard
        if repeated is not None:
            return run.tool_message(call, repeated)
        prepared = kind.prepare(call)
        if isinstance(prepared, ToolResult):  # invalid: no switch, the model reads why
            return run.tool_message(call, prepared.content, is_error=prepared.is_error)
        if first is None:
            return prepared
        return run.tool_message(
            call,
            "Rejected: only the first handoff of a turn runs; the conversation is "
            f"already being handed over by {first[1].name}.",
            is_error=True,
        )

    async def _gated(
        self,
        agent: Agent,
        table: AgentTools,
        kind: ToolKind | None,
        call: ToolCall,
        wait_for: asyncio.Event | None,
        decided: asyncio.Event | None,
    ) -> Message:
        try:
            if wait_for is not None:
                await wait_for.wait()
            return await self._run_one(agent, table, kind, call)
        finally:
            self.approvals.release(call, decided)

    async def _run_one(
        self, agent: Agent, table: AgentTools, kind: ToolKind | None, call: ToolCall
    ) -> Message:
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
        message, _ = await self._run_prepared(agent, kind, prepared)
        return message

    async def _run_prepared(
        self, agent: Agent, kind: ToolKind, prepared: Prepared
    ) -> tuple[Message, tuple[Handoff, str | None] | None]:
        run, call = self.run, prepared.call
        if prepared.needs_approval:
            refusal = await self.approvals.decide(agent, kind, call)
            if refusal is not None:
                return run.tool_message(call, refusal.content, is_error=refusal.is_error), None
        result = await kind.execute(prepared)
        if result.usage is not None:  # a child's usage: the budget covers the whole tree
            run.add_usage(result.usage)
        return run.tool_message(call, result.content, is_error=result.is_error), result.switch
