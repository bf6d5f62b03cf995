"""Child runs: agent-as-tool (wait for the child) and background subagents (don't).

Both start the ``AgentRun`` workflow as a child with a deterministic id derived from the parent's
workflow id, and both count the child's usage towards the parent's budget. The difference is who
waits:

- **agent-as-tool** awaits the child; its final output (or failure) is the tool result. Approval
  requests inside the child surface in the parent (Eino's action scoping: an interrupt crosses the
  agent-tool boundary; exit/handoff actions stay inside).
- **subagents** are started and left running. When one ends it signals its report to the parent
  *by workflow id*, so the report reaches the parent's current run even after a continue-as-new.
  Reports are delivered at turn boundaries, as user-side messages.

This module is workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import json
import re
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import (
    ChildWorkflowError,
    WorkflowAlreadyStartedError,
    is_cancelled_exception,
)
from temporalio.workflow import ParentClosePolicy

from relaykit.agent import Agent, AgentTool
from relaykit.messages import Message, ToolCall, ToolSpec
from relaykit.runs import (
    ApprovalDecision,
    ChildReport,
    PendingApproval,
    ReportTarget,
    RunInput,
    RunResult,
    SubagentTask,
)
from relaykit.subagents import (
    DEFAULT_INSTRUCTIONS,
    AgentToolArgs,
    DETACHED_INSTRUCTIONS,
    MAX_WAIT_SECONDS,
    SUBAGENT_ARGUMENTS,
    CancelSubagentArgs,
    SendToSubagentArgs,
    SpawnSubagentArgs,
    Subagents,
    WaitSubagentsArgs,
)

if TYPE_CHECKING:
    from relaykit.workflows.loop import TurnLoop

REPORT_SIGNAL = "subagent_report"
CHILD_APPROVAL_SIGNAL = "child_approval"
CHILD_APPROVAL_DONE_SIGNAL = "child_approval_done"
CANCEL_WAIT = timedelta(seconds=60)

SUBAGENT_TOOLS = ("spawn_subagent", "wait_subagents", "cancel_subagent", "send_to_subagent")

# Patches (docs/replay.md): each marks a change in the commands a run issues, so that runs
# recorded before it replay the old way.
AGENT_TOOL_ID_PATCH = "relaykit-agent-tool-id-by-name"
"""Agent-as-tool children are named ``<parent>/<agent>-<n>`` (before: ``<parent>/<call id>``)."""
SUBAGENT_ARGS_PATCH = "relaykit-validated-subagent-tools"
"""The subagent tools validate their arguments (before: read leniently, so some calls that are
now refused started a child, cancelled or signalled one), and ``wait_subagents`` does not wait
for ``timeout_seconds: 0`` and starts no timer when nothing runs (before: ``or 60``, no bound)."""
CHILD_CANCEL_PATCH = "relaykit-agent-tool-cancel-reaches-parent"
"""An agent-tool child that ends cancelled requests its parent's cancellation (before: a child
cancelled from inside made the parent fail)."""


def subagent_tool_specs(capability: Subagents, agents: list[Agent]) -> list[ToolSpec]:
    """The tools the model sees; their schemas come from the pydantic models that validate the
    arguments (:mod:`relaykit.subagents`), so the bounds shown are the bounds enforced."""
    spawn = SpawnSubagentArgs.parameters()
    spawn["properties"]["agent"] = {
        "type": "string",
        "enum": [a.name for a in agents],
        "description": "Which subagent runs the task: "
        + "; ".join(f"{a.name}: {a.description or 'general'}" for a in agents),
    }
    specs = [
        ToolSpec(
            name="spawn_subagent",
            description="Start a background task and return its id at once. At most "
            f"{capability.max_concurrent} tasks run at a time.",
            parameters=spawn,
        ),
    ]
    if capability.detached:  # reports go elsewhere: nothing to wait for, cancel or steer here
        return specs
    return [
        *specs,
        ToolSpec(
            name="wait_subagents",
            description="Wait until the given tasks (default: all running) finish or the timeout "
            f"passes (at most {MAX_WAIT_SECONDS:g} s; 0 = don't wait); returns the reports that "
            "are ready and says which tasks still run.",
            parameters=WaitSubagentsArgs.parameters(),
        ),
        ToolSpec(
            name="cancel_subagent",
            description="Cancel a running background task; it will produce no report.",
            parameters=CancelSubagentArgs.parameters(),
        ),
        ToolSpec(
            name="send_to_subagent",
            description="Send a message to a running task; it reads it at its next turn.",
            parameters=SendToSubagentArgs.parameters(),
        ),
    ]


def invalid_arguments(tool_name: str, exc: ValidationError) -> str:
    """What the model reads when its arguments do not validate: each problem with its place."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
        for err in exc.errors(include_url=False)[:10]
    )
    return f"Invalid arguments for tool {tool_name!r}: {problems}. Fix them and call it again."


def _elapsed(seconds: float) -> str:
    seconds = max(int(seconds), 0)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m {seconds % 60:02d}s"
    return f"{seconds // 3600}h {seconds % 3600 // 60:02d}m"


def truncate_report(text: str, limit: int) -> str:
    """Keep the head and the tail of a long report (its end is usually the conclusion), with a
    marker in the middle saying how much was dropped."""
    if len(text) <= limit:
        return text
    head = limit - limit // 2
    tail = limit // 2
    dropped = len(text) - head - tail
    return (
        text[:head]
        + f"\n[… report truncated: {dropped} characters dropped from the middle …]\n"
        + (text[-tail:] if tail else "")
    )


def _child_name(agent_name: str) -> str:
    """The agent's name as a workflow-id segment: no slashes or whitespace, bounded length."""
    return re.sub(r"[\s/]+", "_", agent_name).strip("_")[:64] or "agent"


class Children:
    """The child-workflow wiring of one run (owned by its :class:`TurnLoop`)."""

    def __init__(self, loop: TurnLoop) -> None:
        self.loop = loop
        self.ended: set[str] = set()
        """Tasks whose run has ended (any status), as their reports said."""
        self.handles: dict[str, Any] = {}
        """Child handles of tasks started by this workflow run (not those of earlier runs of a
        run that continued as new): awaiting one waits until that child has really closed."""
        self._child_ids: dict[int, str] = {}
        """Agent-tool child ids named in this turn's ``tool_call`` events, by call object (the
        turn's message keeps each alive, so no object id is reused within the turn)."""
        self._child_ids_turn = -1

    @property
    def state(self) -> Any:
        return self.loop.state

    # --- agent as tool --------------------------------------------------------------------------

    def agent_tool_workflow_id(self, entry: AgentTool, call: ToolCall) -> str:
        """The child workflow id for this call: ``<parent id>/<agent name>-<n>``, readable in the
        Temporal UI and unique within the run whatever call ids the provider sends. Called once
        per call, where the ``tool_call`` event names it; :meth:`run_agent_tool` uses the same."""
        if self._child_ids_turn != self.state.turn:
            self._child_ids, self._child_ids_turn = {}, self.state.turn
        known = self._child_ids.get(id(call))
        if known is not None:
            return known
        parent = workflow.info().workflow_id
        if workflow.patched(AGENT_TOOL_ID_PATCH):
            self.state.agent_tools_started += 1
            child_id = f"{parent}/{_child_name(entry.agent.name)}-{self.state.agent_tools_started}"
        else:  # recorded before the ids carried the agent's name
            child_id = f"{parent}/{call.id}"
        self._child_ids[id(call)] = child_id
        return child_id

    async def run_agent_tool(self, entry: AgentTool, call: ToolCall) -> Message:
        """Run the sub-agent as a child workflow and wait; its output is the tool result."""
        loop = self.loop
        child_id = self.agent_tool_workflow_id(entry, call)
        self._child_ids.pop(id(call), None)
        try:
            prompt = AgentToolArgs.model_validate_json(call.arguments or "{}").input
        except ValidationError as exc:
            # pydantic's parser also refuses what could not travel in the child's input
            # (a lone surrogate in a string, say), which would fail every workflow task
            return loop.tool_message(call, invalid_arguments(entry.name, exc), is_error=True)
        info = workflow.info()
        child_input = RunInput(
            agent=entry.agent.name,
            input=prompt,
            max_turns=entry.max_turns,
            budget=loop.remaining_budget(entry.budget),
            extra_instructions=loop.input.extra_instructions,
            context=loop.input.context,
            run_path=self.state.run_path,
            parent_workflow_id=info.workflow_id,
            unattended=loop.input.unattended,
        )
        try:
            result: RunResult = await workflow.execute_child_workflow(
                loop.workflow_type,
                child_input,
                id=child_id,
                result_type=RunResult,
                task_queue=info.task_queue,
                static_summary=f"{entry.agent.name} (asked by {self.state.agent}): {prompt[:120]}",
                search_attributes=loop.child_search_attributes(),
            )
        except WorkflowAlreadyStartedError:
            # e.g. a run id reused while a child of its earlier run still runs
            return loop.tool_message(
                call,
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
            loop.add_usage(loop.usage_from_failure(exc.cause))
            detail = getattr(exc.cause, "message", None) or str(exc)
            return loop.tool_message(
                call, f"The {entry.agent.name} agent did not finish: {detail}", is_error=True
            )
        loop.add_usage(result.usage)
        content = result.output if isinstance(result.output, str) else json.dumps(result.output)
        return loop.tool_message(call, content)

    async def cancel_parent(self) -> None:
        """This agent-tool child run is ending cancelled: cancel the parent that waits for it.

        lovia's agent-as-tool child shares its parent's cancel token, so one cancel stops the
        whole tree, also when it comes from inside the child (a tool cancelling its own run).
        A workflow cannot request its own cancellation, so the child asks for its parent's
        before it ends; the parent then sees its own cancellation ahead of the child's result
        and ends CANCELLED rather than failed. When the parent was cancelled first, the request
        changes nothing. Background subagents never do this: their end is a report."""
        parent = self.loop.input.parent_workflow_id
        if parent is None or self.loop.input.report_to is not None:
            return
        if not workflow.patched(CHILD_CANCEL_PATCH):
            return
        try:
            await workflow.get_external_workflow_handle(parent).cancel()
        except Exception as exc:  # noqa: BLE001 - the parent may have ended already
            workflow.logger.info("cancel of parent %s: %s", parent, exc)

    # --- approvals crossing the agent-tool boundary ---------------------------------------------

    async def announce_approval(self, pending: PendingApproval) -> None:
        """Tell the parent (and so the root) that a person must answer ``pending``."""
        parent = self.loop.input.parent_workflow_id
        if parent:
            await _signal(parent, CHILD_APPROVAL_SIGNAL, pending)

    async def announce_answered(self, call_id: str) -> None:
        parent = self.loop.input.parent_workflow_id
        if parent:
            await _signal(parent, CHILD_APPROVAL_DONE_SIGNAL, call_id)

    def on_child_approval(self, pending: PendingApproval) -> None:
        self.state.pending_approvals[pending.call_id] = pending
        self.loop.set_status("waiting_approval")
        self.loop.emit("approval_requested", pending.model_dump(mode="json"), agent=pending.agent)
        parent = self.loop.input.parent_workflow_id
        if parent:
            self.loop.spawn(_signal(parent, CHILD_APPROVAL_SIGNAL, pending))

    def on_child_approval_done(self, call_id: str) -> None:
        if self.state.pending_approvals.pop(call_id, None) is not None:
            if not self.state.pending_approvals:
                self.loop.set_status("running")
        parent = self.loop.input.parent_workflow_id
        if parent:
            self.loop.spawn(_signal(parent, CHILD_APPROVAL_DONE_SIGNAL, call_id))

    def forward_decision(self, decision: ApprovalDecision) -> bool:
        """Send an answer to the child that owns the call; ``False`` if the call is ours."""
        pending = self.state.pending_approvals.get(decision.call_id)
        if pending is None or pending.workflow_id in (None, workflow.info().workflow_id):
            return False
        self.loop.spawn(_signal(pending.workflow_id, "approve_signal", decision))
        return True

    # --- background subagents -------------------------------------------------------------------

    def agents_for(self, agent: Agent) -> list[Agent]:
        capability = agent.subagents
        assert capability is not None
        if capability.agents:
            return list(capability.agents)
        return [self.loop.graph.subagent_clone(agent)]

    def tool_specs(self, agent: Agent) -> list[ToolSpec]:
        if agent.subagents is None:
            return []
        return subagent_tool_specs(agent.subagents, self.agents_for(agent))

    def instructions(self, agent: Agent) -> str | None:
        capability = agent.subagents
        if capability is None:
            return None
        if capability.instructions:
            return capability.instructions
        return DETACHED_INSTRUCTIONS if capability.detached else DEFAULT_INSTRUCTIONS

    def running(self) -> list[SubagentTask]:
        return [t for t in self.state.tasks.values() if t.status == "running"]

    def _since(self, task: SubagentTask, now: datetime | None = None) -> str:
        if task.started_at is None:
            return ""
        return f"running for {_elapsed(((now or workflow.now()) - task.started_at).total_seconds())}"

    def _describe(self, task: SubagentTask, now: datetime | None = None) -> str:
        """``task-1 (researcher, running for 2m 05s): "first words of its prompt"``."""
        detail = [task.agent]
        if task.status == "running":
            detail.append(self._since(task, now) or "running")
        else:
            detail.append(task.status)
        prompt = task.prompt if len(task.prompt) <= 60 else task.prompt[:59] + "…"
        return f"{task.id} ({', '.join(d for d in detail if d)}): {json.dumps(prompt, ensure_ascii=False)}"

    def _known(self) -> str:
        if not self.state.tasks:
            return "no task has been started yet"
        return "known tasks: " + ", ".join(f"{t.id} ({t.status})" for t in self.state.tasks.values())

    async def run_tool(self, agent: Agent, call: ToolCall) -> Message:
        loop = self.loop
        capability = agent.subagents
        if capability is None:
            return loop.tool_message(call, f"Unknown tool {call.name!r}.", is_error=True)
        legacy = not workflow.patched(SUBAGENT_ARGS_PATCH)
        if call.name == "wait_subagents":
            return await self._wait(capability, call, legacy)
        if capability.detached and call.name != "spawn_subagent" and not legacy:
            return loop.tool_message(
                call,
                f"{call.name} is not available: background tasks here are detached, their "
                "reports are delivered elsewhere. Only spawn_subagent is available.",
                is_error=True,
            )
        # replaying a run recorded before validation: act on what the old code accepted
        args = (legacy and _legacy_arguments(call.name, call.arguments)) or self._parse(call)
        if isinstance(args, Message):
            return args
        if isinstance(args, SpawnSubagentArgs):
            return await self._spawn(agent, capability, call, args)
        if isinstance(args, CancelSubagentArgs):
            return await self._cancel(call, args.id)
        assert isinstance(args, SendToSubagentArgs)
        return await self._send(call, args)

    def _parse(self, call: ToolCall) -> Any:
        """The call's arguments as their pydantic model, or the error result the model reads."""
        try:
            return SUBAGENT_ARGUMENTS[call.name].model_validate_json(call.arguments or "{}")
        except ValidationError as exc:
            text = invalid_arguments(call.name, exc)
        except (ValueError, RecursionError) as exc:  # not expected from pydantic; never fatal
            text = f"Invalid arguments for tool {call.name!r}: {exc}. Fix them and call it again."
        return self.loop.tool_message(call, text, is_error=True)

    async def _spawn(
        self, agent: Agent, capability: Subagents, call: ToolCall, args: SpawnSubagentArgs
    ) -> Message:
        loop = self.loop
        prompt = args.prompt
        choices = {a.name: a for a in self.agents_for(agent)}
        name = args.agent or next(iter(choices))
        target = choices.get(name)
        if target is None:
            return loop.tool_message(
                call, f"No subagent named {name!r}; choose one of: {', '.join(choices)}.", is_error=True
            )
        running = self.running()
        if len(running) >= capability.max_concurrent:
            now = workflow.now()
            return loop.tool_message(
                call,
                f"Refused: {len(running)} of at most {capability.max_concurrent} tasks are "
                "already running: "
                + "; ".join(self._describe(t, now) for t in running)
                + ". Wait for one with wait_subagents or cancel one with cancel_subagent first.",
                is_error=True,
            )
        info = workflow.info()
        self.state.tasks_started += 1
        task_id = f"task-{self.state.tasks_started}"
        child_id = f"{info.workflow_id}/{task_id}"
        # Registered before the start is awaited: spawns of the same turn run concurrently and
        # each must see the others when checking max_concurrent.
        task = SubagentTask(
            id=task_id,
            agent=target.name,
            workflow_id=child_id,
            prompt=prompt[:200],
            started_at=workflow.now(),
        )
        self.state.tasks[task_id] = task
        target_wf = capability.deliver_to_workflow if capability.detached else info.workflow_id
        try:
            handle = await self._start_task(capability, target, task, prompt, target_wf)
        except WorkflowAlreadyStartedError:
            # e.g. a run id reused while an abandoned task of its earlier run still runs
            del self.state.tasks[task_id]
            return loop.tool_message(
                call,
                f"Could not start the task: a run with id {child_id} is already running.",
                is_error=True,
            )
        # Its outcome arrives as a report signal (which survives continue-as-new); the handle's
        # own result is not needed.
        handle.add_done_callback(lambda done: done.cancelled() or done.exception())
        self.handles[task_id] = handle
        loop.emit("subagent_started", {"id": task_id, "agent": target.name, "workflow_id": child_id})
        if capability.detached:
            task.status = "finished"  # not ours to track any more
            task.delivered = True
        return loop.tool_message(
            call, json.dumps({"id": task_id, "agent": target.name, "status": "running"})
        )

    async def _start_task(
        self, capability: Subagents, target: Agent, task: SubagentTask, prompt: str,
        target_wf: str | None,
    ) -> Any:
        loop = self.loop
        info = workflow.info()
        task_id, child_id = task.id, task.workflow_id
        return await workflow.start_child_workflow(
            loop.workflow_type,
            RunInput(
                agent=target.name,
                input=prompt,
                max_turns=capability.max_turns,
                budget=loop.remaining_budget(capability.budget),
                extra_instructions=loop.input.extra_instructions,
                context=loop.input.context,
                run_path=self.state.run_path,
                report_to=ReportTarget(
                    task_id=task_id,
                    workflow_id=target_wf,
                    url=capability.deliver_url if capability.detached else None,
                ),
                unattended=capability.approvals == "reject",
                parent_workflow_id=info.workflow_id if capability.approvals == "parent" else None,
            ),
            id=child_id,
            task_queue=info.task_queue,
            # ABANDON even when attached: a parent's continue-as-new closes its run, and a
            # close policy would cancel the task there. The loop cancels unfinished tasks itself
            # when the run really ends (see close()).
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"{target.name} (background task of {self.state.agent}): {prompt[:120]}",
            search_attributes=loop.child_search_attributes(),
        )

    async def _wait(self, capability: Subagents, call: ToolCall, legacy: bool) -> Message:
        loop = self.loop
        if legacy:  # replaying a run recorded before waits were bounded: same timers as then
            old = _legacy_wait(call.arguments, self.running())
            if old is not None:
                ids, timeout = old
                if all(i in self.state.tasks for i in ids):
                    timed_out = False
                    try:
                        await workflow.wait_condition(
                            lambda: all(self.state.tasks[i].status != "running" for i in ids),
                            timeout=timeout,
                        )
                    except asyncio.TimeoutError:
                        timed_out = True
                    return self._collect(call, ids, waited=timeout, timed_out=timed_out)
        if capability.detached:
            return loop.tool_message(
                call,
                "wait_subagents is not available: background tasks here are detached, their "
                "reports are delivered elsewhere. Give your answer without waiting.",
                is_error=True,
            )
        args = self._parse(call)
        if isinstance(args, Message):
            return args
        tasks = self.state.tasks
        if args.ids:
            ids = list(dict.fromkeys(args.ids))
            unknown = [i for i in ids if i not in tasks]
            if unknown:
                return loop.tool_message(
                    call,
                    f"Unknown task id{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
                    f"{self._known()}.",
                    is_error=True,
                )
        else:
            ids = [
                t.id for t in tasks.values()
                if t.status == "running" or (t.report is not None and not t.delivered)
            ]
            if not ids:
                return loop.tool_message(call, self._nothing_to_wait_for())
        timed_out = False
        if any(tasks[i].status == "running" for i in ids):
            if args.timeout_seconds > 0:
                try:
                    await workflow.wait_condition(
                        lambda: all(tasks[i].status != "running" for i in ids),
                        timeout=args.timeout_seconds,
                    )
                except asyncio.TimeoutError:
                    timed_out = True
            else:
                timed_out = True  # asked not to wait
        return self._collect(call, ids, waited=args.timeout_seconds, timed_out=timed_out)

    def _nothing_to_wait_for(self) -> str:
        tasks = list(self.state.tasks.values())
        if not tasks:
            return "No tasks: none has been started with spawn_subagent."
        finished = [t for t in tasks if t.status in ("finished", "failed")]
        cancelled = [t for t in tasks if t.status == "cancelled"]
        parts = ["No task is running and no report is waiting to be read."]
        if finished:
            parts.append(
                "Finished: "
                + ", ".join(f"{t.id} ({t.agent}, {t.status})" for t in finished)
                + "; their reports were already delivered to you (each report is delivered "
                "once), so look for them earlier in the conversation."
            )
        if cancelled:
            parts.append(
                "Cancelled (no report): " + ", ".join(f"{t.id} ({t.agent})" for t in cancelled) + "."
            )
        return " ".join(parts)

    def _collect(
        self, call: ToolCall, ids: list[str], *, waited: float, timed_out: bool
    ) -> Message:
        """The wait's result: ready reports (taken back from the turn-boundary queue, so each
        is delivered once), what was already delivered or cancelled, and what still runs."""
        now = workflow.now()
        parts: list[str] = []
        still: list[SubagentTask] = []
        for task_id in ids:
            task = self.state.tasks[task_id]
            if task.status == "running":
                still.append(task)
            elif task.report is not None and not task.delivered:
                if task_id in self.state.report_queue:
                    self.state.report_queue.remove(task_id)
                self._delivered(task, via="wait_subagents")
                parts.append(self._render(task))
            elif task.status == "cancelled":
                parts.append(f"[{task_id} · {task.agent}] cancelled (no report)")
            else:
                parts.append(f"[{task_id} · {task.agent}] {task.status} (report already delivered)")
        if still:
            running = "; ".join(self._describe(t, now) for t in still)
            if timed_out and waited > 0:
                parts.append(f"The wait timed out after {waited:g} s. Still running: {running}.")
            else:
                parts.append(f"Did not wait (timeout_seconds was 0). Still running: {running}.")
        return self.loop.tool_message(call, "\n\n".join(parts))

    async def _cancel(self, call: ToolCall, task_id: str) -> Message:
        task = self.state.tasks.get(task_id)
        if task is None:
            return self.loop.tool_message(
                call, f"Unknown task id {task_id!r}; {self._known()}.", is_error=True
            )
        if task.status != "running":
            return self.loop.tool_message(call, f"Task {task_id} already {task.status}.")
        await self._request_cancel(task)
        return self.loop.tool_message(call, f"Task {task_id} cancelled.")

    async def _request_cancel(self, task: SubagentTask) -> None:
        task.status = "cancelled"
        task.report = None
        if task.id in self.state.report_queue:
            self.state.report_queue.remove(task.id)
        try:
            await workflow.get_external_workflow_handle(task.workflow_id).cancel()
        except Exception as exc:  # noqa: BLE001 - the child may have just ended on its own
            workflow.logger.info("cancel of %s: %s", task.workflow_id, exc)
        self.loop.emit("subagent_finished", {"id": task.id, "agent": task.agent, "status": "cancelled"})

    async def _send(self, call: ToolCall, args: SendToSubagentArgs) -> Message:
        task = self.state.tasks.get(args.id)
        if task is None:
            return self.loop.tool_message(
                call, f"Unknown task id {args.id!r}; {self._known()}.", is_error=True
            )
        if task.status != "running":
            return self.loop.tool_message(call, f"Task {task.id} already {task.status}.", is_error=True)
        try:
            await workflow.get_external_workflow_handle(task.workflow_id).signal(
                "send_message_signal", args.message
            )
        except Exception as exc:  # noqa: BLE001 - it ended just now; its report is on its way
            workflow.logger.info("signal to %s: %s", task.workflow_id, exc)
            return self.loop.tool_message(
                call, f"Task {task.id} has just ended; its report arrives shortly.", is_error=True
            )
        return self.loop.tool_message(call, f"Sent to {task.id}.")

    def on_report(self, report: ChildReport) -> None:
        """A child ended (signal handler): record its report for the next turn boundary."""
        task = self.state.tasks.get(report.task_id)
        if task is None or report.task_id in self.ended:
            return  # not ours, or a duplicate
        self.ended.add(report.task_id)
        task.usage = report.usage
        self.loop.add_usage(report.usage, check=False)
        if task.status != "running" or report.status == "cancelled":
            if task.status == "running":
                task.status = "cancelled"
            return  # cancelled by us (or by someone else): no report
        task.status = report.status
        text = truncate_report(report.output or "", self._capability_limit())
        task.report = text if report.status == "finished" else f"FAILED: {text}"
        self.state.report_queue.append(task.id)
        self.loop.emit(
            "subagent_finished", {"id": task.id, "agent": task.agent, "status": report.status}
        )

    def _capability_limit(self) -> int:
        capability = self.loop.current_agent.subagents
        return capability.max_result_chars if capability else 16_000

    def _render(self, task: SubagentTask) -> str:
        return f"[{task.id} · {task.agent}] {task.status}:\n{task.report}"

    def _delivered(self, task: SubagentTask, *, via: str) -> None:
        task.delivered = True
        self.loop.emit(
            "report_delivered",
            {"id": task.id, "agent": task.agent, "status": task.status, "via": via},
        )

    def deliver_reports(self) -> None:
        """At a turn boundary: queued reports enter the conversation as user-side messages."""
        while self.state.report_queue:
            task = self.state.tasks[self.state.report_queue.pop(0)]
            if task.delivered:
                continue
            self.state.transcript.append(
                Message.user(f"Background task report {self._render(task)}")
            )
            self._delivered(task, via="turn_boundary")

    def reminder(self) -> str | None:
        """Status of running background tasks, sent with each request but never saved; gone
        once no task runs."""
        running = self.running()
        if not running:
            return None
        now = workflow.now()
        lines = [f"- {self._describe(t, now)}" for t in running]
        capability = self.loop.current_agent.subagents
        if capability is None or not capability.detached:
            lines.append(
                "Do not give your final answer while tasks are running: collect their reports "
                "with wait_subagents, or cancel the ones you no longer need with cancel_subagent."
            )
        return "Background tasks:\n" + "\n".join(lines)

    async def close(self) -> None:
        """The run is ending: cancel unfinished tasks and wait until they have closed."""
        unfinished = self.running()
        own = [self.handles[t.id] for t in unfinished if t.id in self.handles]
        for task in unfinished:
            task.status = "cancelled"
            if task.id in self.handles:
                self.handles[task.id].cancel()  # requests the child's cancellation
                continue
            try:
                await workflow.get_external_workflow_handle(task.workflow_id).cancel()
            except Exception as exc:  # noqa: BLE001
                workflow.logger.info("cancel of %s: %s", task.workflow_id, exc)
        if own:  # started by this run: wait until each child has closed
            await asyncio.gather(*own, return_exceptions=True)
        inherited = {t.id for t in unfinished if t.id not in self.handles}
        if inherited:  # started before a continue-as-new: wait for their last report
            ids = inherited
            try:
                await workflow.wait_condition(
                    lambda: ids <= self.ended, timeout=CANCEL_WAIT
                )
            except asyncio.TimeoutError:
                workflow.logger.warning("subagents did not confirm cancellation: %s", ids)


def _legacy_arguments(name: str, raw: str) -> Any:
    """The arguments as the code before validation read them, where it went on to act (start,
    cancel or signal a child); ``None`` where it refused them or failed. Only for replaying runs
    recorded back then: new runs get :meth:`Children._parse`."""
    try:
        args = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    if name == "spawn_subagent":
        prompt, agent = args.get("prompt"), args.get("agent")
        if not isinstance(prompt, str) or not prompt.strip() or not isinstance(agent, (str, type(None))):
            return None
        return SpawnSubagentArgs.model_construct(prompt=prompt, agent=agent or None)
    if name == "cancel_subagent":
        return CancelSubagentArgs.model_construct(id=str(args.get("id", "")))
    if name == "send_to_subagent":
        message = args.get("message")
        if not isinstance(message, str):
            return None
        return SendToSubagentArgs.model_construct(id=str(args.get("id", "")), message=message)
    return None


def _legacy_wait(raw: str, running: list[SubagentTask]) -> tuple[list[str], float] | None:
    """What ``wait_subagents`` waited for before its arguments were validated (ids, timeout), or
    ``None`` where that code failed; used only to replay runs recorded back then."""
    try:
        args = json.loads(raw or "{}")
        ids = args.get("ids") or [t.id for t in running]
        timeout = float(args.get("timeout_seconds") or 60)
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            return None
        if timeout != timeout or timeout in (float("inf"), float("-inf")):
            return None
        return ids, max(timeout, 0.001)
    except (ValueError, TypeError, AttributeError, RecursionError, OverflowError):
        return None


async def _signal(workflow_id: str, signal: str, payload: Any) -> None:
    try:
        await workflow.get_external_workflow_handle(workflow_id).signal(signal, payload)
    except Exception as exc:  # noqa: BLE001 - the target may have ended; nothing to deliver to
        workflow.logger.info("signal %s to %s failed: %s", signal, workflow_id, exc)


async def send_report(target: ReportTarget, report: ChildReport) -> None:
    """Called by a child run when it ends."""
    if target.workflow_id:
        await _signal(target.workflow_id, target.signal, report)
    if target.url:
        from relaykit.activities.delivery import DELIVER_ACTIVITY, DeliveryRequest

        await workflow.execute_activity(
            DELIVER_ACTIVITY,
            DeliveryRequest(url=target.url, report=report),
            start_to_close_timeout=timedelta(seconds=30),
            summary=f"deliver report of {report.task_id}",
        )
