"""How the transcript reaches the model activity: the one seam for that choice.

Sending the whole transcript in every model activity input makes history grow quadratically
with the number of turns (each turn re-records everything said before). Keeping that decision
behind :class:`ContextTransport` lets a run switch to an approach that bounds the bytes a turn
adds without touching the turn loop.
"""

from __future__ import annotations

from typing import Protocol

from relaykit.messages import Message


class ContextTransport(Protocol):
    """Chooses the messages (or references to them) that go into one model request."""

    def messages_for_request(self, transcript: list[Message]) -> list[Message]: ...


class InlineTransport:
    """Every request carries the whole transcript inline (simple; history grows with it)."""

    def messages_for_request(self, transcript: list[Message]) -> list[Message]:
        return list(transcript)
