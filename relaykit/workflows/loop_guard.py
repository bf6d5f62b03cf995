"""The loop guard: a model that repeats the same tool call gets the earlier result, not a rerun.

Small and weak models (and strong ones, now and then) get stuck calling one tool with the same
arguments turn after turn; a run could spend 40 turns and minutes of tool side effects on one
identical call. Each agent allows a call (tool name and canonical JSON arguments) to run
``Agent.max_repeated_calls`` times since the last user-side message (a person's message, an
injected one, a background report, a compaction summary: anything that may change the answer).
Past that, the call is not run: its tool result says so and repeats the earlier result. When
every call of a turn was refused this way, the next model call is sent without tools so the
model has to answer (see :func:`withhold_tools`, which also applies an agent's
``answer_after_tool_turns``).

Everything is computed from the run state (the transcript and :class:`RepeatGuardState`), so it
is deterministic, replays, and survives continue-as-new. Runs that started before the guard
existed keep their behaviour (``workflow.patched``).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import hashlib
import json

from temporalio import workflow

from relaykit.agent import Agent
from relaykit.messages import ToolCall
from relaykit.runs import RepeatedCall, RepeatGuardState, RunState

PATCH_ID = "relaykit-loop-guard"
PATCH_ALL_KINDS = "relaykit-loop-guard.all-kinds"
"""The guard also refuses repeated subagent-tool calls and handoffs (before the tool path was
one, those always ran). A patch id of its own: in a run recorded before, such a repeat ran where
the guard would refuse it now, and asking ``PATCH_ID`` there would also turn the guard off for
the function tools of that run (a patch answers the same way all run long)."""
RESULT_HEAD = 2_000
"""How much of the earlier result a refused call repeats."""


def call_key(call: ToolCall) -> str:
    """Name plus a digest of the arguments as canonical JSON (key order and spacing ignored)."""
    try:
        canonical = json.dumps(
            json.loads(call.arguments or "{}"), sort_keys=True, separators=(",", ":")
        )
    except (ValueError, RecursionError):  # not JSON, or nested too deep: compare the text
        canonical = call.arguments
    digest = hashlib.sha256(canonical.encode("utf-8", "replace")).hexdigest()[:16]
    return f"{call.name}:{digest}"


def _catch_up(state: RunState) -> None:
    """Read the messages added since the last check: a user-side message resets the counts,
    tool results are remembered for the calls they answer."""
    guard = state.repeats
    total = state.transcript_offset + len(state.transcript)
    if total < guard.seen:  # the transcript was rewritten (compaction, handoff filter)
        guard.calls = {}
        guard.seen = 0
    start = max(guard.seen - state.transcript_offset, 0)
    by_id = {entry.last_call_id: entry for entry in guard.calls.values()}
    for message in state.transcript[start:]:
        if message.role == "user":
            guard.calls = {}
            by_id = {}
        elif message.role == "tool" and message.tool_call_id in by_id:
            content = message.content
            if len(content) > RESULT_HEAD:
                content = content[: RESULT_HEAD - 1] + "…"
            by_id[message.tool_call_id].result = content
    guard.seen = total


def guard_snapshot(state: RunState, calls: list[ToolCall]) -> RepeatGuardState:
    """What the guard remembers now, to go back to when a turn's ``calls`` are decided again
    (a replay whose definitions decided otherwise than the recorded decisions).

    Deciding changes only the entries of the turn's own calls (an entry's ``last_call_id`` is
    always a call of its own key) and the scalar fields; reading the transcript since the last
    check may replace the dict of entries or fill in earlier entries' results, which reading it
    again does the same way. So the snapshot copies those few entries and the dict, not every
    entry: a run of a thousand turns does not copy a thousand entries per turn."""
    guard = state.repeats
    entries = dict(guard.calls)
    for key in {call_key(call) for call in calls}:
        if key in entries:
            entries[key] = entries[key].model_copy()
    return guard.model_copy(update={"calls": entries})


def restore_guard(state: RunState, snapshot: RepeatGuardState) -> None:
    """Go back to ``snapshot`` (taken by :func:`guard_snapshot`; use it once)."""
    state.repeats = snapshot


def check_repeat(
    state: RunState,
    call: ToolCall,
    limit: int | None,
    patch_id: str = PATCH_ID,
    *,
    ran: bool = False,
) -> str | None:
    """``None``: run the call (it is counted). Otherwise the text of the tool result that
    replaces it. ``ran``: a replayed call the run recorded as run, counted whatever today's
    limit says (relaykit.workflows.call_record)."""
    if limit is None:
        return None
    _catch_up(state)
    guard = state.repeats
    key = call_key(call)
    entry = guard.calls.get(key)
    if entry is None or entry.count < limit or ran:
        if entry is None:
            entry = guard.calls[key] = RepeatedCall()
        entry.count += 1
        entry.last_call_id = call.id
        entry.result = None
        return None
    recorded = state.setup is not None and state.setup.recorded_calls  # has every guard patch
    if not recorded and not workflow.patched(patch_id):  # a run from before the guard
        entry.count += 1
        entry.last_call_id = call.id
        entry.result = None
        return None
    if guard.blocked_turn != state.turn:
        guard.blocked_turn = state.turn
        guard.blocked = 0
        last = next((m for m in reversed(state.transcript) if m.role == "assistant"), None)
        guard.calls_in_turn = len(last.tool_calls) if last is not None else 1
    guard.blocked += 1
    times = "once" if entry.count == 1 else f"{entry.count} times"
    if entry.result is None:
        earlier = "the result given for the same call above"
    else:
        earlier = entry.result
    # The earlier result comes first, as a tool result would read; the note says why.
    return (
        f"{earlier}\n\n(The same result as before: {call.name} already ran {times} with "
        "exactly these arguments, so it was not run again. Use this result instead of calling "
        "it again, and answer if you have what you need.)"
    )


def withhold_tools(state: RunState, agent: Agent) -> bool:
    """True when the next model call gets no tools, so the model answers instead of calling
    again: every call of the previous turn was refused as a repeat, or the agent has used its
    ``answer_after_tool_turns`` (its own tool-calling turns since the last user-side message,
    counted in the transcript the run holds)."""
    guard = state.repeats
    if (
        guard.blocked_turn > 0
        and guard.blocked_turn == state.turn - 1
        and guard.blocked >= guard.calls_in_turn
    ):
        return True
    limit = agent.answer_after_tool_turns
    if limit is None:
        return False
    turns = 0
    for message in reversed(state.transcript):
        if message.role == "user":
            break
        if message.role == "assistant" and message.tool_calls and message.agent == agent.name:
            turns += 1
    return turns >= limit
