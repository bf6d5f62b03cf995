"""The turn loop: it drives one agent run, and it alone decides.

One turn (docs/architecture.md):

1. **turn boundary**: what arrived from outside is applied (a pause, injected messages,
   background reports); a long run may continue as new or compact its transcript here;
2. **model call**: the current agent's request (:mod:`relaykit.workflows.model_turn`);
3. **final answer or tool calls**: a final answer is validated against the output type and ends
   the run; tool calls go through the one tool path (:mod:`relaykit.workflows.tool_path`);
4. **switch**: a handoff the tool path returned moves the conversation to its target.

The run's state is data (:class:`relaykit.runs.RunState`) held by
:class:`relaykit.workflows.run_state.Run`; the mechanisms around the loop (tool path, approvals,
handoffs, child runs, MCP, long runs) receive it and return outcomes, and none imports this
module. Everything here is deterministic: the world is touched only through activities and
child workflows, and time comes from ``workflow.now()``. After a crash, Temporal replays the
history through this code and the run goes on without repeating any finished model or tool call.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from relaykit import errors
from relaykit.agent import Agent, Budget
from relaykit.authors import cancel_author, named
from relaykit.graph import AgentGraph
from relaykit.handoff import Handoff
from relaykit.messages import Message, ModelResponse
from relaykit.models.spec import ModelRequest
from relaykit.output import repairs_allowed
from relaykit.runs import (
    AGENT_RUN_WORKFLOW,
    MODEL_ACTIVITY,
    RunInput,
    RunResult,
    RunState,
    share_field_sets,
)
from relaykit.transcripts import REQUEST_PART_MISSING, TRANSCRIPT_MISSING
from relaykit.workflows import long_runs, model_turn
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.final_answer import FinalAnswers
from relaykit.workflows.handoffs import filtered_history
from relaykit.workflows.run_state import Run
from relaykit.workflows.spend import Spend
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.tool_path import ToolPath

__all__ = ["AGENT_RUN_WORKFLOW", "MODEL_ACTIVITY", "TurnLoop", "run_agent"]


class TurnLoop:
    """Runs one agent run to its end. Build it with the run's input; call :meth:`run`."""

    def __init__(
        self,
        graph: AgentGraph,
        run_input: RunInput,
        *,
        output_type: Any = None,
    ) -> None:
        self.run_state = Run(graph, run_input)
        self.graph = graph
        self.input = run_input
        self.approvals = Approvals(self.run_state)
        self.tasks = SubagentTasks(self.run_state)
        self.tools = ToolPath(self.run_state, self.approvals, self.tasks)
        self.answers = FinalAnswers(self.run_state, output_type)
        self.model_calls = model_turn.ModelCalls()
        self.spend = Spend(self.run_state)
        self._turns_this_run = 0
        self._last_input_tokens = 0

    @property
    def state(self) -> RunState:
        return self.run_state.state

    @property
    def on_change(self) -> Callable[[], None] | None:
        return self.run_state.on_change

    @on_change.setter
    def on_change(self, callback: Callable[[], None] | None) -> None:
        """Called after state a person can see changed (the workflow updates its UI details)."""
        self.run_state.on_change = callback

    @property
    def current_agent(self) -> Agent:
        return self.run_state.current_agent

    def setup_flag(self, name: str) -> bool:
        return self.run_state.setup_flag(name)

    # --- the loop -------------------------------------------------------------------------------

    async def run(self) -> RunResult:
        run = self.run_state
        run.record_setup()
        if self.state.agent not in self.graph.agents:
            run.check_serves_run()  # while replaying: the run may have begun under older code
        if self.input.state is None:
            self._start_transcript()
            if self.input.budget is None and self.setup_flag("dollar_budgets"):
                self.input.budget = self.current_agent.budget  # the agent's own, if any
            await self.spend.start()  # a dollar limit: the prices it plans with
        if self.input.state is not None:
            run.emit("continued_as_new", {"run": self.state.runs})
        try:
            result = await self._loop()
        except BaseException as exc:  # a failed or cancelled run still stops its background tasks
            if is_cancelled_exception(exc):
                run.set_status("cancelled")
                run.emit("cancelled", cancel_author(workflow.cancellation_reason()))
            if isinstance(exc, ApplicationError) or is_cancelled_exception(exc):
                await self._wind_down()
            raise
        await self._wind_down()
        return result

    async def _wind_down(self) -> None:
        """Before the run ends: stop unfinished background tasks, flush pending signals."""
        await self.tasks.close()
        self.spend.close()  # children waiting for more make their last call
        await self.run_state.drain_background()

    async def _loop(self) -> RunResult:
        run, state = self.run_state, self.state
        while True:
            await self._turn_boundary()
            if state.turn >= self.input.max_turns:
                run.fail(
                    f"the run reached max_turns={self.input.max_turns} without a final answer",
                    errors.MAX_TURNS_EXCEEDED,
                )
            run.end_if_agent_gone()  # switched to under earlier code: replayed, now it ends
            state.turn += 1
            self._turns_this_run += 1
            agent = self.current_agent
            with self.turn_group(agent):  # [observability] one event group per turn
                try:
                    response = await self._call_model(agent)
                except model_turn.SteeredAway:  # the steer's text enters at the boundary
                    self.model_calls.steered = False  # and the same turn runs again
                    state.turn -= 1
                    self._turns_this_run -= 1
                    continue
            run.end_if_agent_gone()  # what it answered would be decided by today's code
            message = response.message.model_copy(update={"agent": agent.name})
            calls, message, corrected = self.tools.check(message)
            state.transcript.append(share_field_sets(message))  # every field given, in JSON
            if not corrected:
                run.transport.after_response(state, response.transcript_ref)
            # else: the store holds the calls as the provider sent them; the next request sends
            # the corrected message itself, after the previous stored prefix.
            if message.content:
                run.emit("message", {"text": message.content})
            run.check_budget()
            if not message.tool_calls:
                if state.mailbox:  # a message arrived during this turn: answer it too
                    continue
                verdict = await self.answers.check(agent, message.content, response)
                if verdict.problem is None:
                    return self._finish(verdict.output)
                self._ask_for_repair(agent, verdict.problem)
                continue
            with self.turn_group(agent):  # [observability]
                results, switch = await self.tools.run_calls(agent, calls, response.routes)
            state.transcript.extend(results)
            if switch is not None:
                self._switch_agent(*switch)

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
        state = self.state
        if isinstance(given, str):
            state.transcript.append(Message.user(given))
        else:
            state.transcript.extend(given)
        state.task = next((m for m in state.transcript if m.role == "user"), None)
        if self.input.fork is not None:  # a fork goes on from its origin's turn
            state.turn = self.input.fork.turn
        started: dict[str, Any] = {"input": given if isinstance(given, str) else len(given)}
        if self.input.fork is not None:  # who forked, and from where
            started.update(forked_from=str(self.input.fork), **named(self.input.fork.by))
        self.run_state.emit("run_started", started)

    # --- 1. the turn boundary -------------------------------------------------------------------

    async def _turn_boundary(self) -> None:
        """Apply what arrived from outside since the last turn (pause, injected messages,
        reports); then a long run may continue as new or compact."""
        run, state = self.run_state, self.state
        if state.paused:
            run.set_status("paused")
            run.emit("paused", named(state.paused_by))
            await workflow.wait_condition(lambda: not state.paused)
            run.set_status("running")
            run.emit("resumed", named(state.paused_by))
        self._inject_messages()
        state.transcript.extend(self.tasks.deliver_reports())
        await long_runs.maybe_continue_as_new(run, self._turns_this_run)
        policy = long_runs.compaction_due(run, self._last_input_tokens)
        compacted = (
            None if policy is None else await long_runs.compact(state, policy, self._summarize)
        )
        if compacted is not None:
            archived = state.context_ref
            state.transcript = compacted.transcript
            state.transcript_offset = 0
            run.transport.forget(state)
            self._last_input_tokens = 0
            run.emit(
                "context_compacted",
                {
                    "removed": compacted.removed,
                    "strategy": policy.strategy,
                    "archived_ref": archived,
                },
            )
            # What arrived during the summary call (a steer, a message) goes into this turn's.
            if state.mailbox and model_turn.summary_not_steered():
                self._inject_messages()

    def _inject_messages(self) -> None:
        for text, by in self.run_state.take_messages():
            self.state.transcript.append(Message.user(text))
            self.run_state.emit("message_injected", {"text": text, **named(by)})

    def steer(self, text: str, by: str = "") -> bool:
        """Queue ``text`` for the next model call and cancel the turn's call in flight, if any
        (its answer is dropped and it does not count as a turn); returns whether one was
        cancelled. A summary call in flight finishes, and the turn's call after it has ``text``."""
        self.run_state.queue_message(text, by)
        cancelled = self.model_calls.steer()
        self.run_state.emit("steered", {"text": text, "cancelled_call": cancelled, **named(by)})
        return cancelled

    async def _summarize(self, messages: list[Message], instructions: str) -> str:
        agent = self.current_agent
        request = ModelRequest(
            model=self.graph.model_for(agent),
            system=instructions,
            messages=[long_runs.summary_prompt(messages)],
        )
        request = await self.spend.admit(request)
        response = await self.model_calls.execute(self.run_state, request, agent, summary=True)
        self.run_state.add_call_usage(agent.name, request.model.label, response)
        self.run_state.check_budget()
        return response.message.content

    # --- 2. the model call ----------------------------------------------------------------------

    def build_request(self, agent: Agent) -> ModelRequest:
        output = self.answers.output_type(agent)
        return model_turn.build_request(self.run_state, self.tools, self.tasks, agent, output)

    async def _call_model(self, agent: Agent) -> ModelResponse:
        run = self.run_state
        await self.tools.prepare(agent)  # MCP tool lists: an activity, once per workflow run
        # At most two references can be missing (the static part, then the prefix); each miss
        # drops only what was missing, so a third request carries everything inline.
        for attempt in range(3):
            request = await self.spend.admit(self.build_request(agent))
            try:
                response = await self.model_calls.execute(run, request, agent)
                break
            except ActivityError as exc:
                cause = exc.cause
                missing = cause.type if isinstance(cause, ApplicationError) else None
                if attempt == 2 or missing not in (REQUEST_PART_MISSING, TRANSCRIPT_MISSING):
                    raise
                if missing == REQUEST_PART_MISSING:
                    # Only the unchanging part is gone: send it again, keep the transcript chain.
                    run.transport.forget_static(self.state)
                else:
                    # This worker cannot see the stored prefix: start a new chain, sending it all.
                    run.transport.forget(self.state)
        run.transport.after_store(self.state, response)
        run.add_call_usage(agent.name, request.model.label, response)
        self.spend.after_call(response)
        self._last_input_tokens = response.usage.input_tokens
        return response

    # --- 3. the final answer --------------------------------------------------------------------

    def _ask_for_repair(self, agent: Agent, problem: str) -> None:
        """An answer its output type rejected: ask again, or fail once the repairs are spent."""
        self.state.output_retries += 1
        # [lovia semantics] Agent.output_retries / RunInput.output_retries (was: always 2)
        allowed = repairs_allowed(
            self.setup_flag("output_retries_setting"),
            self.input.output_retries,
            agent.output_retries,
        )
        if self.state.output_retries > allowed:
            self.run_state.fail(
                f"the final answer of {agent.name!r} did not match its output type after "
                f"{allowed} {'repair' if allowed == 1 else 'repairs'}: {problem}",
                errors.OUTPUT_VALIDATION_FAILED,
            )
        self.state.transcript.append(
            Message.user(
                f"Your answer did not match the required JSON schema: {problem}. "
                "Answer again with only JSON that matches the schema."
            )
        )
        self.run_state.emit("error", {"kind": "output_validation", "message": problem})

    def _finish(self, output: Any) -> RunResult:
        state = self.state
        self.run_state.emit("final", {"output": output})
        self.run_state.set_status("completed")
        return RunResult(
            output=output,
            final_agent=state.agent,
            usage=state.usage,
            turns=state.turn,
            transcript=state.transcript,
            transcript_ref=state.context_ref,
            transcript_offset=state.transcript_offset,
            forked_from=str(self.input.fork) if self.input.fork is not None else None,
            evaluation=self.tools.recorded.calls if self.tools.recorded is not None else None,
        )

    # --- 4. the switch --------------------------------------------------------------------------

    def _switch_agent(self, handoff: Handoff, reason: str | None) -> None:
        state = self.state
        source = state.agent
        target = handoff.target.name
        if handoff.input_filter is not None:
            state.transcript = filtered_history(handoff, source, state.transcript)
            state.transcript_offset = 0
            self.run_state.transport.forget(state)
        source_path = list(state.run_path)
        state.agent = target
        state.output_retries = 0
        state.run_path = [*state.run_path, target]
        # Eino: an event's run path is the path of the agent that emitted it (the source).
        self.run_state.emit(
            "handoff",
            {"from": source, "to": target, "reason": reason, "turn": state.turn},
            agent=source,
            run_path=source_path,
        )


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
