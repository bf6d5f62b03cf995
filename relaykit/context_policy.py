"""What a run does when its transcript nears the model's context window.

Checked at turn boundaries against the input tokens the last model call actually used. The
system prompt is rebuilt every turn anyway; compaction always keeps the original task (the first
message) and whole recent turns (a turn starts at an assistant message, so no tool result loses
its call). Older turns are summarised by a model call (an activity) or dropped. The full
transcript stays retrievable for audit in the transcript store (the ``context_compacted`` event
names the stored prefix).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel

if TYPE_CHECKING:
    from relaykit.models.spec import ModelSpec

SUMMARY_INSTRUCTIONS = (
    "You compress a conversation between a user, an AI agent and its tools so the agent can "
    "continue the task. Keep every fact, number, name, URL, decision and open question the "
    "agent will need; drop chatter. Answer with the summary only."
)


class ContextPolicy(BaseModel):
    """Set it on the agent a run starts with; it applies to the whole run (handoffs included)."""

    max_input_tokens: int
    """Compact when the last model call's input reached this many tokens."""
    keep_last_turns: int = 4
    strategy: Literal["summarize", "keep_last"] = "summarize"
    summary_instructions: str = SUMMARY_INSTRUCTIONS


SMALL_CONTEXT_WINDOW = 32_768
"""Models with a context window up to this size get :func:`default_context_policy`."""


def default_context_policy(model: ModelSpec) -> ContextPolicy | None:
    """The policy for an agent that set none, when its model's window is known and small.

    A small model loops and repeats (one identical call filled SmolLM2's 4k window in 40 turns),
    and then the run fails with ``ContextWindowExceeded``. Dropping old turns keeps it going;
    summarising would ask that same small model for a summary, slowly and badly, so the default
    drops them. Compaction starts at 60% of the window: the system prompt, tool schemas and the
    answer need the rest.
    """
    window = model.context_window
    if window is None or window > SMALL_CONTEXT_WINDOW:
        return None
    return ContextPolicy(
        max_input_tokens=int(window * 0.6), keep_last_turns=2, strategy="keep_last"
    )
