"""The turn loop: the only place that owns a run's mutable state.

One turn = one model call (an activity) followed by the tool calls it asked for (activities,
child workflows, or a handoff). The loop runs inside a Temporal workflow, so everything here is
deterministic: the world is touched only through activities and child workflows, and time comes
from ``workflow.now()``. After a crash, Temporal replays the history through this code and the
run goes on without repeating any finished model or tool call.

Turn boundaries are where the outside world gets in: injected messages enter the transcript,
a pause takes effect, and background reports are delivered. Nothing from outside is applied in
the middle of a turn.

Where things live:
- the handoff switch: :meth:`TurnLoop._run_handoff` (only here);
- child workflows (agent-as-tool, background subagents): :mod:`relaykit.workflows.children`;
- approvals: :meth:`TurnLoop._await_approval`;
- how the transcript reaches the model: :mod:`relaykit.workflows.context`.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from relaykit import errors
from relaykit.agent import Agent, AgentTool, Budget, RunContext
from relaykit.context_policy import default_context_policy
from relaykit.graph import AgentGraph
from relaykit.handoff import (
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    find_tool,
    handoffs_by_name,
    own_tool_specs,
    parse_handoff_args,
)
from relaykit.messages import Message, ModelResponse, ToolCall, ToolSpec, Usage
from relaykit.models.spec import ModelRequest, ModelSettings
from relaykit.output import OutputType, repairs_allowed
from relaykit.runs import (
    ApprovalDecision,
    EventKind,
    PendingApproval,
    RunEvent,
    RunInput,
    RunResult,
    RunSetup,
    RunState,
)
from relaykit.tools import Tool, ToolInvocation, ToolOutcome, summarize_call
from relaykit.workflows.children import SUBAGENT_TOOLS, Children
from relaykit.transcripts import REQUEST_PART_MISSING, TRANSCRIPT_MISSING
from relaykit.workflows import tool_outcome
from relaykit.workflows.context import ContextTransport
from relaykit.workflows.mcp_tools import MCPTools
from relaykit.model_output import check_calls, check_ids_needed, parse_object
from relaykit.workflows.loop_guard import check_repeat, withhold_tools
from relaykit.workflows.semantics import recorded_semantics

MODEL_ACTIVITY = "relaykit.model_call"
"""Activity type of every model call (compatibility data: runs in flight depend on it)."""
AGENT_RUN_WORKFLOW = "AgentRun"
"""Workflow type of a run (compatibility data)."""

MODEL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=60),
    maximum_attempts=8,
)
HANDOFF_CALLBACK_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_attempts=3,
)
"""``on_handoff`` is on the conversation's critical path: a few quick retries for a blip, then the
handoff fails with an error result (Temporal's default policy would retry a broken callback
forever and stall the run)."""
# Patch ids (docs/replay.md): each guards a change in the commands a run issues, and is only
# consulted when the change applies (a marker lands in history only then).
PATCH_CALL_IDS = "relaykit.unique-call-ids"
PATCH_BAD_ARGUMENTS = "relaykit.reject-bad-arguments"
PATCH_APPROVAL_ORDER = "relaykit.approval-request-order"
PATCH_RUN_SETUP = "relaykit.run-setup"
PATCH_SEARCH_ATTRIBUTES = "relaykit.run-setup.search-attributes"
PATCH_EVENT_GROUPS = "relaykit.run-setup.event-groups"
MAX_EVENTS_KEPT = 2_000
EVENTS_KEPT_ACROSS_RUNS = 200


class SteeredAway(Exception):
    """The model call in flight was cancelled by a steer (not by the run's cancellation)."""


class TurnLoop:
    """Runs one agent run to its end. Build it with the run's input; call :meth:`run`."""

    def __init__(
        self,
        graph: AgentGraph,
        run_input: RunInput,
        *,
        output_type: Any = None,
    ) -> None:
        self.graph = graph
        self.input = run_input
        self.output_override = OutputType(output_type) if output_type is not None else None
        self.transport = ContextTransport(run_input.transcript_transport)
        self._output_types: dict[str, OutputType] = {}
        self._tool_specs: dict[str, list[ToolSpec]] = {}
        if run_input.state is not None:
            self.state = run_input.state
        else:
            self.state = RunState(
                agent=run_input.agent,
                run_path=[*run_input.run_path, run_input.agent],
            )
        self.on_change: Callable[[], None] | None = None
        """Called after state a person can see changed (the workflow updates its UI details)."""
        self.children = Children(self)
        self.mcp = MCPTools(self)
        self._pending_switch: tuple[Handoff, str | None] | None = None
        self._background: list[asyncio.Task[Any]] = []
        self.workflow_type = AGENT_RUN_WORKFLOW
        self._turns_this_run = 0
        self._last_input_tokens = 0
        self._argument_problems: dict[str, str | None] = {}
        self._decided: dict[str, asyncio.Event] = {}
        self._model_call: Any = None
        """The model activity in flight (a steer cancels it)."""
        self._steered = False
        """Approval decisions later calls of the turn wait for (lovia's request order)."""

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        self._record_setup()
        if self.state.agent not in self.graph.agents:
            raise ApplicationError(
                f"unknown agent {self.state.agent!r}; this worker serves: "
                + ", ".join(sorted(self.graph.agents)),
                type=errors.UNKNOWN_AGENT,
                non_retryable=True,
            )
        if self.input.state is None:
            self._start_transcript()
        if self.input.state is not None:
            self.emit("continued_as_new", {"run": self.state.runs})
        try:
            result = await self._loop()
        except BaseException as exc:  # a failed or cancelled run still stops its background tasks
            if is_cancelled_exception(exc):
                self.set_status("cancelled")
            if isinstance(exc, ApplicationError) or is_cancelled_exception(exc):
                await self._wind_down()
            raise
        await self._wind_down()
        return result

    async def _wind_down(self) -> None:
        """Before the run ends: stop unfinished background tasks, flush pending signals."""
        await self.children.close()
        if self._background:
            await asyncio.gather(*self._background)

    def spawn(self, coro: Any) -> None:
        """Run ``coro`` in the background (signals sent from handlers); awaited before the end."""
        self._background.append(asyncio.ensure_future(coro))

    async def _loop(self) -> RunResult:
        while True:
            await self._turn_boundary()
            await self._maybe_continue_as_new()
            await self._maybe_compact()
            if self.state.turn >= self.input.max_turns:
                self._fail(
                    f"the run reached max_turns={self.input.max_turns} without a final answer",
                    errors.MAX_TURNS_EXCEEDED,
                )
            self.state.turn += 1
            self._turns_this_run += 1
            agent = self.current_agent
            with self.turn_group(agent):  # [observability] one event group per turn
                try:
                    response = await self._call_model(agent)
                except SteeredAway:  # the steer's text enters at the boundary; same turn again
                    self._steered = False
                    self.state.turn -= 1
                    self._turns_this_run -= 1
                    continue
            message = response.message.model_copy(update={"agent": agent.name})
            calls, message, corrected = self._checked_calls(message)
            self.state.transcript.append(message)
            if not corrected:
                self.transport.after_response(self.state, response.transcript_ref)
            # else: the store holds the calls as the provider sent them; the next request sends
            # the corrected message itself, after the previous stored prefix.
            if message.content:
                self.emit("message", {"text": message.content})
            self._check_budget()
            if not message.tool_calls:
                if self.state.mailbox:  # a message arrived during this turn: answer it too
                    continue
                done, output = self._final_output(agent, message.content)
                if done:
                    return self._finish(output)
                continue
            with self.turn_group(agent):  # [observability]
                await self._run_tool_calls(agent, calls)

    @property
    def current_agent(self) -> Agent:
        return self.graph.agent(self.state.agent)

    def turn_group(self, agent: Agent) -> Any:
        """Marks the commands of this turn (model call, tool calls, child runs) as one event
        group for the Temporal UI, when the worker enables it (``Worker(event_groups=True)``).
        Experimental in the SDK; it adds no history event, but a labelled marker to each
        command, so it is off by default (docs/observability.md)."""
        if not self.setup_flag("event_groups"):
            return contextlib.nullcontext()
        label = f"turn {self.state.turn} · {agent.name}"
        return workflow.create_event_group(f"turn-{self.state.turn}", label=label).scope()

    def _start_transcript(self) -> None:
        given = self.input.input
        if isinstance(given, str):
            self.state.transcript.append(Message.user(given))
        else:
            self.state.transcript.extend(given)
        self.state.task = next((m for m in self.state.transcript if m.role == "user"), None)
        if self.input.fork is not None:  # a fork goes on from its origin's turn
            self.state.turn = self.input.fork.turn
        self.emit("run_started", {"input": given if isinstance(given, str) else len(given)})

    # --- choices recorded once per run -----------------------------------------------------------

    def _record_setup(self) -> None:
        """Decide, once per run, what depends on the worker's configuration and changes the
        commands a run issues (search attribute upserts, event groups), and record it: as patch
        markers in the first workflow task, then in the state a continue-as-new carries. Any
        worker replays the run the way it was recorded, whatever its own configuration."""
        if self.state.setup is not None:
            return
        if not workflow.patched(PATCH_RUN_SETUP):  # started before the choices were recorded
            self.state.setup = RunSetup(
                search_attributes=self.graph.search_attributes,
                event_groups=self.graph.event_groups,
            )
            return
        self.state.setup = RunSetup(
            search_attributes=_recorded_choice(
                PATCH_SEARCH_ATTRIBUTES, self.graph.search_attributes
            ),
            event_groups=_recorded_choice(PATCH_EVENT_GROUPS, self.graph.event_groups),
            **recorded_semantics(),  # [lovia semantics, issue 25] relaykit.workflows.semantics
            **tool_outcome.recorded_setup(),  # [tool effects] relaykit.workflows.tool_outcome
        )

    def setup_flag(self, name: str) -> bool:
        """A recorded choice of :class:`RunSetup` (the worker's configuration before it is
        recorded)."""
        source: Any = self.state.setup if self.state.setup is not None else self.graph
        return bool(getattr(source, name, False))

    # --- what the model wrote -------------------------------------------------------------------

    def _checked_calls(self, message: Message) -> tuple[list[ToolCall], Message, bool]:
        """The calls to run and the message to record (:mod:`relaykit.model_output`),
        and whether the message differs from what the provider sent."""
        if not message.tool_calls:
            return [], message, False
        fix_ids = check_ids_needed(message) and workflow.patched(PATCH_CALL_IDS)
        checked = check_calls(
            message, self.state.turn, fix_ids=fix_ids, run_key=workflow.info().workflow_id
        )
        self._argument_problems = checked.problems
        return checked.calls, checked.recorded, checked.changed

    def _argument_problem(self, call: ToolCall) -> str | None:
        """Why a call's arguments cannot reach any tool (not a JSON object), as the error
        result the model reads; ``None`` when they can."""
        if call.arguments in self._argument_problems:  # parsed once, by _checked_calls
            problem = self._argument_problems[call.arguments]
        else:
            problem = parse_object(call.arguments)[1]
        if problem is None or not workflow.patched(PATCH_BAD_ARGUMENTS):
            return None
        return (
            f"Invalid arguments for tool {call.name!r}: {problem}. The call was not run; "
            "call it again with a JSON object of arguments."
        )

    async def _turn_boundary(self) -> None:
        """Apply what arrived from outside since the last turn (pause, injected messages)."""
        if self.state.paused:
            self.set_status("paused")
            self.emit("paused", {})
            await workflow.wait_condition(lambda: not self.state.paused)
            self.set_status("running")
            self.emit("resumed", {})
        while self.state.mailbox:
            text = self.state.mailbox.pop(0)
            self.state.transcript.append(Message.user(text))
            self.emit("message_injected", {"text": text})
        self.children.deliver_reports()

    # --- model calls ----------------------------------------------------------------------------

    def _output_type_for(self, agent: Agent) -> OutputType | None:
        if self.output_override is not None:
            return self.output_override
        if agent.output_type is None:
            return None
        if agent.name not in self._output_types:
            self._output_types[agent.name] = OutputType(agent.output_type)
        return self._output_types[agent.name]

    def tool_specs(self, agent: Agent) -> list[ToolSpec]:
        """Everything the agent may call (built once per agent: it depends only on code)."""
        specs = self._tool_specs.get(agent.name)
        if specs is None:
            # [lovia semantics] handoff/agent-tool names as this run recorded them
            specs = own_tool_specs(agent, self.setup_flag("lovia_tool_names"))
            specs.extend(self.children.tool_specs(agent))
            specs.extend(self.mcp.tool_specs(agent))
            self._tool_specs[agent.name] = specs
        return specs

    def system_prompt(self, agent: Agent) -> str:
        ctx = RunContext(
            agent=agent.name,
            turn=self.state.turn,
            workflow_id=workflow.info().workflow_id,
            run_path=self.state.run_path,
            context=self.input.context,
        )
        parts = [agent.render_instructions(ctx), self.children.instructions(agent) or ""]
        if self.input.extra_instructions:
            parts.append(self.input.extra_instructions)
        # [lovia semantics] the schema also in the prompt: some servers ignore response_format
        output = self._output_type_for(agent)
        if output is not None and self.setup_flag("output_schema_in_prompt"):
            parts.append(output.instructions())
        return "\n\n".join(part for part in parts if part)

    def build_request(self, agent: Agent) -> ModelRequest:
        output = self._output_type_for(agent)
        try:
            payload = self.transport.payload(self.state)
        except LookupError:
            self._fail(
                "the start of the transcript is only in the transcript store, which the model "
                "worker could not read",
                TRANSCRIPT_MISSING,
            )
        request = ModelRequest(
            model=self.graph.model_for(agent),
            system=self.system_prompt(agent),
            messages=payload.messages,
            base_ref=payload.base_ref,
            base_count=payload.base_count,
            store_transcript=payload.store,
            tools=self.tool_specs(agent),
            output=output.spec if output else None,
            settings=self._settings_for(agent),
            reminder=self.children.reminder(),
        )
        return self.transport.shrink(self.state, request)

    def _settings_for(self, agent: Agent) -> ModelSettings:
        settings = agent.model_settings or ModelSettings()
        if self.input.answer_on_last_turn and self.state.turn >= self.input.max_turns:
            return settings.model_copy(update={"tool_choice": "none"})
        if withhold_tools(self.state, agent):  # stuck or out of tool turns (loop guard)
            return settings.model_copy(update={"tool_choice": "none"})
        if settings.first_turn_tool_choice and self.state.turn == 1:
            return settings.model_copy(update={"tool_choice": settings.first_turn_tool_choice})
        return settings

    async def _call_model(self, agent: Agent) -> ModelResponse:
        await self.mcp.prepare(agent)  # MCP tool lists: an activity, once per workflow run
        # At most two references can be missing (the static part, then the prefix); each miss
        # drops only what was missing, so a third request carries everything inline.
        for attempt in range(3):
            request = self.build_request(agent)
            try:
                response = await self._execute_model_call(request, agent)
                break
            except ActivityError as exc:
                cause = exc.cause
                missing = cause.type if isinstance(cause, ApplicationError) else None
                if attempt == 2 or missing not in (REQUEST_PART_MISSING, TRANSCRIPT_MISSING):
                    raise
                if missing == REQUEST_PART_MISSING:
                    # Only the unchanging part is gone: send it again, keep the transcript chain.
                    self.transport.forget_static(self.state)
                else:
                    # This worker cannot see the stored prefix: start a new chain, sending it all.
                    self.transport.forget(self.state)
        self.transport.after_store(self.state, response)
        self.add_usage(response.usage, check=False)
        self._last_input_tokens = response.usage.input_tokens
        return response

    async def _execute_model_call(self, request: ModelRequest, agent: Agent) -> ModelResponse:
        spec = request.model
        # Started as a handle (the same command as execute_activity) so that a steer can cancel
        # it; TRY_CANCEL, the default, means the run does not wait for the cancel to land.
        self._model_call = workflow.start_activity(
            MODEL_ACTIVITY,
            request,
            result_type=ModelResponse,
            start_to_close_timeout=timedelta(seconds=spec.timeout_seconds + 30),
            heartbeat_timeout=timedelta(seconds=spec.heartbeat_timeout_seconds),
            retry_policy=MODEL_RETRY,
            summary=f"{agent.name} · turn {self.state.turn} · {spec.label}",
        )
        try:
            return await self._model_call
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                if self._steered:  # a person steered the run: this answer is never used
                    raise SteeredAway() from None
                raise  # the run is being cancelled: end as cancelled, not failed
            cause = exc.cause
            if isinstance(cause, ApplicationError) and cause.type in (
                TRANSCRIPT_MISSING, REQUEST_PART_MISSING
            ):
                if request.base_ref is not None or request.static_ref is not None:
                    raise
            kind = cause.type if isinstance(cause, ApplicationError) else None
            detail = cause.message if cause is not None and hasattr(cause, "message") else str(exc)
            self._fail(
                f"model call failed for agent {agent.name!r} at turn {self.state.turn}: {detail}",
                kind or errors.MODEL_CALL_FAILED,
            )
        finally:
            self._model_call = None

    def steer(self, text: str) -> bool:
        """Queue ``text`` for the next model call and cancel the call in flight, if any (its
        answer is dropped and it does not count as a turn); returns whether one was cancelled."""
        self.state.mailbox.append(text)
        call = self._model_call
        cancelled = call is not None and not call.done()
        if cancelled:
            self._steered = True
            call.cancel()
        self.emit("steered", {"text": text, "cancelled_call": cancelled})
        return cancelled

    def _final_output(self, agent: Agent, text: str) -> tuple[bool, Any]:
        output_type = self._output_type_for(agent)
        if output_type is None:
            return True, text
        try:
            return True, output_type.dump(output_type.parse(text))
        except Exception as exc:  # noqa: BLE001 - a user validator may raise anything on model text
            self.state.output_retries += 1
            # [lovia semantics] Agent.output_retries / RunInput.output_retries (was: always 2)
            allowed = repairs_allowed(
                self.setup_flag("output_retries_setting"),
                self.input.output_retries,
                agent.output_retries,
            )
            if self.state.output_retries > allowed:
                self._fail(
                    f"the final answer of {agent.name!r} did not match its output type after "
                    f"{allowed} {'repair' if allowed == 1 else 'repairs'}: {exc}",
                    errors.OUTPUT_VALIDATION_FAILED,
                )
            self.state.transcript.append(
                Message.user(
                    f"Your answer did not match the required JSON schema: {exc}. "
                    "Answer again with only JSON that matches the schema."
                )
            )
            self.emit("error", {"kind": "output_validation", "message": str(exc)})
            return False, None

    def _finish(self, output: Any) -> RunResult:
        self.emit("final", {"output": output})
        self.set_status("completed")
        return RunResult(
            output=output,
            final_agent=self.state.agent,
            usage=self.state.usage,
            turns=self.state.turn,
            transcript=self.state.transcript,
            transcript_ref=self.state.context_ref,
            transcript_offset=self.state.transcript_offset,
            forked_from=str(self.input.fork) if self.input.fork is not None else None,
        )

    # --- budget ---------------------------------------------------------------------------------

    def _check_budget(self) -> None:
        budget = self.input.budget
        if budget is None:
            return
        usage = self.state.usage
        if budget.max_total_tokens is not None and usage.total_tokens > budget.max_total_tokens:
            self._fail(
                f"token budget exceeded: {usage.total_tokens} > {budget.max_total_tokens}",
                errors.BUDGET_EXCEEDED,
            )
        if budget.max_requests is not None and usage.requests > budget.max_requests:
            self._fail(
                f"request budget exceeded: {usage.requests} > {budget.max_requests}",
                errors.BUDGET_EXCEEDED,
            )

    def add_usage(self, usage: Usage, *, check: bool = True) -> None:
        """Count usage (also a child's) towards this run; the budget covers the whole tree."""
        self.state.usage = self.state.usage + usage
        if check:
            self._check_budget()

    @staticmethod
    def usage_from_failure(cause: BaseException | None) -> Usage:
        """Child runs put their usage in the details of their failure (see :meth:`_fail`)."""
        if isinstance(cause, ApplicationError) and cause.details:
            try:
                return Usage.model_validate(cause.details[0])
            except ValueError:
                pass
        return Usage()

    def child_search_attributes(self) -> Any:
        if not self.setup_flag("search_attributes"):
            return None
        from temporalio.common import TypedSearchAttributes

        from relaykit.search_attributes import RELAY_PARENT_RUN

        return TypedSearchAttributes([RELAY_PARENT_RUN.value_set(workflow.info().workflow_id)])

    def remaining_budget(self, child: Budget | None) -> Budget | None:
        """A child's budget: its own per-call limit, tightened by what this run has left."""
        mine = self.input.budget
        if mine is None:
            return child
        used = self.state.usage
        left_tokens = (
            None if mine.max_total_tokens is None else max(mine.max_total_tokens - used.total_tokens, 0)
        )
        left_requests = (
            None if mine.max_requests is None else max(mine.max_requests - used.requests, 0)
        )

        def tighter(a: int | None, b: int | None) -> int | None:
            return b if a is None else a if b is None else min(a, b)

        return Budget(
            max_total_tokens=tighter(child.max_total_tokens if child else None, left_tokens),
            max_requests=tighter(child.max_requests if child else None, left_requests),
        )

    def _fail(self, message: str, kind: str) -> Any:
        """End the run with a typed, non-retryable error that carries the usage so far."""
        self.emit("error", {"kind": kind, "message": message})
        self.set_status("failed")
        raise ApplicationError(
            message, self.state.usage.model_dump(), type=kind, non_retryable=True
        )

    # --- tool calls -----------------------------------------------------------------------------

    async def _run_tool_calls(self, agent: Agent, calls: list[ToolCall]) -> None:
        """Run one turn's calls in request order around the first handoff, as lovia does: the
        calls before it concurrently, then the handoff alone (a barrier), then the calls after
        it concurrently (runs recorded before: every ordinary call first, the handoff last);
        results go back in call order and the switch happens at the end of the turn. A call
        after one that needs approval starts only once that approval is decided
        (``Agent.approval_order``)."""
        lovia_names = self.setup_flag("lovia_tool_names")  # [lovia semantics] names, aliases
        handoffs = handoffs_by_name(agent, lovia_names)
        first_handoff: tuple[int, ToolCall, Handoff, HandoffArgs] | None = None
        barrier = None  # [lovia semantics] calls concurrent[:barrier] run before the handoff
        results: list[Message | None] = [None] * len(calls)
        concurrent: list[tuple[int, Any]] = []
        gates = self._approval_gates(agent, calls)
        for index, call in enumerate(calls):
            # [observability] an agent tool's call names its child run, so watchers can follow it
            # (relaykit.streaming); the id is the one Children.run_agent_tool starts.
            data = {"call_id": call.id, "name": call.name, "arguments": call.arguments}
            agent_tool = find_tool(agent, call.name, lovia_names)
            if isinstance(agent_tool, AgentTool):
                data["workflow_id"] = self.children.agent_tool_workflow_id(agent_tool, call)
            self.emit("tool_call", data)
            problem = self._argument_problem(call)
            if problem is not None:
                results[index] = self.tool_message(call, problem, is_error=True)
                continue
            handoff = handoffs.get(call.name)
            if handoff is not None:
                args = self._handoff_args(call)
                if isinstance(args, Message):  # invalid: no switch, the model reads why
                    results[index] = args
                elif first_handoff is None:
                    first_handoff = (index, call, handoff, args)
                    if self.setup_flag("handoff_in_request_order"):
                        barrier = len(concurrent)
                else:
                    results[index] = self.tool_message(
                        call,
                        "Rejected: only the first handoff of a turn runs; the conversation is "
                        f"already being handed over by {first_handoff[1].name}.",
                        is_error=True,
                    )
                continue
            wait_for, decided = gates[index]
            concurrent.append((index, self._gated_call(agent, call, wait_for, decided)))
        # [lovia semantics] request order: the calls before the handoff, then the handoff alone
        # (a barrier), then the calls after it; runs recorded before run the handoff last.
        later = concurrent[barrier:] if barrier is not None else []
        earlier = concurrent[:barrier] if barrier is not None else concurrent
        outcomes = await asyncio.gather(*(coro for _, coro in earlier))
        for (index, _), outcome in zip(earlier, outcomes):
            results[index] = outcome
        if first_handoff is not None:
            index, call, handoff, args = first_handoff
            results[index] = await self._run_handoff(agent, call, handoff, args)
        outcomes = await asyncio.gather(*(coro for _, coro in later))
        for (index, _), outcome in zip(later, outcomes):
            results[index] = outcome
        for message in results:
            assert message is not None
            self.state.transcript.append(message)
            self.emit(
                "tool_result",
                {
                    "call_id": message.tool_call_id,
                    "name": message.name,
                    "content": _head(message.content),
                    "is_error": message.is_error,
                },
            )
        if self._pending_switch is not None:
            self._switch_agent(*self._pending_switch)

    def _approval_gates(
        self, agent: Agent, calls: list[ToolCall]
    ) -> list[tuple[asyncio.Event | None, asyncio.Event | None]]:
        """For each call: the approval decision it waits for before it starts, and the event
        its own approval decision sets (lovia's order: a later call may depend on the approved
        action, so it never runs before that action is decided)."""
        none: list[tuple[asyncio.Event | None, asyncio.Event | None]] = [(None, None)] * len(calls)
        if agent.approval_order != "request_order":
            return none
        needs = [self._needs_approval(agent, call) for call in calls]
        if True not in needs or True not in needs[: len(calls) - 1]:
            return none  # no call comes after one that waits for a person
        if not workflow.patched(PATCH_APPROVAL_ORDER):  # recorded when every call ran at once
            return none
        gates: list[tuple[asyncio.Event | None, asyncio.Event | None]] = []
        waiting: asyncio.Event | None = None
        for call, needed in zip(calls, needs):
            decided = asyncio.Event() if needed else None
            gates.append((waiting, decided))
            if decided is not None:
                self._decided[call.id] = decided
                waiting = decided
        return gates

    def _needs_approval(self, agent: Agent, call: ToolCall) -> bool:
        """Whether ``call`` will wait for a person (invalid calls never do: they fail first)."""
        entry = next((t for t in agent.tools if t.name == call.name), None)
        try:
            if entry is None and (mcp_entry := self.mcp.lookup(agent, call.name)) is not None:
                arguments = json.loads(call.arguments or "{}")
                return isinstance(arguments, dict) and bool(
                    mcp_entry.server.requires_approval(mcp_entry.info.name, arguments)
                )
            if not isinstance(entry, Tool) or not entry.needs_approval:
                return False
            return entry.requires_approval(entry.parse_arguments(call.arguments).model_dump())
        except Exception:  # noqa: BLE001 - the call itself turns this into an error result
            return False

    async def _gated_call(
        self,
        agent: Agent,
        call: ToolCall,
        wait_for: asyncio.Event | None,
        decided: asyncio.Event | None,
    ) -> Message:
        try:
            if wait_for is not None:
                await wait_for.wait()
            return await self._run_one_call(agent, call)
        finally:
            if decided is not None:  # also when the call failed before asking a person
                decided.set()
                self._decided.pop(call.id, None)

    def tool_message(self, call: ToolCall, content: str, *, is_error: bool = False) -> Message:
        return Message.tool_result(call, content, is_error=is_error).model_copy(
            update={"agent": self.state.agent}
        )

    async def _run_one_call(self, agent: Agent, call: ToolCall) -> Message:
        entry = find_tool(agent, call.name, self.setup_flag("lovia_tool_names"))  # [lovia]
        if entry is None and agent.subagents is not None and call.name in SUBAGENT_TOOLS:
            return await self.children.run_tool(agent, call)
        mcp_entry = self.mcp.lookup(agent, call.name) if entry is None else None
        if entry is None and mcp_entry is None:
            known = ", ".join(spec.name for spec in self.tool_specs(agent)) or "none"
            return self.tool_message(
                call,
                f"Unknown tool {call.name!r}. Available tools: {known}.",
                is_error=True,
            )
        repeated = check_repeat(self.state, call, agent.max_repeated_calls)  # loop guard
        if repeated is not None:
            return self.tool_message(call, repeated, is_error=False)
        if mcp_entry is not None:
            return await self.mcp.run_call(agent, mcp_entry, call)
        if isinstance(entry, AgentTool):
            return await self.children.run_agent_tool(entry, call)
        try:
            arguments = entry.parse_arguments(call.arguments)
        except ValueError as exc:
            return self.tool_message(call, str(exc), is_error=True)
        except Exception as exc:  # noqa: BLE001 - whatever the model wrote: a result, not a stuck task
            return self.tool_message(
                call, f"Invalid arguments for tool {entry.name!r}: {exc}", is_error=True
            )
        try:
            approval_needed = entry.requires_approval(arguments.model_dump())
        except Exception as exc:  # noqa: BLE001 - a raising predicate must not wedge the run
            return self.tool_message(
                call,
                f"The call was not run: deciding whether it needs approval failed "
                f"({type(exc).__name__}: {exc}).",
                is_error=True,
            )
        if approval_needed:
            refusal = await self.approve_or_refuse(agent, entry, call)
            if refusal is not None:
                return refusal
        return await self._execute_tool(agent, entry, call)

    async def approve_or_refuse(self, agent: Agent, entry: Any, call: ToolCall) -> Message | None:
        """Wait for a person's decision on ``call``; ``None`` to go ahead, else the error result
        the model reads. Later calls of the turn may start as soon as it is decided."""
        decision = await self._await_approval(agent, entry, call)
        if call.id in self._decided:
            self._decided.pop(call.id).set()
        if decision.approved:
            return None
        if decision.timed_out:
            text = "The call was not run: nobody approved it in time (approval timed out)."
        elif decision.reason:
            text = f"The call was rejected by a person: {decision.reason}."
        else:
            text = "The call was rejected by a person."
        return self.tool_message(call, text, is_error=True)

    async def _execute_tool(self, agent: Agent, entry: Tool, call: ToolCall) -> Message:
        invocation = ToolInvocation(
            call_id=call.id,
            arguments=call.arguments,
            agent=agent.name,
            run_path=self.state.run_path,
            # [tool effects] idempotency key and recorded effect (relaykit.workflows.tool_outcome)
            **tool_outcome.invocation_fields(self, call, entry.effect, entry.on_unknown),
        )  # the workflow id is in the activity's own info: not repeated in every input

        async def execute(request: ToolInvocation) -> ToolOutcome:
            return await workflow.execute_activity(
                entry.name,
                request,
                result_type=ToolOutcome,
                start_to_close_timeout=entry.timeout,
                heartbeat_timeout=entry.heartbeat_timeout or None,  # timedelta(0): off
                retry_policy=entry.retry,
                task_queue=entry.task_queue,
                summary=tool_outcome.summary(summarize_call(entry.name, call.arguments), request),
            )

        try:
            # [tool effects] a "write" call lost in flight is reported or asked about, not rerun
            outcome = await tool_outcome.run_guarded(
                self, agent, entry, call, invocation, execute, what=f"tool {entry.name!r}"
            )
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            cause = exc.cause
            detail = getattr(cause, "message", None) or str(exc)
            return self.tool_message(
                call, f"Tool {entry.name!r} failed and was not retried further: {detail}", is_error=True
            )
        return self.tool_message(call, outcome.content, is_error=outcome.is_error)

    # --- approvals ------------------------------------------------------------------------------

    async def _await_approval(
        self, agent: Agent, entry: Tool, call: ToolCall, *, reason: str | None = None
    ) -> ApprovalDecision:
        """Wait (durably, at no cost) for a person to approve or reject ``call``; ``reason``
        tells the person why they are asked when it is not the tool's own rule."""
        if call.id in self.state.decisions:  # answered before a continue-as-new
            return self.state.decisions.pop(call.id)
        if self.input.unattended:
            return ApprovalDecision(
                call_id=call.id,
                approved=False,
                reason="no person can approve calls in an unattended background task",
            )
        pending = PendingApproval(
            call_id=call.id,
            tool=entry.name,
            arguments=call.arguments,
            agent=agent.name,
            run_path=self.state.run_path,
            turn=self.state.turn,
            requested_at=workflow.now(),
            workflow_id=workflow.info().workflow_id,
            reason=reason,
        )
        self.state.pending_approvals[call.id] = pending
        self.emit("approval_requested", pending.model_dump(mode="json"))
        self.set_status("waiting_approval")
        await self.children.announce_approval(pending)
        try:
            await workflow.wait_condition(
                lambda: call.id in self.state.decisions, timeout=entry.approval_timeout
            )
            decision = self.state.decisions.pop(call.id)
        except asyncio.TimeoutError:
            decision = ApprovalDecision(
                call_id=call.id, approved=False, reason="approval timed out", timed_out=True
            )
        self.state.pending_approvals.pop(call.id, None)
        self.emit("approval_answered", decision.model_dump(mode="json"))
        await self.children.announce_answered(call.id)
        if not self.state.pending_approvals:
            self.set_status("running")
        return decision

    def answer_approval(self, decision: ApprovalDecision) -> None:
        """Record a person's answer (from the approve update or signal); answers for a child
        run's call are forwarded to that child."""
        if self.children.forward_decision(decision):
            self.state.pending_approvals.pop(decision.call_id, None)
            self.emit("approval_answered", decision.model_dump(mode="json"))
            if not self.state.pending_approvals:
                self.set_status("running")
            return
        self.state.decisions[decision.call_id] = decision

    def validate_approval(self, decision: ApprovalDecision) -> None:
        if decision.call_id in self.state.decisions:
            raise ValueError(f"call {decision.call_id!r} was already answered")
        if decision.call_id not in self.state.pending_approvals:
            if any(
                event.kind == "approval_answered" and event.data.get("call_id") == decision.call_id
                for event in self.state.events
            ):
                raise ValueError(f"call {decision.call_id!r} was already answered")
            waiting = ", ".join(self.state.pending_approvals) or "none"
            raise ValueError(
                f"no pending approval with call id {decision.call_id!r} (waiting: {waiting})"
            )

    # --- handoff --------------------------------------------------------------------------------

    def _handoff_args(self, call: ToolCall) -> HandoffArgs | Message:
        """The handoff's arguments, or the error result for invalid ones (a handoff the model
        got wrong does not switch agents: the model reads why and may call it again)."""
        # [lovia semantics] extra keys ignored, any JSON reason kept as text (runs recorded
        # before: the strict schema)
        args, problem = parse_handoff_args(
            call.arguments, lenient=self.setup_flag("lenient_handoff_args")
        )
        if args is not None:
            return args
        if not workflow.patched(PATCH_BAD_ARGUMENTS):  # recorded when any handoff switched
            return HandoffArgs()
        return self.tool_message(
            call,
            f"The handoff did not happen: invalid arguments for {call.name!r}: {problem}. "
            "Call it again with {} or {\"reason\": \"<text>\"}.",
            is_error=True,
        )

    async def _run_handoff(
        self, agent: Agent, call: ToolCall, handoff: Handoff, args: HandoffArgs
    ) -> Message:
        """Run the handoff's ``on_handoff``; the switch itself waits for the end of the turn
        (:meth:`_switch_agent`)."""
        self._pending_switch = None
        if handoff.on_handoff is not None:
            try:
                await workflow.execute_activity(
                    handoff.run_name(self.setup_flag("lovia_tool_names")),  # [lovia] as recorded
                    HandoffCallbackInput(
                        source=agent.name,
                        target=handoff.target.name,
                        reason=args.reason,
                        turn=self.state.turn,
                        workflow_id=workflow.info().workflow_id,
                    ),
                    start_to_close_timeout=timedelta(minutes=1),
                    retry_policy=HANDOFF_CALLBACK_RETRY,
                    summary=f"{agent.name} → {handoff.target.name}",
                )
            except ActivityError as exc:
                if is_cancelled_exception(exc):
                    raise
                detail = getattr(exc.cause, "message", None) or str(exc)
                return self.tool_message(
                    call, f"The handoff did not happen: on_handoff failed: {detail}", is_error=True
                )
        self._pending_switch = (handoff, args.reason)
        return self.tool_message(
            call, json.dumps({"assistant": handoff.target.name}), is_error=False
        )

    def _switch_agent(self, handoff: Handoff, reason: str | None) -> None:
        self._pending_switch = None
        source = self.state.agent
        target = handoff.target.name
        if handoff.input_filter is not None:
            self.state.transcript = _filtered_history(handoff, source, self.state.transcript)
            self.state.transcript_offset = 0
            self.transport.forget(self.state)
        source_path = list(self.state.run_path)
        self.state.agent = target
        self.state.output_retries = 0
        self.state.run_path = [*self.state.run_path, target]
        # Eino: an event's run path is the path of the agent that emitted it (the source).
        self.emit(
            "handoff",
            {"from": source, "to": target, "reason": reason, "turn": self.state.turn},
            agent=source,
            run_path=source_path,
        )

    # --- long runs: continue-as-new and context compaction -----------------------------------

    async def _maybe_continue_as_new(self) -> None:
        """At a turn boundary, hand the run to a fresh workflow run when history grows large.

        Nothing is half-handled here: the turn's tool calls, handoff and approvals are done, and
        signal/update handlers are drained first. Background subagents report by workflow id, so
        they reach the new run.
        """
        if self._turns_this_run == 0:
            return
        info = workflow.info()
        every = self.input.continue_as_new_after_turns
        if not (
            info.is_continue_as_new_suggested()
            or info.get_current_history_length() >= self.input.continue_as_new_after_events
            or (every is not None and self._turns_this_run >= every)
        ):
            return
        await workflow.wait_condition(workflow.all_handlers_finished)
        if self._background:
            await asyncio.gather(*self._background)
            self._background.clear()
        state = self.state.model_copy(deep=True)
        if state.context_ref is not None:  # the stored prefix need not travel in the input
            state.transcript = state.transcript[state.context_ref_count - state.transcript_offset :]
            state.transcript_offset = state.context_ref_count
        kept = state.events[-EVENTS_KEPT_ACROSS_RUNS:]
        state.event_offset += len(state.events) - len(kept)
        state.events = kept
        state.runs += 1
        upgrade = (  # versioned workers only: the next execution starts on the current build
            {"initial_versioning_behavior": workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE}
            if self.graph.upgrade_on_continue_as_new
            else {}
        )
        workflow.continue_as_new(self.input.model_copy(update={"state": state}), **upgrade)

    async def _maybe_compact(self) -> None:
        policy = self.graph.agents.get(self.input.agent, self.current_agent).context_policy
        if policy is None:  # small context windows get one by default
            policy = default_context_policy(self.graph.model_for(self.current_agent))
        if policy is None or self._last_input_tokens < policy.max_input_tokens:
            return
        transcript = self.state.transcript
        turn_starts = [i for i, m in enumerate(transcript) if m.role == "assistant"]
        if len(turn_starts) <= policy.keep_last_turns:
            return
        cut = turn_starts[-policy.keep_last_turns] if policy.keep_last_turns else len(transcript)
        task = self.state.task
        old = [m for m in transcript[:cut] if m != task]
        if not old:
            return
        if policy.strategy == "summarize":
            summary = await self._summarize(old, policy.summary_instructions)
        else:
            summary = f"[{len(old)} earlier messages were removed to fit the context window]"
        archived = self.state.context_ref
        head = [task] if task is not None else []
        self.state.transcript = [
            *head,
            Message.user(f"Summary of the conversation so far:\n{summary}"),
            *transcript[cut:],
        ]
        self.state.transcript_offset = 0
        self.transport.forget(self.state)
        self._last_input_tokens = 0
        self.emit(
            "context_compacted",
            {"removed": len(old), "strategy": policy.strategy, "archived_ref": archived},
        )

    async def _summarize(self, messages: list[Message], instructions: str) -> str:
        lines = []
        for m in messages:
            if m.role == "tool":
                lines.append(f"[tool {m.name} returned] {_head(m.content, 2000)}")
            elif m.role == "assistant":
                if m.content:
                    lines.append(f"[{m.agent or 'assistant'}] {_head(m.content, 2000)}")
                lines.extend(f"[{m.agent or 'assistant'} called {c.name}] {_head(c.arguments, 500)}" for c in m.tool_calls)
            else:
                lines.append(f"[user] {_head(m.content, 2000)}")
        agent = self.current_agent
        request = ModelRequest(
            model=self.graph.model_for(agent),
            system=instructions,
            messages=[Message.user("\n".join(lines))],
        )
        response = await self._execute_model_call(request, agent)
        self.add_usage(response.usage)
        return response.message.content

    # --- events and status ----------------------------------------------------------------------

    def emit(
        self,
        kind: EventKind,
        data: dict[str, Any],
        *,
        agent: str | None = None,
        run_path: list[str] | None = None,
    ) -> None:
        events = self.state.events
        events.append(
            RunEvent(
                seq=self.state.event_offset + len(events),
                kind=kind,
                agent=agent or self.state.agent,
                turn=self.state.turn,
                run_path=list(self.state.run_path if run_path is None else run_path),
                data=data,
                at=workflow.now(),
            )
        )
        if len(events) > MAX_EVENTS_KEPT:
            drop = len(events) - MAX_EVENTS_KEPT
            del events[:drop]
            self.state.event_offset += drop
        if self.on_change is not None:
            self.on_change()

    def events_from(self, offset: int) -> list[RunEvent]:
        start = max(offset - self.state.event_offset, 0)
        return self.state.events[start:]

    def set_status(self, status: Any) -> None:
        self.state.status = status
        if self.on_change is not None:
            self.on_change()


def _recorded_choice(patch_id: str, configured: bool) -> bool:
    """A yes/no choice recorded as a patch marker: made from the worker's configuration when the
    run first executes, read back from the marker when it is replayed (on any worker)."""
    if workflow.unsafe.is_replaying():
        return workflow.patched(patch_id)
    return configured and workflow.patched(patch_id)


def _filtered_history(handoff: Handoff, source: str, history: list[Message]) -> list[Message]:
    """Run a handoff's ``input_filter``. It is user code in the workflow: one that raises (the
    sandbox's refusals included) or returns something other than messages would do the same on
    every retry, so the run ends with ``HandoffFilterFailed`` rather than failing its workflow
    task forever."""
    target = handoff.target.name
    assert handoff.input_filter is not None
    try:
        filtered = list(
            handoff.input_filter(HandoffInputData(source=source, target=target, history=history))
        )
    except Exception as exc:  # noqa: BLE001 - any bug in the filter ends the run the same way
        problem = f"raised {type(exc).__name__}: {_head(str(exc))}"
    else:
        wrong = next((item for item in filtered if not isinstance(item, Message)), None)
        if wrong is None:
            return filtered
        problem = f"returned a {type(wrong).__name__} among its messages"
    raise ApplicationError(
        f"the input_filter of handoff {source} → {target} {problem}",
        type=errors.HANDOFF_FILTER_FAILED,
        non_retryable=True,
    )


def _head(text: str, limit: int = 500) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


async def run_agent(
    agent: Agent,
    input: str | list[Message],
    *,
    max_turns: int = 50,
    budget: Budget | None = None,
    output_type: Any = None,
    extra_instructions: str | None = None,
    context: dict[str, Any] | None = None,
    output_retries: int | None = None,
) -> RunResult:
    """Run ``agent`` to its end from inside any Temporal workflow.

    Compose agents in plain Python in your own workflows (chains, routers, evaluator loops); every
    model and tool call is still an activity. The worker must serve ``agent`` (pass it, or an agent
    that reaches it, to :class:`relaykit.Worker`) so its tools are registered.
    """
    from relaykit import registry

    served = registry.graph_for(workflow.info().task_queue)
    graph = served if served is not None and agent.name in served.agents else None
    if graph is None or graph.agents[agent.name] is not agent:
        graph = AgentGraph.build([agent], default_model=served.default_model if served else None)
    loop = TurnLoop(
        graph,
        RunInput(
            agent=agent.name,
            input=input,
            max_turns=max_turns,
            budget=budget,
            extra_instructions=extra_instructions,
            context=context or {},
            output_retries=output_retries,  # [lovia semantics] run-level repair count
        ),
        output_type=output_type,
    )
    return await loop.run()
