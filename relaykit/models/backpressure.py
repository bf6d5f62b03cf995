"""429 backpressure: a provider that says "slow down" pauses all of its calls on this worker.

A 429 (or an overload answer: 503, 529) with ``Retry-After`` is about the provider, not about
the one call that got it. So :class:`ProviderGates` keeps, per worker and per provider endpoint,
the time until which calls must not be sent: the call that got the answer fails its attempt
(Temporal retries it after the delay, as before), and every call of that provider on this worker
waits at the gate meanwhile instead of being sent, heartbeating so Temporal knows it is alive,
with the reason ("rate limited by openai until 12:04:31") in its heartbeat details, where
``relaykit run --wait``, ``relaykit result`` and the Temporal UI read it.

When the period ends one call goes first (a probe); the others follow once it got an answer
that is not another "slow down", so a storm of waiting calls does not hit the provider together
and get refused together. The gate holds for one worker; across workers, the provider queue's
rate limit (:mod:`relaykit.models.queues`) spreads calls out.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import urlsplit

from temporalio.exceptions import ApplicationError

from relaykit.models.endpoints import Endpoint

BACKPRESSURE_STATUSES = frozenset({429, 503, 529})
"""Answers that say the provider as a whole is busy (rate limited or overloaded)."""
HEARTBEAT_EVERY = 1.0
"""Seconds between heartbeats of a call waiting at the gate."""


def gate_key(endpoint: Endpoint) -> str:
    """One gate per provider endpoint: ``openai`` at api.openai.com is not ollama on this host."""
    return f"{endpoint.provider}@{urlsplit(endpoint.url).netloc}"


@dataclass
class _Gate:
    until: float = 0.0
    """``time.time()`` before which no call is sent."""
    probing: bool = False
    """A call went first after a pause and has no answer yet."""


class ProviderGates:
    """The gates of one worker's model calls (one per provider endpoint)."""

    def __init__(self) -> None:
        self._gates: dict[str, _Gate] = {}

    def paused_until(self, key: str) -> float:
        gate = self._gates.get(key)
        return gate.until if gate is not None else 0.0

    async def wait(
        self, key: str, provider: str, heartbeat: Callable[[str], None]
    ) -> Callable[[BaseException | None], None]:
        """Wait until calls of ``key`` may be sent; returns what to call with the call's outcome
        (its exception, or ``None``)."""
        gate = self._gates.setdefault(key, _Gate())
        probe = False
        while True:
            now = time.time()
            if gate.until > now:
                heartbeat(f"rate limited by {provider} until {_clock(gate.until)}")
                await asyncio.sleep(min(gate.until - now, HEARTBEAT_EVERY))
                continue
            if gate.until and gate.probing:  # after a pause: wait for the probe's answer
                heartbeat(f"rate limited by {provider}: one call is checking whether it is over")
                await asyncio.sleep(0.05)
                continue
            if gate.until:
                gate.probing = probe = True
            break

        def done(exc: BaseException | None) -> None:
            delay = retry_after(exc)
            if delay is not None:
                gate.until = max(gate.until, time.time() + delay)
            elif probe:
                gate.until = 0.0  # the provider answered: the pause is over
            if probe:
                gate.probing = False

        return done


def retry_after(exc: BaseException | None) -> float | None:
    """The pause a "slow down" answer asks for, in seconds (``None`` for anything else)."""
    if not isinstance(exc, ApplicationError) or exc.next_retry_delay is None:
        return None
    details = exc.details[0] if exc.details else None
    status = details.get("status") if isinstance(details, dict) else None
    if status not in BACKPRESSURE_STATUSES:
        return None
    return exc.next_retry_delay.total_seconds()


def _clock(at: float) -> str:
    return datetime.fromtimestamp(at).strftime("%H:%M:%S")
