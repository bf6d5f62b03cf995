"""What a candidate run of an evaluation carries, and what it returns about its tool calls.

An evaluation (:mod:`relaykit.evals`) answers a recorded run's input again with a changed agent.
The candidate is an ordinary ``AgentRun`` whose input holds an :class:`EvalContext`: the tool
results the recording got, per tool, in the order it got them. The tool path
(:mod:`relaykit.workflows.eval_calls`) answers a call whose tool and arguments match one of them
with the recorded result, without running anything; a call that matches nothing runs only when
its tool is a ``"read"`` and the evaluation allows live reads, and any other gets an error result
(:data:`NOT_EXECUTED`) the model reads. A ``"write"`` tool therefore never runs in an evaluation.

Compatibility data: these models are in candidate runs' inputs and results (add fields with
defaults; never rename or remove one). Core data: imports nothing above it.
"""

from __future__ import annotations

import json
from typing import Literal

from pydantic import BaseModel, Field

CallOutcome = Literal["matched", "live", "blocked"]
"""What happened to a candidate's call: answered from the recording, run live (a ``"read"``
with live reads allowed), or not executed (an error result the model reads)."""

NOT_EXECUTED = (
    "Tool {tool!r} was not executed during evaluation: no call with these arguments was "
    "recorded, and only recorded calls (and, when allowed, read-only tools) are answered."
)
"""The error result of a blocked call."""


class RecordedCall(BaseModel):
    """One tool call the recording made, and what it returned."""

    arguments: str
    """The call's arguments as canonical JSON (:func:`canonical_arguments`)."""
    content: str
    """The result the model read."""
    is_error: bool = False
    child: EvalContext | None = None
    """For an agent-tool or ``spawn_subagent`` call: the recorded child run's own calls (the
    agent-tool child, or the subagent the recorded task started). A matched call then runs the
    candidate's child agent as a candidate too, against them (recursively), instead of
    answering with the recorded result."""


class EvalContext(BaseModel):
    """Set on a candidate run's input (``RunInput.evaluation``); ``None`` on every other run."""

    recorded_run: str
    """The workflow id of the recorded run the candidate answers again."""
    calls: dict[str, list[RecordedCall]] = Field(default_factory=dict)
    """Per tool name, the recording's calls in the order it made them."""
    live_reads: bool = False
    """Unmatched calls of ``"read"`` tools run live (default: blocked like any other)."""
    mark: bool = False
    """The candidate's child runs carry ``RelayEvalOf`` too (the namespace has it)."""


class EvalCall(BaseModel):
    """One call a candidate made, and what the evaluation did with it (``RunResult.evaluation``)."""

    turn: int
    tool: str
    arguments: str
    outcome: CallOutcome


RecordedCall.model_rebuild()


def canonical_arguments(arguments: str) -> str:
    """Arguments as canonical JSON (sorted keys, no spaces), so key order and spacing never
    make two equal calls differ; text that is not JSON stays as written."""
    try:
        return json.dumps(json.loads(arguments), sort_keys=True, separators=(",", ":"))
    except ValueError:
        return arguments
