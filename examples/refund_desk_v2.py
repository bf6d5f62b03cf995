"""The refund desk with changed instructions: refunds above 40 EUR go to a person.

The candidate of the example evaluation (``python -m examples.evaluate_refund_desk``, or
``relaykit eval examples.refund_desk_v2 ...``): the same agent name and tools as
:mod:`examples.refund_desk`, other instructions. ``score`` is the module's scorer: an answer
passes when it is the same, and scores half when it hands the refund to a person instead.
"""

from __future__ import annotations

from typing import Any

from examples.refund_desk import lookup_order, refund
from relaykit import Agent

INSTRUCTIONS = (
    "You run the refund desk. Look the order up; refund a duplicate charge of at most 40 EUR "
    "in full, and leave larger ones to a person."
)

desk = Agent(name="desk", instructions=INSTRUCTIONS, tools=[lookup_order, refund])


def score(recorded: Any, candidate: Any) -> float:
    """1 for the same answer, 0.5 for a refund left to a person, else 0."""
    if recorded == candidate:
        return 1.0
    return 0.5 if "a person will review" in str(candidate) else 0.0
