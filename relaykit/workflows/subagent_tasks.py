"""Background subagents' bookkeeping: the tasks a run started, their reports, and their end.

Subagents are child ``AgentRun`` workflows the parent does not await (``<parent id>/task-N``).
When one ends it signals its report to the parent *by workflow id*
(:data:`REPORT_SIGNAL`), so the report reaches the parent's current run even after a
continue-as-new. Reports are delivered at turn boundaries, as user-side messages, or in a
``wait_subagents`` result, each exactly once. Usage of tasks counts towards the parent, so a
root budget caps the whole tree. The tools the model calls are
:mod:`relaykit.workflows.subagent_tools`; this module is the state they share with the turn
loop (what runs, what is ready, what the request's reminder says) and the run's end (unfinished
tasks are cancelled).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime, timedelta
from typing import Any

from temporalio import workflow

from relaykit.agent import Agent, Subagents
from relaykit.messages import Message, ToolSpec
from relaykit.run_ids import child_run_id
from relaykit.runs import DELIVER_ACTIVITY, ChildReport, DeliveryRequest, ReportTarget, SubagentTask
from relaykit.subagents import DEFAULT_INSTRUCTIONS, DETACHED_INSTRUCTIONS
from relaykit.tool_args import (
    MAX_WAIT_SECONDS,
    CancelSubagentArgs,
    SendToSubagentArgs,
    SpawnSubagentArgs,
    WaitSubagentsArgs,
)
from relaykit.workflows.run_state import Run, signal_workflow
from relaykit.workflows.spend import Spend

REPORT_SIGNAL = "subagent_report"
CANCEL_WAIT = timedelta(seconds=60)


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


class SubagentTasks:
    """The background tasks of one run (owned by the run; read and changed by the subagent
    tools, the turn boundary and the report signal)."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self.ended: set[str] = set()
        """Tasks whose run has ended (any status), as their reports said."""
        self.handles: dict[str, Any] = {}
        """Child handles of tasks started by this workflow run (not those of earlier runs of a
        run that continued as new): awaiting one waits until that child has really closed."""
        self.starting = 0
        """Spawns admitted in this turn whose task is not open yet: a turn's calls may all be
        admitted before any starts (``relaykit.workflows.call_record``), and each counts
        against ``max_concurrent`` from its admission."""

    @property
    def state(self) -> Any:
        return self.run.state

    def agents_for(self, agent: Agent) -> list[Agent]:
        capability = agent.subagents
        assert capability is not None
        if capability.agents:
            return list(capability.agents)
        return [self.run.graph.subagent_clone(agent)]

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

    # --- the tasks' part of the run state: written here only -------------------------------------

    def open_task(self, agent: str, prompt: str) -> SubagentTask:
        """A new task, registered before its child starts: spawns of the same turn run
        concurrently and each must see the others when checking ``max_concurrent``."""
        state = self.state
        self.starting = max(self.starting - 1, 0)
        state.tasks_started += 1
        task_id = f"task-{state.tasks_started}"
        task = SubagentTask(
            id=task_id,
            agent=agent,
            workflow_id=child_run_id(workflow.info().workflow_id, task_id),
            prompt=prompt[:200],
            started_at=workflow.now(),
        )
        state.tasks[task_id] = task
        return task

    def drop(self, task: SubagentTask) -> None:
        """A task whose child could not start."""
        del self.state.tasks[task.id]

    def hand_over(self, task: SubagentTask) -> None:
        """A detached task: its report is delivered elsewhere, not ours to track any more."""
        task.status = "finished"
        task.delivered = True

    def running(self) -> list[SubagentTask]:
        return [t for t in self.state.tasks.values() if t.status == "running"]

    def _since(self, task: SubagentTask, now: datetime | None = None) -> str:
        if task.started_at is None:
            return ""
        return (
            f"running for {_elapsed(((now or workflow.now()) - task.started_at).total_seconds())}"
        )

    def describe(self, task: SubagentTask, now: datetime | None = None) -> str:
        """``task-1 (researcher, running for 2m 05s): "first words of its prompt"``."""
        detail = [task.agent]
        if task.status == "running":
            detail.append(self._since(task, now) or "running")
        else:
            detail.append(task.status)
        prompt = task.prompt if len(task.prompt) <= 60 else task.prompt[:59] + "…"
        quoted = json.dumps(prompt, ensure_ascii=False)
        return f"{task.id} ({', '.join(d for d in detail if d)}): {quoted}"

    def known(self) -> str:
        if not self.state.tasks:
            return "no task has been started yet"
        return "known tasks: " + ", ".join(
            f"{t.id} ({t.status})" for t in self.state.tasks.values()
        )

    def nothing_to_wait_for(self) -> str:
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
                "Cancelled (no report): "
                + ", ".join(f"{t.id} ({t.agent})" for t in cancelled)
                + "."
            )
        return " ".join(parts)

    def collect(self, ids: list[str], *, waited: float, timed_out: bool) -> str:
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
                self.delivered(task, via="wait_subagents")
                parts.append(self.render(task))
            elif task.status == "cancelled":
                parts.append(f"[{task_id} · {task.agent}] cancelled (no report)")
            else:
                parts.append(f"[{task_id} · {task.agent}] {task.status} (report already delivered)")
        if still:
            running = "; ".join(self.describe(t, now) for t in still)
            if timed_out and waited > 0:
                parts.append(f"The wait timed out after {waited:g} s. Still running: {running}.")
            else:
                parts.append(f"Did not wait (timeout_seconds was 0). Still running: {running}.")
        return "\n\n".join(parts)

    async def request_cancel(self, task: SubagentTask) -> None:
        task.status = "cancelled"
        task.report = None
        if task.id in self.state.report_queue:
            self.state.report_queue.remove(task.id)
        try:
            await workflow.get_external_workflow_handle(task.workflow_id).cancel()
        except Exception as exc:  # noqa: BLE001 - the child may have just ended on its own
            workflow.logger.info("cancel of %s: %s", task.workflow_id, exc)
        self.run.emit(
            "subagent_finished", {"id": task.id, "agent": task.agent, "status": "cancelled"}
        )

    def on_report(self, report: ChildReport) -> None:
        """A child ended (signal handler): record its report for the next turn boundary."""
        task = self.state.tasks.get(report.task_id)
        if task is None or report.task_id in self.ended:
            return  # not ours, or a duplicate
        self.ended.add(report.task_id)
        task.usage = report.usage
        Spend(self.run).release(task.workflow_id)  # its cost replaces what it held
        self.run.add_usage(report.usage, check=False)
        if task.status != "running" or report.status == "cancelled":
            if task.status == "running":
                task.status = "cancelled"
            return  # cancelled by us (or by someone else): no report
        task.status = report.status
        text = truncate_report(report.output or "", self._capability_limit())
        task.report = text if report.status == "finished" else f"FAILED: {text}"
        self.state.report_queue.append(task.id)
        self.run.emit(
            "subagent_finished", {"id": task.id, "agent": task.agent, "status": report.status}
        )

    def _capability_limit(self) -> int:
        capability = self.run.current_agent.subagents
        return capability.max_result_chars if capability else 16_000

    def render(self, task: SubagentTask) -> str:
        return f"[{task.id} · {task.agent}] {task.status}:\n{task.report}"

    def delivered(self, task: SubagentTask, *, via: str) -> None:
        task.delivered = True
        self.run.emit(
            "report_delivered",
            {"id": task.id, "agent": task.agent, "status": task.status, "via": via},
        )

    def deliver_reports(self) -> list[Message]:
        """At a turn boundary: queued reports, as the user-side messages the turn loop puts in
        the conversation."""
        messages: list[Message] = []
        while self.state.report_queue:
            task = self.state.tasks[self.state.report_queue.pop(0)]
            if task.delivered:
                continue
            messages.append(Message.user(f"Background task report {self.render(task)}"))
            self.delivered(task, via="turn_boundary")
        return messages

    def reminder(self) -> str | None:
        """Status of running background tasks, sent with each request but never saved; gone
        once no task runs."""
        running = self.running()
        if not running:
            return None
        now = workflow.now()
        lines = [f"- {self.describe(t, now)}" for t in running]
        capability = self.run.current_agent.subagents
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
                await workflow.wait_condition(lambda: ids <= self.ended, timeout=CANCEL_WAIT)
            except TimeoutError:
                workflow.logger.warning("subagents did not confirm cancellation: %s", ids)


async def send_report(target: ReportTarget, report: ChildReport) -> None:
    """Called by a child run when it ends."""
    if target.workflow_id:
        await signal_workflow(target.workflow_id, target.signal, report)
    if target.url:
        await workflow.execute_activity(
            DELIVER_ACTIVITY,
            DeliveryRequest(url=target.url, report=report),
            start_to_close_timeout=timedelta(seconds=30),
            summary=f"deliver report of {report.task_id}",
        )
