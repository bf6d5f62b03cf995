"""Forking a run: a new ``AgentRun`` that starts from turn N of an existing one.

The origin's transcript is read from its Temporal history, not from its live state: every model
call is an activity whose input holds the messages sent since the prefix the previous call
stored (``base_ref``/``base_count``) or the whole transcript (inline), and whose result holds the
model's message. Replaying those in order rebuilds exactly what the model saw at each turn,
across continue-as-new (each run of the chain is read; turns count from the first start), after
handoffs (the turn's agent is in the call's summary) and after transcript rewrites (an inline
request replaces what came before). Nothing runs again: the new run's input is the transcript of
turns 1..N, so its first activity is the model call of turn N+1.

Turn N is the model call N, the tool calls it asked for and their results. What the fork keeps
is what the model call N+1 was sent, up to and including turn N's tool results: messages that
entered at the following turn boundary (injected messages, reports) are not part of turn N. A
turn whose tool calls have no results yet (running, or waiting for approval) cannot be forked
from; a final answer can.

A compaction's summary call is no turn and is skipped: the turn after it was sent the compacted
transcript inline, so a fork at the turn before a summary starts from what the origin sent next
(the task, the summary and the recent turns), and a fork at an earlier turn from that turn's
whole transcript. Summary calls are labelled ``summary after turn N``; recorded before that
label, one carried the label of the turn before it and is told apart by its shape (that turn
already answered; one inline user message, no tools). A call the run cancelled (a steer) was
never answered, whatever its activity returned.

The origin is untouched. The new run records where it came from in its input
(:class:`~relaykit.runs.ForkOrigin`), its result (``forked_from``) and, when the namespace has
it, the search attribute ``RelayForkOf``.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import SearchAttributePair
from temporalio.service import RPCError, RPCStatusCode

from relaykit import fleet
from relaykit.authors import author
from relaykit.client import RunHandle
from relaykit.errors import RelaykitError, error_detail
from relaykit.messages import Message, ModelResponse
from relaykit.models.spec import ModelRequest
from relaykit.run_ids import check_run_id, with_suffix
from relaykit.runs import ForkOrigin, RunInput, RunResult
from relaykit.search_attributes import RELAY_FORK_OF, keyword
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW, MODEL_ACTIVITY
from relaykit.workflows.model_turn import SUMMARY_LABEL


class ForkError(RelaykitError):
    """A run cannot be forked at the turn asked for (unknown run, turn out of range, tools of
    the turn still running)."""


@dataclass
class _ModelCall:
    turn: int
    agent: str
    request: ModelRequest
    summary: bool = False
    """A compaction's summary call: it is no turn, and what it was sent is no transcript."""
    response: ModelResponse | None = None
    abandoned: bool = False
    """Cancelled by the run (a steer, the run's cancellation): its answer was never used."""


def _model_call(label: str, request: ModelRequest, run_id: str) -> _ModelCall:
    """A model call from its activity summary, ``<agent> · turn <n> · <model>`` or
    ``<agent> · summary after turn <n> · <model>``."""
    agent, what, *_ = [*label.split(" · "), ""]
    for prefix, summary in ((f"{SUMMARY_LABEL} ", True), ("turn ", False)):
        number = what.removeprefix(prefix)
        if what.startswith(prefix) and number.isdigit():
            return _ModelCall(int(number), agent, request, summary=summary)
    raise ForkError(
        f"run {run_id!r} has a model call labelled {label!r}, which names no turn: "
        "its turns cannot be rebuilt from its history"
    )


def _summary_before_labels(call: _ModelCall, answered: set[int]) -> bool:
    """Whether ``call`` is a summary call recorded before summary calls were labelled: then
    it carried the label of the turn before it, whose own call had already been answered, and
    it sent the old messages as one user message, inline, with no tools. (A turn's call runs
    again under the same label only when the first was steered away, or its transcript was
    missing: neither was answered.)"""
    request = call.request
    return (
        call.turn in answered
        and not request.tools
        and request.base_ref is None
        and len(request.messages) == 1
        and request.messages[0].role == "user"
    )


@dataclass
class TurnView:
    """What the model was sent at one turn, and what it answered."""

    turn: int
    agent: str
    sent: list[Message]
    answer: Message | None = None


@dataclass
class RunTurns:
    """A run's turns as its history recorded them."""

    first_input: RunInput
    task_queue: str
    open: bool
    turns: dict[int, TurnView] = field(default_factory=dict)

    def finished(self) -> int:
        """The last turn a fork can start from (0 if none)."""
        return max((n for n in self.turns if self.cut(n) is not None), default=0)

    def cut(self, n: int) -> tuple[list[Message], str] | None:
        """Turns 1..n and the agent active after turn n, or ``None`` if turn n is unfinished."""
        after = self.turns.get(n + 1)
        if after is not None:  # what the next call was sent holds turn n's results
            return _through_last_turn(after.sent), after.agent
        view = self.turns.get(n)
        if view is not None and view.answer is not None and not view.answer.tool_calls:
            return [*view.sent, view.answer], view.agent
        return None


def _through_last_turn(sent: list[Message]) -> list[Message]:
    """``sent`` up to the last model message and the tool results of its calls (leaving out
    what entered at the turn boundary after them)."""
    last = max((i for i, m in enumerate(sent) if m.role == "assistant"), default=-1)
    if last < 0:
        return list(sent)
    ids = {call.id for call in sent[last].tool_calls}
    end = last + 1
    while end < len(sent) and sent[end].role == "tool" and sent[end].tool_call_id in ids:
        end += 1
    return list(sent[:end])


async def _runs_of_chain(client: Client, run_id: str) -> tuple[list[Any], Any]:
    """Histories of every run of ``run_id``'s continue-as-new chain, first run first, and the
    description of the current one."""
    handle = client.get_workflow_handle(run_id)
    try:
        description = await handle.describe()
    except RPCError as exc:
        if exc.status == RPCStatusCode.NOT_FOUND:
            raise ForkError(
                f"no run with id {run_id!r} in namespace {client.namespace!r}",
                hint="`relaykit runs` lists the runs that exist",
            ) from None
        raise
    if description.workflow_type != AGENT_RUN_WORKFLOW:
        raise ForkError(f"{run_id!r} is a {description.workflow_type} workflow, not an agent run")
    histories: list[list[Any]] = []
    current: str | None = description.run_id
    while current:
        events = [
            event
            async for event in client.get_workflow_handle(
                run_id, run_id=current
            ).fetch_history_events()
        ]
        histories.append(events)
        started = events[0].workflow_execution_started_event_attributes
        current = started.continued_execution_run_id or None
    histories.reverse()
    return histories, description


async def read_turns(client: Client, run_id: str) -> RunTurns:
    """Rebuild ``run_id``'s turns from its history (see the module's docstring)."""
    from temporalio.client import WorkflowExecutionStatus

    histories, description = await _runs_of_chain(client, run_id)
    return await turns_of_histories(
        client.data_converter,
        histories,
        run_id,
        task_queue=description.task_queue or "",
        open=description.status == WorkflowExecutionStatus.RUNNING,
    )


async def turns_of_histories(
    convert: Any, histories: list[list[Any]], run_id: str, *, task_queue: str, open: bool
) -> RunTurns:
    """A run's turns from the histories of its continue-as-new chain, first run first (read
    from Temporal, or from files ``temporal workflow show -o json`` wrote)."""

    async def decode(payloads: Any, kind: type, what: str) -> Any:
        try:
            [value] = await convert.decode(payloads, [kind])
        except Exception as exc:  # recorded by another release, or written by hand
            raise ForkError(
                f"run {run_id!r}: its recorded {what} cannot be read by this relaykit "
                f"({error_detail(exc, 300)})",
                hint="read the run with the release that recorded it",
            ) from exc
        return value

    started = histories[0][0].workflow_execution_started_event_attributes
    first_input = await decode(started.input.payloads, RunInput, "input")
    calls: list[_ModelCall] = []
    for events in histories:
        by_event: dict[int, _ModelCall] = {}
        for event in events:
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
                attrs = event.activity_task_scheduled_event_attributes
                if attrs.activity_type.name != MODEL_ACTIVITY:
                    continue
                request = await decode(attrs.input.payloads, ModelRequest, "model request")
                label = await decode([event.user_metadata.summary], str, "model call summary")
                call = _model_call(label, request, run_id)
                by_event[event.event_id] = call
                calls.append(call)
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
                attrs = event.activity_task_completed_event_attributes
                done = by_event.get(attrs.scheduled_event_id)
                if done is not None:
                    done.response = await decode(
                        attrs.result.payloads, ModelResponse, "model response"
                    )
            elif event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_CANCEL_REQUESTED:
                attrs = event.activity_task_cancel_requested_event_attributes
                cancelled = by_event.get(attrs.scheduled_event_id)
                if cancelled is not None:
                    cancelled.abandoned = True
    runs = RunTurns(first_input=first_input, task_queue=task_queue, open=open)
    transcript: list[Message] = []
    answered: set[int] = set()
    for call in calls:
        if call.summary or _summary_before_labels(call, answered):
            continue  # the turn after it was sent the compacted transcript inline
        request = call.request
        if request.base_ref is not None:
            transcript = transcript[: request.base_count] + list(request.messages)
        else:
            transcript = list(request.messages)
        view = TurnView(call.turn, call.agent, list(transcript))
        runs.turns[call.turn] = view  # a turn resent inline (store missing) keeps the last
        if call.response is not None and not call.abandoned:
            answered.add(call.turn)
            answer = call.response.message.model_copy(update={"agent": call.agent})
            view.answer = answer
            transcript = [*transcript, answer]
    return runs


async def fork_run(
    client: Client,
    run_id: str,
    at_turn: int,
    *,
    input: str | None = None,
    id: str | None = None,
    by: str | None = None,
) -> RunHandle:
    """Start a new run from turn ``at_turn`` of ``run_id`` (running or closed, however it
    ended) and return its handle: its transcript is the origin's turns 1..``at_turn``, its agent
    the one active after that turn, then ``input`` as a user message. No tool of those turns
    runs again, the origin is untouched, and the new run counts turns on from ``at_turn``.

    ``by`` (default: this machine's user) is who forked: recorded in the new run's input
    (``RunInput.fork.by``, so in its history) and its ``run_started`` event.

    Raises :class:`ForkError` for an unknown run, a turn outside the finished turns, or a turn
    whose tool calls have no results yet.
    """
    runs = await read_turns(client, run_id)
    finished = runs.finished()
    if at_turn < 1 or at_turn > max(runs.turns, default=0):
        raise ForkError(
            f"run {run_id!r} has {finished} finished turn{'s' if finished != 1 else ''}: "
            f"cannot fork at turn {at_turn}",
            hint=f"--at-turn takes 1..{finished}" if finished else "wait for its first turn",
        )
    cut = runs.cut(at_turn)
    if cut is None:
        view = runs.turns[at_turn]
        if view.answer is None:
            why = (
                "its model call is still running" if runs.open else "its model call never finished"
            )
        elif runs.open:
            why = "its tool calls are still running (or waiting for approval)"
        else:
            why = "the run ended before its tool calls finished"
        raise ForkError(
            f"turn {at_turn} of run {run_id!r} cannot be forked from: {why}",
            hint=f"fork at an earlier turn (1..{finished})" if finished else "wait for it",
        )
    messages, agent = cut
    if input:
        messages = [*messages, Message.user(input)]
    origin = ForkOrigin(run_id=run_id, turn=at_turn, by=author(by))
    base = runs.first_input
    new_input = RunInput(
        agent=agent,
        input=messages,
        max_turns=max(base.max_turns, at_turn + 1),
        answer_on_last_turn=base.answer_on_last_turn,
        budget=base.budget,
        extra_instructions=base.extra_instructions,
        context=base.context,
        transcript_transport=base.transcript_transport,
        continue_as_new_after_turns=base.continue_as_new_after_turns,
        continue_as_new_after_events=base.continue_as_new_after_events,
        fork=origin,
        priority=base.priority,
        tenant=base.tenant,
        tenant_weight=base.tenant_weight,
    )
    forked = [SearchAttributePair(RELAY_FORK_OF, keyword(str(origin)))]
    options = await fleet.start_options(  # the origin's priority and tenant
        client,
        new_input,
        *(forked if await fleet.has_attribute(client, RELAY_FORK_OF.name) else ()),
    )
    new_id = check_run_id(
        id or with_suffix(run_id, f"-fork{at_turn}-{uuid.uuid4().hex[:6]}"), "the fork's id"
    )
    handle = await client.start_workflow(
        AGENT_RUN_WORKFLOW,
        new_input,
        id=new_id,
        task_queue=runs.task_queue,
        result_type=RunResult,
        static_summary=f"{agent}: fork of {origin}" + (f": {input[:160]}" if input else ""),
        **options,
    )
    return RunHandle(handle, client)
