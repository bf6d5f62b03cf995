"""Background subagents: fire-and-forget child workflows whose reports arrive at turn boundaries.

Declared here; the turn loop (:mod:`relaykit.workflows.loop`) owns their bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    from relaykit.agent import Agent, Budget


@dataclass(eq=False)
class Subagents:
    """Gives an agent ``spawn_subagent``, ``wait_subagents``, ``cancel_subagent`` and
    ``send_to_subagent`` tools.

    With no ``agents``, the current agent is cloned without its subagents and handoffs (so a
    subagent cannot spawn recursively).
    """

    agents: tuple[Agent, ...] | list[Agent] = field(default_factory=tuple)
    max_concurrent: int = 4
    max_turns: int = 50
    budget: Budget | None = None
    max_result_chars: int = 16_000
    detached: bool = False
    """Subagents keep running after the parent ends (parent-close policy ABANDON); their reports
    go to ``deliver_to_workflow`` (a signal) and/or ``deliver_url`` (an HTTP POST)."""
    deliver_to_workflow: str | None = None
    deliver_url: str | None = None
    instructions: str | None = None
    """Replaces the built-in guidance added to the agent's system prompt."""
    approvals: Literal["reject", "parent"] = "reject"
    """Background tasks run unattended: a tool needing approval is rejected at once
    (``"reject"``), unless approvals should surface in the parent run for a person to answer
    there (``"parent"``; not available to detached tasks, whose parent may be gone)."""

    def __post_init__(self) -> None:
        from relaykit.errors import ConfigurationError

        if self.max_concurrent < 1:
            raise ConfigurationError("Subagents(max_concurrent=...) must be at least 1")
        if self.detached and self.approvals == "parent":
            raise ConfigurationError(
                "detached subagents cannot send approvals to their parent (it may be gone)"
            )
        if self.detached and not (self.deliver_to_workflow or self.deliver_url):
            raise ConfigurationError(
                "detached subagents need somewhere to deliver their reports",
                hint="set deliver_to_workflow=... or deliver_url=...",
            )


DEFAULT_INSTRUCTIONS = (
    "You can run background tasks with spawn_subagent: give each a complete, self-contained "
    "prompt (the subagent cannot see this conversation). Keep working while they run; their "
    "reports arrive as messages. Before you give your final answer, wait for your tasks with "
    "wait_subagents or cancel the ones you no longer need."
)
