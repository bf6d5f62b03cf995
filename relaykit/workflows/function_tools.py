"""Function tools (``@relaykit.tool``): each call is one activity named after the tool.

The worker registers the activity (:mod:`relaykit.activities.tool_activities`), which validates
again, runs the function, and caps its output; here the arguments are checked before anything
is scheduled, and the tool's ``needs_approval`` rule decides whether a person answers first.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from relaykit.agent import Agent
from relaykit.messages import ToolCall, ToolSpec
from relaykit.tools import Tool, ToolInvocation, ToolOutcome, summarize_call
from relaykit.workflows import tool_outcome
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.run_priority import run_priority
from relaykit.workflows.run_state import Run
from relaykit.workflows.tool_kind import Prepared, ToolKind, ToolResult


class FunctionTool(ToolKind):
    def __init__(self, run: Run, approvals: Approvals, agent: Agent, entry: Tool) -> None:
        self.run = run
        self.approvals = approvals
        self.agent = agent
        self.entry = entry
        self.name = entry.name
        self.approval_timeout = entry.approval_timeout
        self.max_output_chars = entry.max_output_chars
        self.effect = entry.effect

    def spec(self) -> ToolSpec:
        return self.entry.spec

    def approval_hint(self, call: ToolCall) -> bool:
        entry = self.entry
        if not entry.needs_approval:
            return False
        try:
            arguments = entry.parse_arguments(call.arguments).model_dump()
        except Exception:  # noqa: BLE001 - prepare() turns this into an error result
            return False
        return entry.requires_approval(arguments)  # user code: the tool path guards it

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        entry = self.entry
        try:
            arguments = entry.parse_arguments(call.arguments)
        except ValueError as exc:
            return ToolResult(str(exc), is_error=True)
        except Exception as exc:  # noqa: BLE001 - whatever the model wrote: a result, not a stuck task
            return ToolResult(f"Invalid arguments for tool {entry.name!r}: {exc}", is_error=True)
        return Prepared(call, arguments)

    async def execute(self, prepared: Prepared) -> ToolResult:
        entry, call = self.entry, prepared.call
        invocation = ToolInvocation(
            call_id=call.id,
            arguments=call.arguments,
            agent=self.agent.name,
            run_path=self.run.state.run_path,
            # [tool effects] idempotency key and recorded effect (relaykit.workflows.tool_outcome)
            **tool_outcome.invocation_fields(self.run, call, entry.effect, entry.on_unknown),
        )  # the workflow id is in the activity's own info: not repeated in every input

        async def execute(request: ToolInvocation) -> ToolOutcome:
            outcome: ToolOutcome = await workflow.execute_activity(
                entry.name,
                request,
                result_type=ToolOutcome,
                start_to_close_timeout=entry.timeout,
                heartbeat_timeout=entry.heartbeat_timeout or None,  # timedelta(0): off
                retry_policy=entry.retry,
                task_queue=entry.task_queue,
                summary=tool_outcome.summary(summarize_call(entry.name, call.arguments), request),
                **run_priority(),  # the run's, as Temporal gives it anyway: visible in history
            )
            return outcome

        try:
            # [tool effects] a "write" call lost in flight is reported or asked about, not rerun
            outcome = await tool_outcome.run_guarded(
                self.run,
                self.approvals,
                self.agent,
                self,
                call,
                invocation,
                execute,
                what=f"tool {entry.name!r}",
            )
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            return ToolResult(
                f"Tool {entry.name!r} failed and was not retried further: {detail}", is_error=True
            )
        return ToolResult(outcome.content, is_error=outcome.is_error)
