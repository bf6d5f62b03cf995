"""The heartbeats of one activity attempt: a tool's own progress and the attempt's start record,
kept together in the one set of details Temporal stores.

Temporal keeps only the latest heartbeat details of an activity and hands them to the next
attempt. relaykit puts two things there: the progress a tool reports (``ToolContext.heartbeat``,
or the SDK's ``activity.heartbeat(...)`` called by the tool itself) and, for a ``"write"`` call,
the record that the attempt started the tool (:mod:`relaykit.activities.attempts`), always as the
last detail. A tool's own heartbeat would erase that record, and a lost write would then look
like one that never started: so every ``activity.heartbeat(...)`` call of an attempt goes through
:class:`AttemptHeartbeats`, a worker interceptor (the SDK's public
``ActivityOutboundInterceptor.heartbeat`` sees each one), which appends the record. The same
interceptor shows the tool ``activity.info().heartbeat_details`` without the record, so a tool
resuming from its progress reads only its own.

Where that cannot hold, the mechanism fails closed: a ``"write"`` tool's attempt checks that its
heartbeats reach the interceptor before the tool runs (:meth:`AttemptBeats.kept`), and an
attempt that finds details without a record it can read treats the call's outcome as unknown.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
from collections.abc import AsyncIterator
from typing import Any

from temporalio import activity
from temporalio.worker import (
    ActivityInboundInterceptor,
    ActivityOutboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from relaykit.tools import ATTEMPT_CLAIM_KEY, split_claim

_current: contextvars.ContextVar[AttemptBeats | None] = contextvars.ContextVar(
    "relaykit_attempt_beats", default=None
)


class AttemptBeats:
    """The heartbeat state of one attempt: the progress to repeat and the start record."""

    def __init__(self, previous: Any, intercepted: bool) -> None:
        self.previous: tuple[Any, ...] = tuple(previous or ())
        """The details the previous attempt left, as Temporal stored them."""
        self.progress: tuple[Any, ...] = split_claim(self.previous)[0]
        """The tool's last progress (this attempt's, else the previous one's)."""
        self.claim: dict[str, Any] | None = None
        self.intercepted = intercepted
        self.routed = False
        """An ``activity.heartbeat(...)`` call of this attempt reached the interceptor."""

    def details(self, progress: tuple[Any, ...]) -> tuple[Any, ...]:
        """``progress`` followed by the start record, when the attempt keeps one."""
        self.progress = progress
        if self.claim is None:
            return progress
        return (*progress, {ATTEMPT_CLAIM_KEY: self.claim})

    def beat(self, *progress: Any) -> None:
        """Heartbeat ``progress`` (the record follows it)."""
        if self.intercepted:
            activity.heartbeat(*progress)  # the interceptor appends the record
        else:
            activity.heartbeat(*self.details(progress))

    def kept(self) -> bool:
        """Heartbeat the progress and record through the SDK's public function, and say whether
        that reached the interceptor: only then does the record survive the tool's own
        ``activity.heartbeat(...)`` calls."""
        self.routed = False
        self.beat(*self.progress)
        return self.intercepted and self.routed

    @contextlib.asynccontextmanager
    async def automatic(self) -> AsyncIterator[None]:
        """Heartbeat every quarter of the heartbeat timeout while the body runs, repeating the
        last progress: a tool that never heartbeats itself still shows it is alive, and one
        that reported progress does not have it erased."""
        timeout = activity.info().heartbeat_timeout
        if not timeout:
            yield
            return
        interval = max(timeout.total_seconds() / 4, 0.05)

        async def loop() -> None:
            while True:
                await asyncio.sleep(interval)
                self.beat(*self.progress)

        task = asyncio.create_task(loop())
        try:
            yield
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


def attempt_beats() -> AttemptBeats:
    """This attempt's heartbeat state (set up by :class:`AttemptHeartbeats`; without it, as in
    ``ActivityEnvironment``, a state that knows its beats are not intercepted)."""
    beats = _current.get()
    if beats is None:
        beats = AttemptBeats(activity.info().heartbeat_details, intercepted=False)
        _current.set(beats)
    return beats


class AttemptHeartbeats(Interceptor):
    """The worker interceptor that keeps each attempt's start record in its heartbeats."""

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _Inbound(next)


class _Inbound(ActivityInboundInterceptor):
    def init(self, outbound: ActivityOutboundInterceptor) -> None:
        self._outbound = _Outbound(outbound)
        super().init(self._outbound)

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        beats = AttemptBeats(self._outbound.next.info().heartbeat_details, intercepted=True)
        self._outbound.beats = beats
        token = _current.set(beats)
        try:
            return await super().execute_activity(input)
        finally:
            _current.reset(token)


class _Outbound(ActivityOutboundInterceptor):
    beats: AttemptBeats | None = None
    _shown: activity.Info | None = None

    def info(self) -> activity.Info:
        info = self.next.info()
        progress = split_claim(info.heartbeat_details)[0]
        if len(progress) == len(info.heartbeat_details):
            return info
        if self._shown is None:  # the tool sees its own progress, not the start record
            self._shown = dataclasses.replace(info, heartbeat_details=list(progress))
        return self._shown

    def heartbeat(self, *details: Any) -> None:
        beats = self.beats
        if beats is None:
            self.next.heartbeat(*details)
            return
        beats.routed = True
        self.next.heartbeat(*beats.details(split_claim(details)[0]))


__all__ = ["AttemptBeats", "AttemptHeartbeats", "attempt_beats"]
