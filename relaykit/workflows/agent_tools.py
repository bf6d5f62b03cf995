"""Agents as tools (``other.as_tool()``): the call runs the agent as a child ``AgentRun`` and
waits for it; the child's final output (or failure) is the tool result.

The child's id is derived from the parent's (``<parent id>/<agent name>-<n>``), its budget is
what the parent has left, and its usage counts towards the parent's (returned with the result,
counted by the tool path). Approval requests inside the child surface in the parent (Eino's
action scoping: an interrupt crosses the agent-tool boundary; exit and handoff stay inside),
see :mod:`relaykit.workflows.approvals`.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import json
import re

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import (
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)

from relaykit.agent import AgentTool
from relaykit.messages import ToolCall, ToolSpec
from relaykit.run_ids import child_run_id, run_id_fits, too_long
from relaykit.runs import RunInput, RunResult
from relaykit.tool_args import AgentToolArgs
from relaykit.workflows.call_record import ROUTE_AGENT, route
from relaykit.workflows.run_state import Run
from relaykit.workflows.spend import Spend
from relaykit.workflows.tool_kind import Prepared, ToolKind, ToolResult, invalid_arguments

# Patches (docs/replay.md): each marks a change in the commands a run issues, so that runs
# recorded before it replay the old way.
AGENT_TOOL_ID_PATCH = "relaykit-agent-tool-id-by-name"
"""Agent-as-tool children are named ``<parent>/<agent>-<n>`` (before: ``<parent>/<call id>``)."""
CHILD_CANCEL_PATCH = "relaykit-agent-tool-cancel-reaches-parent"
"""An agent-tool child that ends cancelled requests its parent's cancellation (before: a child
cancelled from inside made the parent fail)."""


def _child_name(agent_name: str) -> str:
    """The agent's name as a workflow-id segment: no slashes or whitespace, bounded length."""
    return re.sub(r"[\s/]+", "_", agent_name).strip("_")[:64] or "agent"


class ChildIds:
    """Agent-tool child ids of the current turn, named once per call where its ``tool_call``
    event names them and used again when the call starts the child."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._ids: dict[int, str] = {}
        """By call object (the turn's message keeps each alive, so no object id is reused
        within the turn)."""
        self._turn = -1

    def name(self, entry: AgentTool, call: ToolCall) -> str:
        state = self.run.state
        if self._turn != state.turn:
            self._ids, self._turn = {}, state.turn
        known = self._ids.get(id(call))
        if known is not None:
            return known
        parent = workflow.info().workflow_id
        if self.run.patched(AGENT_TOOL_ID_PATCH):
            state.agent_tools_started += 1
            child_id = child_run_id(
                parent, f"{_child_name(entry.agent.name)}-{state.agent_tools_started}"
            )
        else:  # recorded before the ids carried the agent's name
            child_id = child_run_id(parent, call.id)
        self._ids[id(call)] = child_id
        return child_id

    def mark(self) -> tuple[int, dict[int, str], int]:
        """Where naming stands, to go back to when a turn's calls are decided again."""
        return self.run.state.agent_tools_started, dict(self._ids), self._turn

    def rewind(self, mark: tuple[int, dict[int, str], int]) -> None:
        self.run.state.agent_tools_started, ids, self._turn = mark
        self._ids = dict(ids)

    def take(self, entry: AgentTool, call: ToolCall) -> str:
        child_id = self.name(entry, call)
        self._ids.pop(id(call), None)
        return child_id


class AgentToolKind(ToolKind):
    """One agent tool of one agent."""

    evaluates_children = True

    def __init__(self, run: Run, entry: AgentTool, ids: ChildIds, name: str) -> None:
        self.run = run
        self.entry = entry
        self.ids = ids
        self.name = name
        """The name this run uses (lovia's, or the earlier one; ``entry.name`` in messages)."""
        self.route = route(ROUTE_AGENT, entry.agent.name)
        self.max_output_chars = entry.max_output_chars

    def spec(self) -> ToolSpec:
        return self.entry.spec_named(self.name)

    def call_event(self, call: ToolCall) -> dict[str, str]:
        # [observability] the call names its child run, so watchers can follow it
        return {"workflow_id": self.ids.name(self.entry, call)}

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        child_id = self.ids.take(self.entry, call)
        if not run_id_fits(child_id):  # the server would refuse the start, at every retry
            return ToolResult(
                f"The {self.entry.agent.name} agent could not start: {too_long(child_id)}.",
                is_error=True,
            )
        try:
            prompt = AgentToolArgs.model_validate_json(call.arguments or "{}").input
        except ValidationError as exc:
            # pydantic's parser also refuses what could not travel in the child's input
            # (a lone surrogate in a string, say), which would fail every workflow task
            return ToolResult(invalid_arguments(self.entry.name, exc), is_error=True)
        return Prepared(call, (child_id, prompt))

    def replayed(self, call: ToolCall) -> Prepared:
        child_id = self.ids.take(self.entry, call)
        try:
            prompt = AgentToolArgs.model_validate_json(call.arguments or "{}").input
        except ValidationError:  # the child started then: its recorded start is replayed
            prompt = call.arguments
        return Prepared(call, (child_id, prompt))

    async def execute(self, prepared: Prepared) -> ToolResult:
        run, entry = self.run, self.entry
        child_id, prompt = prepared.arguments
        info = workflow.info()
        spend = Spend(run)
        child_input = RunInput(
            agent=entry.agent.name,
            input=prompt,
            max_turns=entry.max_turns,
            budget=spend.child_budget(entry.budget, child_id, parts=1),
            extra_instructions=run.input.extra_instructions,
            context=run.input.context,
            run_path=run.state.run_path,
            parent_workflow_id=info.workflow_id,
            unattended=run.input.unattended,
            budget_from=spend.budget_from(),
            evaluation=prepared.evaluation,  # in an evaluation: the recorded child's calls
        )
        try:
            return await self._child(child_input, child_id, prompt)
        finally:  # in the same workflow step as its usage is counted (the tool path)
            spend.release(child_id)

    async def _child(self, child_input: RunInput, child_id: str, prompt: str) -> ToolResult:
        run, entry = self.run, self.entry
        info = workflow.info()
        try:
            result: RunResult = await workflow.execute_child_workflow(
                run.workflow_type,
                child_input,
                id=child_id,
                result_type=RunResult,
                task_queue=info.task_queue,
                static_summary=f"{entry.agent.name} (asked by {run.state.agent}): {prompt[:120]}",
                search_attributes=run.child_search_attributes(child_input.agent),
            )
        except WorkflowAlreadyStartedError:
            # e.g. a run id reused while a child of its earlier run still runs
            return ToolResult(
                f"The {entry.agent.name} agent could not start: a run with id {child_id} is "
                "already running.",
                is_error=True,
            )
        except ChildWorkflowError as exc:
            if is_cancelled_exception(exc):
                # Either this run is being cancelled, or the child was cancelled from inside
                # and asked for this run's cancellation first (see cancel_parent): both end
                # this run cancelled.
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            return ToolResult(
                f"The {entry.agent.name} agent did not finish: {detail}",
                is_error=True,
                usage=run.usage_from_failure(exc.cause),
            )
        content = result.output if isinstance(result.output, str) else json.dumps(result.output)
        return ToolResult(content, usage=result.usage)


async def cancel_parent(run_input: RunInput) -> None:
    """This agent-tool child run is ending cancelled: cancel the parent that waits for it.

    lovia's agent-as-tool child shares its parent's cancel token, so one cancel stops the
    whole tree, also when it comes from inside the child (a tool cancelling its own run).
    A workflow cannot request its own cancellation, so the child asks for its parent's
    before it ends; the parent then sees its own cancellation ahead of the child's result
    and ends CANCELLED rather than failed. When the parent was cancelled first, the request
    changes nothing. Background subagents never do this: their end is a report."""
    parent = run_input.parent_workflow_id
    if parent is None or run_input.report_to is not None:
        return
    if not workflow.patched(CHILD_CANCEL_PATCH):
        return
    try:
        await workflow.get_external_workflow_handle(parent).cancel()
    except Exception as exc:  # noqa: BLE001 - the parent may have ended already
        workflow.logger.info("cancel of parent %s: %s", parent, exc)
