"""Long runs: continue-as-new at turn boundaries, and compaction of the transcript.

Both happen only at a turn boundary, where nothing is half-handled: the turn's tool calls,
handoff and approvals are done. Continue-as-new drains the signal and update handlers first;
background subagents report by workflow id, so they reach the new run. Compaction (an agent's
``ContextPolicy``, or the default for small context windows) keeps the original task and whole
recent turns, and replaces the rest with a summary (a model call) or a note.

Workflow code: deterministic, no I/O (the summary is a model call: an activity).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from temporalio import workflow

from relaykit.context_policy import default_context_policy
from relaykit.messages import Message
from relaykit.runs import RunState
from relaykit.workflows.run_state import EVENTS_KEPT_ACROSS_RUNS, Run, head

Summarize = Callable[[list[Message], str], Awaitable[str]]


async def maybe_continue_as_new(run: Run, turns_this_run: int) -> None:
    """Hand the run to a fresh workflow run when history grows large (raises to do so)."""
    if turns_this_run == 0:
        return
    info = workflow.info()
    every = run.input.continue_as_new_after_turns
    if not (
        info.is_continue_as_new_suggested()
        or info.get_current_history_length() >= run.input.continue_as_new_after_events
        or (every is not None and turns_this_run >= every)
    ):
        return
    await workflow.wait_condition(workflow.all_handlers_finished)
    await run.drain_background(clear=True)
    state = run.state.model_copy(deep=True)
    if state.context_ref is not None:  # the stored prefix need not travel in the input
        state.transcript = state.transcript[state.context_ref_count - state.transcript_offset :]
        state.transcript_offset = state.context_ref_count
    kept = state.events[-EVENTS_KEPT_ACROSS_RUNS:]
    state.event_offset += len(state.events) - len(kept)
    state.events = kept
    state.runs += 1
    upgrade = (  # versioned workers only: the next execution starts on the current build
        workflow.ContinueAsNewVersioningBehavior.AUTO_UPGRADE
        if run.graph.upgrade_on_continue_as_new
        else None
    )
    workflow.continue_as_new(
        run.input.model_copy(update={"state": state}), initial_versioning_behavior=upgrade
    )


def compaction_due(run: Run, last_input_tokens: int) -> Any:
    """The policy to compact with now, or ``None``."""
    policy = run.graph.agents.get(run.input.agent, run.current_agent).context_policy
    if policy is None:  # small context windows get one by default
        policy = default_context_policy(run.graph.model_for(run.current_agent))
    if policy is None or last_input_tokens < policy.max_input_tokens:
        return None
    return policy


@dataclass
class Compaction:
    """A compacted transcript, for the turn loop to put in place."""

    transcript: list[Message]
    removed: int
    """How many messages the summary replaces."""


async def compact(state: RunState, policy: Any, summarize: Summarize) -> Compaction | None:
    """The transcript with its older part replaced by a summary; ``None`` when nothing is old
    enough to go."""
    transcript = state.transcript
    turn_starts = [i for i, m in enumerate(transcript) if m.role == "assistant"]
    if len(turn_starts) <= policy.keep_last_turns:
        return None
    cut = turn_starts[-policy.keep_last_turns] if policy.keep_last_turns else len(transcript)
    task = state.task
    old = [m for m in transcript[:cut] if m != task]
    if not old:
        return None
    if policy.strategy == "summarize":
        summary = await summarize(old, policy.summary_instructions)
    else:
        summary = f"[{len(old)} earlier messages were removed to fit the context window]"
    kept_head = [task] if task is not None else []
    return Compaction(
        transcript=[
            *kept_head,
            Message.user(f"Summary of the conversation so far:\n{summary}"),
            *transcript[cut:],
        ],
        removed=len(old),
    )


def summary_prompt(messages: list[Message]) -> Message:
    """What the summarising model call reads: the old messages as lines of text."""
    lines = []
    for m in messages:
        if m.role == "tool":
            lines.append(f"[tool {m.name} returned] {head(m.content, 2000)}")
        elif m.role == "assistant":
            if m.content:
                lines.append(f"[{m.agent or 'assistant'}] {head(m.content, 2000)}")
            lines.extend(
                f"[{m.agent or 'assistant'} called {c.name}] {head(c.arguments, 500)}"
                for c in m.tool_calls
            )
        else:
            lines.append(f"[user] {head(m.content, 2000)}")
    return Message.user("\n".join(lines))
