"""The subagent tools: ``spawn_subagent``, ``wait_subagents``, ``cancel_subagent`` and
``send_to_subagent`` (an agent with ``Subagents``), one kind of tool of the tool path.

They go through the tool path like every other tool (the loop guard included); their state is
the run's background tasks (:mod:`relaykit.workflows.subagent_tasks`). Arguments are validated
by the pydantic models of :mod:`relaykit.tool_args` before anything acts on them.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import ValidationError
from temporalio import workflow
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.workflow import ParentClosePolicy

from relaykit.agent import Agent, Subagents
from relaykit.messages import ToolCall, ToolSpec
from relaykit.run_ids import run_id_fits, too_long
from relaykit.runs import ReportTarget, RunInput, SubagentTask
from relaykit.tool_args import (
    SUBAGENT_ARGUMENTS,
    CancelSubagentArgs,
    SendToSubagentArgs,
    SpawnSubagentArgs,
    WaitSubagentsArgs,
)
from relaykit.workflows.call_record import ROUTE_SUBAGENTS, stand_in_agent
from relaykit.workflows.loop_guard import PATCH_ALL_KINDS
from relaykit.workflows.run_state import Run
from relaykit.workflows.spend import Spend
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.tool_kind import Prepared, ToolKind, ToolResult, invalid_arguments

SUBAGENT_ARGS_PATCH = "relaykit-validated-subagent-tools"
"""The subagent tools validate their arguments (before: read leniently, so some calls that are
now refused started a child, cancelled or signalled one), and ``wait_subagents`` does not wait
for ``timeout_seconds: 0`` and starts no timer when nothing runs (before: ``or 60``, no bound)."""


class LegacyWait:
    """``wait_subagents`` as recorded before waits were bounded (replay only)."""

    def __init__(self, ids: list[str], timeout: float) -> None:
        self.ids, self.timeout = ids, timeout


class SubagentTool(ToolKind):
    """One of the four subagent tools of one agent."""

    guard_patch = PATCH_ALL_KINDS  # guarded since the tool path is one
    route = ROUTE_SUBAGENTS

    def __init__(
        self, run: Run, tasks: SubagentTasks, agent: Agent, name: str, spec: ToolSpec | None
    ) -> None:
        assert agent.subagents is not None
        self.run = run
        self.tasks = tasks
        self.agent = agent
        self.capability: Subagents = agent.subagents
        self.name = name
        self._spec = spec
        # a detached task's report is delivered elsewhere (a URL, another run): in an
        # evaluation its spawn answers as recorded, never a delivery
        self.evaluates_children = name == "spawn_subagent" and not self.capability.detached

    def spec(self) -> ToolSpec | None:
        return self._spec  # detached: only spawn_subagent is shown; the others still answer

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        capability = self.capability
        legacy = not self.run.patched(SUBAGENT_ARGS_PATCH)
        if call.name == "wait_subagents":
            if legacy:  # replaying a run recorded before waits were bounded: same timers as then
                old = _legacy_wait(call.arguments, self.tasks.running())
                if old is not None and all(i in self.run.state.tasks for i in old[0]):
                    return Prepared(call, LegacyWait(*old))
            if capability.detached:
                return ToolResult(
                    "wait_subagents is not available: background tasks here are detached, their "
                    "reports are delivered elsewhere. Give your answer without waiting.",
                    is_error=True,
                )
            return self._parse(call)
        if capability.detached and call.name != "spawn_subagent" and not legacy:
            return ToolResult(
                f"{call.name} is not available: background tasks here are detached, their "
                "reports are delivered elsewhere. Only spawn_subagent is available.",
                is_error=True,
            )
        # replaying a run recorded before validation: act on what the old code accepted
        legacy_args = legacy and _legacy_arguments(call.name, call.arguments)
        if legacy_args:
            return Prepared(call, legacy_args)
        return self._parse(call)

    def _parse(self, call: ToolCall) -> Prepared | ToolResult:
        """The call's arguments as their pydantic model, or the error result the model reads."""
        try:
            return Prepared(
                call, SUBAGENT_ARGUMENTS[call.name].model_validate_json(call.arguments or "{}")
            )
        except ValidationError as exc:
            text = invalid_arguments(call.name, exc)
        except (ValueError, RecursionError) as exc:  # not expected from pydantic; never fatal
            text = f"Invalid arguments for tool {call.name!r}: {exc}. Fix them and call it again."
        return ToolResult(text, is_error=True)

    async def execute(self, prepared: Prepared) -> ToolResult:
        args = prepared.arguments
        if isinstance(args, LegacyWait):
            return await self._legacy_wait(args)
        if isinstance(args, WaitSubagentsArgs):
            return await self._wait(args)
        if isinstance(args, SpawnSubagentArgs):
            return await self._spawn(args, prepared.evaluation)
        if isinstance(args, CancelSubagentArgs):
            return await self._cancel(args.id)
        assert isinstance(args, SendToSubagentArgs)
        return await self._send(args)

    # --- spawn ----------------------------------------------------------------------------------

    def _target(self, args: SpawnSubagentArgs) -> tuple[str, Agent | None]:
        choices = {a.name: a for a in self.tasks.agents_for(self.agent)}
        name = args.agent or next(iter(choices))
        return name, choices.get(name)

    def refusal(self, prepared: Prepared) -> ToolResult | None:
        args = prepared.arguments
        if not isinstance(args, SpawnSubagentArgs):
            return None
        name, target = self._target(args)
        if target is None:
            choices = ", ".join(a.name for a in self.tasks.agents_for(self.agent))
            return ToolResult(
                f"No subagent named {name!r}; choose one of: {choices}.", is_error=True
            )
        running = self.tasks.running()
        starting = self.tasks.starting
        if len(running) + starting >= self.capability.max_concurrent:
            now = workflow.now()
            described = [self.tasks.describe(t, now) for t in running]
            described += ["one started by an earlier call of this turn"] * starting
            return ToolResult(
                f"Refused: {len(running) + starting} of at most "
                f"{self.capability.max_concurrent} tasks are already running: "
                + "; ".join(described)
                + ". Wait for one with wait_subagents or cancel one with cancel_subagent first.",
                is_error=True,
            )
        self.tasks.starting += 1  # until its task opens (SubagentTasks.open_task)
        return None

    async def _spawn(self, args: SpawnSubagentArgs, evaluation: Any = None) -> ToolResult:
        """Checked by :meth:`refusal` first; a spawn replayed as recorded may name an agent that
        today's code no longer lists, and starts as it did then. ``evaluation``: in a candidate
        run, the recorded task's calls, which the task runs against as a candidate itself."""
        run, tasks, capability = self.run, self.tasks, self.capability
        prompt = args.prompt
        name, target = self._target(args)
        if target is None:  # recorded as started, its agent gone (else refused: see refusal)
            target = stand_in_agent(name)
        task = tasks.open_task(target.name, prompt)
        task_id, child_id = task.id, task.workflow_id
        if not run_id_fits(child_id):  # the server would refuse the start, at every retry
            tasks.drop(task)
            return ToolResult(f"Could not start the task: {too_long(child_id)}.", is_error=True)
        info = workflow.info()
        target_wf = capability.deliver_to_workflow if capability.detached else info.workflow_id
        try:
            handle = await self._start_task(target, task, prompt, target_wf, evaluation)
        except WorkflowAlreadyStartedError:
            # e.g. a run id reused while an abandoned task of its earlier run still runs
            Spend(run).release(child_id)
            tasks.drop(task)
            return ToolResult(
                f"Could not start the task: a run with id {child_id} is already running.",
                is_error=True,
            )
        # Its outcome arrives as a report signal (which survives continue-as-new); the handle's
        # own result is not needed.
        handle.add_done_callback(lambda done: done.cancelled() or done.exception())
        tasks.handles[task_id] = handle
        run.emit("subagent_started", {"id": task_id, "agent": target.name, "workflow_id": child_id})
        if capability.detached:
            tasks.hand_over(task)
        return ToolResult(json.dumps({"id": task_id, "agent": target.name, "status": "running"}))

    async def _start_task(
        self,
        target: Agent,
        task: SubagentTask,
        prompt: str,
        target_wf: str | None,
        evaluation: Any = None,
    ) -> Any:
        run, capability = self.run, self.capability
        info = workflow.info()
        task_id, child_id = task.id, task.workflow_id
        return await workflow.start_child_workflow(
            run.workflow_type,
            RunInput(
                agent=target.name,
                input=prompt,
                max_turns=capability.max_turns,
                budget=Spend(run).child_budget(
                    capability.budget, child_id, parts=capability.max_concurrent
                ),
                budget_from=Spend(run).budget_from(),
                extra_instructions=run.input.extra_instructions,
                context=run.input.context,
                run_path=run.state.run_path,
                report_to=ReportTarget(
                    task_id=task_id,
                    workflow_id=target_wf,
                    url=capability.deliver_url if capability.detached else None,
                ),
                # a candidate's subagent runs unattended like the candidate (nobody approves)
                unattended=capability.approvals == "reject" or evaluation is not None,
                parent_workflow_id=info.workflow_id if capability.approvals == "parent" else None,
                evaluation=evaluation,
            ),
            id=child_id,
            task_queue=info.task_queue,
            # ABANDON even when attached: a parent's continue-as-new closes its run, and a
            # close policy would cancel the task there. The run cancels unfinished tasks itself
            # when it really ends (SubagentTasks.close).
            parent_close_policy=ParentClosePolicy.ABANDON,
            static_summary=f"{target.name} (background task of {run.state.agent}): {prompt[:120]}",
            search_attributes=run.child_search_attributes(target.name),
        )

    # --- wait, cancel, send ---------------------------------------------------------------------

    async def _legacy_wait(self, old: LegacyWait) -> ToolResult:
        tasks = self.run.state.tasks
        ids = old.ids
        timed_out = False
        try:
            await workflow.wait_condition(
                lambda: all(tasks[i].status != "running" for i in ids), timeout=old.timeout
            )
        except TimeoutError:
            timed_out = True
        return ToolResult(self.tasks.collect(ids, waited=old.timeout, timed_out=timed_out))

    async def _wait(self, args: WaitSubagentsArgs) -> ToolResult:
        tasks = self.run.state.tasks
        if args.ids:
            ids = list(dict.fromkeys(args.ids))
            unknown = [i for i in ids if i not in tasks]
            if unknown:
                return ToolResult(
                    f"Unknown task id{'s' if len(unknown) > 1 else ''}: {', '.join(unknown)}; "
                    f"{self.tasks.known()}.",
                    is_error=True,
                )
        else:
            ids = [
                t.id
                for t in tasks.values()
                if t.status == "running" or (t.report is not None and not t.delivered)
            ]
            if not ids:
                return ToolResult(self.tasks.nothing_to_wait_for())
        timed_out = False
        if any(tasks[i].status == "running" for i in ids):
            if args.timeout_seconds > 0:
                try:
                    await workflow.wait_condition(
                        lambda: all(tasks[i].status != "running" for i in ids),
                        timeout=args.timeout_seconds,
                    )
                except TimeoutError:
                    timed_out = True
            else:
                timed_out = True  # asked not to wait
        return ToolResult(self.tasks.collect(ids, waited=args.timeout_seconds, timed_out=timed_out))

    async def _cancel(self, task_id: str) -> ToolResult:
        task = self.run.state.tasks.get(task_id)
        if task is None:
            return ToolResult(f"Unknown task id {task_id!r}; {self.tasks.known()}.", is_error=True)
        if task.status != "running":
            return ToolResult(f"Task {task_id} already {task.status}.")
        await self.tasks.request_cancel(task)
        return ToolResult(f"Task {task_id} cancelled.")

    async def _send(self, args: SendToSubagentArgs) -> ToolResult:
        task = self.run.state.tasks.get(args.id)
        if task is None:
            return ToolResult(f"Unknown task id {args.id!r}; {self.tasks.known()}.", is_error=True)
        if task.status != "running":
            return ToolResult(f"Task {task.id} already {task.status}.", is_error=True)
        try:
            await workflow.get_external_workflow_handle(task.workflow_id).signal(
                "send_message_signal", args.message
            )
        except Exception as exc:  # noqa: BLE001 - it ended just now; its report is on its way
            workflow.logger.info("signal to %s: %s", task.workflow_id, exc)
            return ToolResult(
                f"Task {task.id} has just ended; its report arrives shortly.", is_error=True
            )
        return ToolResult(f"Sent to {task.id}.")


def _legacy_arguments(name: str, raw: str) -> Any:
    """The arguments as the code before validation read them, where it went on to act (start,
    cancel or signal a child); ``None`` where it refused them or failed. Only for replaying runs
    recorded back then: new runs get :meth:`SubagentTool._parse`."""
    try:
        args = json.loads(raw or "{}")
    except (ValueError, RecursionError):
        return None
    if not isinstance(args, dict):
        return None
    if name == "spawn_subagent":
        prompt, agent = args.get("prompt"), args.get("agent")
        if (
            not isinstance(prompt, str)
            or not prompt.strip()
            or not isinstance(agent, (str, type(None)))
        ):
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
