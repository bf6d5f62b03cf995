"""Background subagents: fire-and-forget child workflows whose reports arrive at turn boundaries.

Declared here; the turn loop (:mod:`relaykit.workflows.loop`) owns their bookkeeping.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

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
