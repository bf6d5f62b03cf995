"""The model call of a turn: the request the current agent sends, and the activity that sends it.

The request is built from the run state (it writes nothing): the system prompt (the agent's
instructions, the subagent guidance, the run's extra instructions), the transcript as the
transcript seam sends it (:mod:`relaykit.workflows.context`), the tools of the tool path, the
output schema and the settings (tools are withheld on the last allowed turn and when the loop
guard says the model must answer). The turn loop counts the response's usage and records what
the model workers stored. A steer cancels the turn's call in flight (:meth:`ModelCalls.steer`);
the turn loop then drops it and takes the same turn again with the person's text.

A summary call (compaction, :mod:`relaykit.workflows.long_runs`) goes through here too, labelled
``agent · summary after turn N · model`` so that nobody (a person in the Temporal UI, a fork
reading the history) takes it for a turn. A steer does not cancel it: a summary answers nothing
the steer corrects, and dropping it would only make it again; the turn loop hands the steer's
text to the turn's call that follows it.

Workflow code: deterministic, no I/O (the model call is the ``relaykit.model_call`` activity).
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from relaykit import errors
from relaykit.agent import Agent, RunContext
from relaykit.messages import ModelResponse
from relaykit.models.queues import model_queue
from relaykit.models.spec import ModelRequest, ModelSettings
from relaykit.output import OutputType
from relaykit.runs import MODEL_ACTIVITY
from relaykit.transcripts import REQUEST_PART_MISSING, TRANSCRIPT_MISSING
from relaykit.workflows.loop_guard import withhold_tools
from relaykit.workflows.run_priority import run_priority
from relaykit.workflows.run_state import Run
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.tool_path import ToolPath

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=8,
)


def system_prompt(
    run: Run, tasks: SubagentTasks, agent: Agent, output: OutputType | None = None
) -> str:
    ctx = RunContext(
        agent=agent.name,
        turn=run.state.turn,
        workflow_id=workflow.info().workflow_id,
        run_path=run.state.run_path,
        context=run.input.context,
    )
    parts = [agent.render_instructions(ctx), tasks.instructions(agent) or ""]
    if run.input.extra_instructions:
        parts.append(run.input.extra_instructions)
    # [lovia semantics] the schema also in the prompt: some servers ignore response_format
    if output is not None and run.setup_flag("output_schema_in_prompt"):
        parts.append(output.instructions())
    return "\n\n".join(part for part in parts if part)


def settings_for(run: Run, agent: Agent) -> ModelSettings:
    settings = agent.model_settings or ModelSettings()
    if run.input.answer_on_last_turn and run.state.turn >= run.input.max_turns:
        return settings.model_copy(update={"tool_choice": "none"})
    if withhold_tools(run.state, agent):  # stuck or out of tool turns (loop guard)
        return settings.model_copy(update={"tool_choice": "none"})
    if settings.first_turn_tool_choice and run.state.turn == 1:
        return settings.model_copy(update={"tool_choice": settings.first_turn_tool_choice})
    return settings


def build_request(
    run: Run, tools: ToolPath, tasks: SubagentTasks, agent: Agent, output: OutputType | None
) -> ModelRequest:
    try:
        payload = run.transport.payload(run.state)
    except LookupError:
        run.fail(
            "the start of the transcript is only in the transcript store, which the model "
            "worker could not read",
            TRANSCRIPT_MISSING,
        )
    request = ModelRequest(
        model=run.graph.model_for(agent),
        system=system_prompt(run, tasks, agent, output),
        messages=payload.messages,
        base_ref=payload.base_ref,
        base_count=payload.base_count,
        store_transcript=payload.store,
        tools=tools.tool_specs(agent),
        output=output.spec if output else None,
        settings=settings_for(run, agent),
        reminder=tasks.reminder(),
    )
    return run.transport.shrink(run.state, request)


PATCH_SUMMARY_NOT_STEERED = "relaykit.summary-call-not-steered"
"""A steer lets a summary call finish, and the text that arrived meanwhile goes into the next
call; before it, the steer cancelled the summary and failed the workflow task (compatibility
data: never rename)."""

SUMMARY_LABEL = "summary after turn"
"""The middle part of a summary call's activity summary (read by :mod:`relaykit.fork`)."""


class SteeredAway(Exception):
    """The model call in flight was cancelled by a steer (not by the run's cancellation)."""


class ModelCalls:
    """The model calls of one run, and the one in flight, so that a steer can cancel it."""

    def __init__(self) -> None:
        self._in_flight: Any = None
        self._summary_in_flight = False
        self.steered = False
        """A steer cancelled the call in flight; the turn loop resets it once it has dropped
        that call."""

    def steer(self) -> bool:
        """Cancel the turn's call in flight, if any (its answer is never used); whether one was.
        A summary call in flight is left to finish (see the module's docstring)."""
        call = self._in_flight
        if call is None or call.done():
            return False
        if self._summary_in_flight and summary_not_steered():
            return False
        self.steered = True
        call.cancel()
        return True

    async def execute(
        self, run: Run, request: ModelRequest, agent: Agent, *, summary: bool = False
    ) -> ModelResponse:
        """Send ``request``; ``summary`` marks a compaction's summary call, not a turn's."""
        spec = request.model
        what = f"{SUMMARY_LABEL} {run.state.turn}" if summary else f"turn {run.state.turn}"
        self._summary_in_flight = summary
        options: dict[str, Any] = run_priority()  # the run's: visible in history
        if run.setup_flag("provider_queues"):  # the provider's queue, where its limits hold
            options["task_queue"] = model_queue(spec, workflow.info().task_queue)
        # Started as a handle (the same command as execute_activity) so that a steer can cancel
        # it; TRY_CANCEL, the default, means the run does not wait for the cancel to land.
        self._in_flight = workflow.start_activity(
            MODEL_ACTIVITY,
            request,
            result_type=ModelResponse,
            start_to_close_timeout=timedelta(seconds=spec.timeout_seconds + 30),
            heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_seconds),
            retry_policy=MODEL_RETRY,
            summary=f"{agent.name} · {what} · {spec.label}",
            **options,
        )
        try:
            response: ModelResponse = await self._in_flight
            return response
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                if self.steered:  # a person steered the run: this answer is never used
                    raise SteeredAway() from None
                raise  # the run is being cancelled: end as cancelled, not failed
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type in (
                TRANSCRIPT_MISSING,
                REQUEST_PART_MISSING,
            ):
                if request.base_ref is not None or request.static_ref is not None:
                    raise
            kind = cause.type if isinstance(cause, ApplicationError) else None
            detail = cause.message if cause is not None and hasattr(cause, "message") else str(exc)
            run.fail(
                f"model call failed for agent {agent.name!r} at turn {run.state.turn}: {detail}",
                kind or errors.MODEL_CALL_FAILED,
            )
        finally:
            self._in_flight = None
            self._summary_in_flight = False


def summary_not_steered() -> bool:
    """Whether this run lets a summary call finish through a steer (every run but those
    recorded before, which replay the cancel they made)."""
    return workflow.patched(PATCH_SUMMARY_NOT_STEERED)
