"""What an evaluation reads from a recorded run: its input, its steps, its tool results, its answer.

Everything comes from the run's Temporal history, read as :mod:`relaykit.fork` reads it (each
model call's request and answer, rebuilt into turns), from the server (closed runs only) or from
files ``temporal workflow show -o json`` wrote. Nothing runs: this is a reader.

- the **input** is the run's first ``RunInput`` (agent, task, context, limits);
- the **steps** are, per turn, the calls the model asked for (tool and canonical arguments), or
  its final answer;
- the **tool results**: every call of the transcript with the result the model read, per tool in
  order, which is what a candidate's calls are matched against
  (:class:`~relaykit.eval_context.EvalContext`);
- the **answer** is the run's result (its output, usage), and its wall time the history's span.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, Field
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHistory

from relaykit.eval_context import EvalContext, RecordedCall, canonical_arguments
from relaykit.fork import ForkError, RunTurns, _runs_of_chain, turns_of_histories
from relaykit.messages import Message, Usage
from relaykit.runs import RunInput, RunResult


class Step(BaseModel):
    """One turn of a run: the calls its model asked for, or its final answer."""

    turn: int
    calls: list[tuple[str, str]] = Field(default_factory=list)
    """(tool, canonical arguments) in the order the model wrote them."""
    answer: str | None = None
    """The final answer's text, on the last turn."""


class RecordedRun(BaseModel):
    """A recorded run as an evaluation needs it (the ``relaykit.eval_prepare`` activity's
    result; compatibility data)."""

    run_id: str
    agent: str
    input: RunInput
    steps: list[Step] = Field(default_factory=list)
    calls: dict[str, list[RecordedCall]] = Field(default_factory=dict)
    output: Any = None
    usage: Usage = Field(default_factory=Usage)
    seconds: float | None = None
    problem: str | None = None
    """Why the run cannot be evaluated (still open, failed, unreadable); then nothing else is
    set but the id."""

    def candidate_input(self, live_reads: bool, mark: bool = False) -> RunInput:
        """The candidate's input: the recorded task and limits, unattended (nobody approves
        during an evaluation), with the recorded tool results to answer from."""
        first = self.input
        return RunInput(
            agent=first.agent,
            input=first.input,
            max_turns=first.max_turns,
            answer_on_last_turn=first.answer_on_last_turn,
            budget=first.budget,
            extra_instructions=first.extra_instructions,
            context=first.context,
            output_retries=first.output_retries,
            unattended=True,
            evaluation=EvalContext(
                recorded_run=self.run_id, calls=self.calls, live_reads=live_reads, mark=mark
            ),
        )


def steps_of(transcript: list[Message]) -> list[Step]:
    """A transcript's turns: each model message, its calls or its answer, numbered from 1."""
    steps: list[Step] = []
    for message in transcript:
        if message.role != "assistant":
            continue
        turn = len(steps) + 1
        if message.tool_calls:
            calls = [(c.name, canonical_arguments(c.arguments)) for c in message.tool_calls]
            steps.append(Step(turn=turn, calls=calls))
        else:
            steps.append(Step(turn=turn, answer=message.content or ""))
    return steps


def calls_of(transcript: list[Message]) -> dict[str, list[RecordedCall]]:
    """Every call of a transcript with the result the model read, per tool in call order."""
    results = {m.tool_call_id: m for m in transcript if m.role == "tool"}
    calls: dict[str, list[RecordedCall]] = {}
    for message in transcript:
        for call in message.tool_calls if message.role == "assistant" else []:
            result = results.get(call.id)
            if result is None:
                continue  # never answered (the run ended first): nothing to replay
            calls.setdefault(call.name, []).append(
                RecordedCall(
                    arguments=canonical_arguments(call.arguments),
                    content=result.content or "",
                    is_error=bool(result.is_error),
                )
            )
    return calls


async def _outcome(convert: Any, events: list[Any]) -> tuple[RunResult | None, float | None]:
    """The run's result (``None`` unless it completed) and its wall time."""
    first, last = events[0], events[-1]
    seconds = last.event_time.ToDatetime().timestamp() - first.event_time.ToDatetime().timestamp()
    if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED:
        return None, seconds
    payloads = last.workflow_execution_completed_event_attributes.result.payloads
    [result] = await convert.decode(payloads, [RunResult])
    return result, seconds


async def children_of(
    convert: Any, histories: list[list[Any]]
) -> tuple[list[tuple[str, str]], dict[str, str]]:
    """The children a run started: its agent-tool children in order (canonical arguments of
    the call that started each, child workflow id), and its background subagents (task id ->
    child workflow id)."""
    agent_tools: list[tuple[str, str]] = []
    tasks: dict[str, str] = {}
    for events in histories:
        for event in events:
            if event.event_type != EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
                continue
            attrs = event.start_child_workflow_execution_initiated_event_attributes
            [child] = await convert.decode(attrs.input.payloads, [RunInput])
            if child.report_to is not None:
                tasks[child.report_to.task_id] = attrs.workflow_id
            elif isinstance(child.input, str):
                arguments = canonical_arguments(json.dumps({"input": child.input}))
                agent_tools.append((arguments, attrs.workflow_id))
    return agent_tools, tasks


def attach_children(
    calls: dict[str, list[RecordedCall]],
    children: list[tuple[str, str]],
    tasks: dict[str, str] | None = None,
) -> dict[str, str]:
    """Which recorded call started which child: call position -> child id, keyed
    ``"<tool>#<index>"``. An agent tool's arguments are its ``input``, and its children start
    in call order; a ``spawn_subagent`` result names its task, whose child the run's history
    names (``tasks``: task id -> child id)."""
    started: dict[str, str] = {}
    left = list(children)
    for tool, recorded in calls.items():
        for index, call in enumerate(recorded):
            if tool == "spawn_subagent":
                task_id = _spawned_task(call)
                if task_id is not None and task_id in (tasks or {}):
                    started[f"{tool}#{index}"] = (tasks or {})[task_id]
                continue
            for position, (arguments, child_id) in enumerate(left):
                if arguments == call.arguments:
                    started[f"{tool}#{index}"] = child_id
                    del left[position]
                    break
    return started


def _spawned_task(call: RecordedCall) -> str | None:
    """The task id a recorded ``spawn_subagent`` result names (``None``: it started none)."""
    if call.is_error:
        return None
    try:
        result = json.loads(call.content)
    except ValueError:
        return None
    task_id = result.get("id") if isinstance(result, dict) else None
    return task_id if isinstance(task_id, str) else None


async def recorded_from_histories(
    convert: Any, run_id: str, histories: list[list[Any]]
) -> RecordedRun:
    """A recorded run from the histories of its continue-as-new chain, first run first."""
    result, seconds = await _outcome(convert, histories[-1])
    if result is None:
        return RecordedRun(
            run_id=run_id,
            agent="",
            input=RunInput(agent=""),
            problem="it did not complete (only completed runs have an answer to compare)",
        )
    turns: RunTurns = await turns_of_histories(
        convert, histories, run_id, task_queue="", open=False
    )
    cut = turns.cut(max(turns.turns, default=0))
    transcript = cut[0] if cut is not None else list(result.transcript)
    return RecordedRun(
        run_id=run_id,
        agent=turns.first_input.agent,
        input=turns.first_input,
        steps=steps_of(transcript),
        calls=calls_of(transcript),
        output=result.output,
        usage=result.usage,
        seconds=seconds,
    )


MAX_CHILD_DEPTH = 4
"""Agent-tool and subagent children are read this many levels down; deeper ones answer as
recorded."""


async def read_recorded(client: Client, run_id: str, depth: int = 0) -> RecordedRun:
    """``run_id`` as recorded on the server (closed runs only), with the recorded children of
    its agent-tool calls and of its spawned subagents (:attr:`RecordedCall.child`)."""
    try:
        histories, description = await _runs_of_chain(client, run_id)
    except ForkError as exc:
        return RecordedRun(run_id=run_id, agent="", input=RunInput(agent=""), problem=str(exc))
    if description.close_time is None:
        return RecordedRun(
            run_id=run_id, agent="", input=RunInput(agent=""), problem="it is still running"
        )
    recorded = await recorded_from_histories(client.data_converter, run_id, histories)
    if recorded.problem is not None or depth >= MAX_CHILD_DEPTH:
        return recorded
    children, tasks = await children_of(client.data_converter, histories)
    for key, child_id in attach_children(recorded.calls, children, tasks).items():
        tool, _, index = key.rpartition("#")
        child = await read_recorded(client, child_id, depth + 1)
        if child.problem is None:  # else the recorded answer stands
            recorded.calls[tool][int(index)].child = EvalContext(
                recorded_run=child_id, calls=child.calls
            )
    return recorded


async def read_history_file(convert: Any, path: str) -> RecordedRun:
    """A run from a file ``temporal workflow show -o json`` wrote (one run, named after the
    file)."""
    run_id = Path(path).stem
    try:
        history = WorkflowHistory.from_json(run_id, json.loads(Path(path).read_text()))
    except (OSError, ValueError, KeyError) as exc:
        return RecordedRun(
            run_id=run_id, agent="", input=RunInput(agent=""), problem=f"unreadable: {exc}"
        )
    return await recorded_from_histories(convert, run_id, [list(history.events)])
