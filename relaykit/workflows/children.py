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
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from temporalio import workflow
from temporalio.exceptions import ChildWorkflowError, is_cancelled_exception
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
from relaykit.subagents import DEFAULT_INSTRUCTIONS, Subagents

if TYPE_CHECKING:
    from relaykit.workflows.loop import TurnLoop

REPORT_SIGNAL = "subagent_report"
CHILD_APPROVAL_SIGNAL = "child_approval"
CHILD_APPROVAL_DONE_SIGNAL = "child_approval_done"
CANCEL_WAIT = timedelta(seconds=60)

SUBAGENT_TOOLS = ("spawn_subagent", "wait_subagents", "cancel_subagent", "send_to_subagent")


def _object(properties: dict[str, Any], required: list[str]) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": properties,
        "required": required,
        "additionalProperties": False,
    }


def subagent_tool_specs(capability: Subagents, agents: list[Agent]) -> list[ToolSpec]:
    names = [a.name for a in agents]
    agent_property: dict[str, Any] = {
        "type": "string",
        "enum": names,
        "description": "Which subagent runs the task: "
        + "; ".join(f"{a.name}: {a.description or 'general'}" for a in agents),
    }
    return [
        ToolSpec(
            name="spawn_subagent",
            description="Start a background task and return its id at once. At most "
            f"{capability.max_concurrent} tasks run at a time.",
            parameters=_object(
                {
                    "prompt": {
                        "type": "string",
                        "description": "A complete task; the subagent cannot see this conversation.",
                    },
                    "agent": agent_property,
                },
                ["prompt"],
            ),
        ),
        ToolSpec(
            name="wait_subagents",
            description="Wait until the given tasks (default: all running) finish or the timeout "
            "passes; returns the reports that are ready.",
            parameters=_object(
                {
                    "ids": {"type": "array", "items": {"type": "string"}},
                    "timeout_seconds": {"type": "number", "default": 60},
                },
                [],
            ),
        ),
        ToolSpec(
            name="cancel_subagent",
            description="Cancel a running background task; it will produce no report.",
            parameters=_object({"id": {"type": "string"}}, ["id"]),
        ),
        ToolSpec(
            name="send_to_subagent",
            description="Send a message to a running task; it reads it at its next turn.",
            parameters=_object({"id": {"type": "string"}, "message": {"type": "string"}}, ["id", "message"]),
        ),
    ]


class Children:
    """The child-workflow wiring of one run (owned by its :class:`TurnLoop`)."""

    def __init__(self, loop: TurnLoop) -> None:
        self.loop = loop
        self.ended: set[str] = set()
        """Tasks whose run has ended (any status), as their reports said."""
        self.handles: dict[str, Any] = {}
        """Child handles of tasks started by this workflow run (not those of earlier runs of a
        run that continued as new): awaiting one waits until that child has really closed."""

    @property
    def state(self) -> Any:
        return self.loop.state

    # --- agent as tool --------------------------------------------------------------------------

    async def run_agent_tool(self, entry: AgentTool, call: ToolCall) -> Message:
        """Run the sub-agent as a child workflow and wait; its output is the tool result."""
        loop = self.loop
        try:
            prompt = json.loads(call.arguments or "{}").get("input")
        except (ValueError, AttributeError):
            prompt = None
        if not isinstance(prompt, str) or not prompt.strip():
            return loop.tool_message(
                call, f'{entry.name} needs a string argument "input" with the task.', is_error=True
            )
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
                id=f"{info.workflow_id}/{call.id}",
                result_type=RunResult,
                task_queue=info.task_queue,
                static_summary=f"{entry.agent.name} (asked by {self.state.agent}): {prompt[:120]}",
                search_attributes=loop.child_search_attributes(),
            )
        except ChildWorkflowError as exc:
            if is_cancelled_exception(exc):
                raise
            loop.add_usage(loop.usage_from_failure(exc.cause))
            detail = getattr(exc.cause, "message", None) or str(exc)
            return loop.tool_message(
                call, f"The {entry.agent.name} agent did not finish: {detail}", is_error=True
            )
        loop.add_usage(result.usage)
        content = result.output if isinstance(result.output, str) else json.dumps(result.output)
        return loop.tool_message(call, content)

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
        if agent.subagents is None:
            return None
        return agent.subagents.instructions or DEFAULT_INSTRUCTIONS

    def running(self) -> list[SubagentTask]:
        return [t for t in self.state.tasks.values() if t.status == "running"]

    async def run_tool(self, agent: Agent, call: ToolCall) -> Message:
        loop = self.loop
        capability = agent.subagents
        if capability is None:
            return loop.tool_message(call, f"Unknown tool {call.name!r}.", is_error=True)
        try:
            args = json.loads(call.arguments or "{}")
            if not isinstance(args, dict):
                raise ValueError("arguments must be a JSON object")
        except ValueError as exc:
            return loop.tool_message(call, f"Invalid arguments for {call.name}: {exc}", is_error=True)
        if call.name == "spawn_subagent":
            return await self._spawn(agent, capability, call, args)
        if call.name == "wait_subagents":
            return await self._wait(call, args)
        if call.name == "cancel_subagent":
            return await self._cancel(call, str(args.get("id", "")))
        return await self._send(call, args)

    async def _spawn(
        self, agent: Agent, capability: Subagents, call: ToolCall, args: dict[str, Any]
    ) -> Message:
        loop = self.loop
        prompt = args.get("prompt")
        if not isinstance(prompt, str) or not prompt.strip():
            return loop.tool_message(call, 'spawn_subagent needs a "prompt".', is_error=True)
        choices = {a.name: a for a in self.agents_for(agent)}
        name = args.get("agent") or next(iter(choices))
        target = choices.get(name)
        if target is None:
            return loop.tool_message(
                call, f"No subagent named {name!r}; choose one of: {', '.join(choices)}.", is_error=True
            )
        if len(self.running()) >= capability.max_concurrent:
            return loop.tool_message(
                call,
                f"Refused: {capability.max_concurrent} tasks are already running; wait for or "
                "cancel one first.",
                is_error=True,
            )
        info = workflow.info()
        self.state.tasks_started += 1
        task_id = f"task-{self.state.tasks_started}"
        child_id = f"{info.workflow_id}/{task_id}"
        # Registered before the start is awaited: spawns of the same turn run concurrently and
        # each must see the others when checking max_concurrent.
        task = SubagentTask(id=task_id, agent=target.name, workflow_id=child_id, prompt=prompt[:200])
        self.state.tasks[task_id] = task
        target_wf = capability.deliver_to_workflow if capability.detached else info.workflow_id
        handle = await workflow.start_child_workflow(
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

    async def _wait(self, call: ToolCall, args: dict[str, Any]) -> Message:
        ids = args.get("ids") or [t.id for t in self.running()]
        unknown = [i for i in ids if i not in self.state.tasks]
        if unknown:
            return self.loop.tool_message(call, f"Unknown task ids: {', '.join(unknown)}.", is_error=True)
        timeout = float(args.get("timeout_seconds") or 60)
        try:
            await workflow.wait_condition(
                lambda: all(self.state.tasks[i].status != "running" for i in ids),
                timeout=max(timeout, 0.001),
            )
        except asyncio.TimeoutError:
            pass
        reports = []
        for task_id in ids:
            task = self.state.tasks[task_id]
            if task.status == "running":
                reports.append(f"[{task_id} · {task.agent}] still running")
            elif task.report is not None and not task.delivered:
                task.delivered = True  # taken back from the queue: never delivered twice
                if task_id in self.state.report_queue:
                    self.state.report_queue.remove(task_id)
                reports.append(self._render(task))
            else:
                reports.append(f"[{task_id} · {task.agent}] {task.status} (report already delivered)")
        return self.loop.tool_message(call, "\n\n".join(reports) or "No tasks.")

    async def _cancel(self, call: ToolCall, task_id: str) -> Message:
        task = self.state.tasks.get(task_id)
        if task is None:
            return self.loop.tool_message(call, f"Unknown task id {task_id!r}.", is_error=True)
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

    async def _send(self, call: ToolCall, args: dict[str, Any]) -> Message:
        task = self.state.tasks.get(str(args.get("id", "")))
        message = args.get("message")
        if task is None or not isinstance(message, str):
            return self.loop.tool_message(call, "send_to_subagent needs a known id and a message.", is_error=True)
        if task.status != "running":
            return self.loop.tool_message(call, f"Task {task.id} already {task.status}.", is_error=True)
        await workflow.get_external_workflow_handle(task.workflow_id).signal(
            "send_message_signal", message
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
        limit = self._capability_limit()
        text = report.output or ""
        if len(text) > limit:
            text = text[:limit] + f"\n[… report truncated: {len(text) - limit} characters dropped]"
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

    def deliver_reports(self) -> None:
        """At a turn boundary: queued reports enter the conversation as user-side messages."""
        while self.state.report_queue:
            task = self.state.tasks[self.state.report_queue.pop(0)]
            if task.delivered:
                continue
            task.delivered = True
            self.state.transcript.append(
                Message.user(f"Background task report {self._render(task)}")
            )

    def reminder(self) -> str | None:
        """Status of background tasks, sent with each request but never saved."""
        if not self.state.tasks:
            return None
        lines = [
            f"- {t.id} ({t.agent}): {t.status}" + (" (report delivered)" if t.delivered and t.report else "")
            for t in self.state.tasks.values()
        ]
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
