"""What a run does when its transcript nears the model's context window.

Checked at turn boundaries against the input tokens the last model call actually used. The
system prompt is rebuilt every turn anyway; compaction always keeps the original task (the first
message) and whole recent turns (a turn starts at an assistant message, so no tool result loses
its call). Older turns are summarised by a model call (an activity) or dropped. The full
transcript stays retrievable for audit in the transcript store (the ``context_compacted`` event
names the stored prefix).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel

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
