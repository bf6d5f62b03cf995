"""Which attempt of a ``"write"`` call may run its tool: the activity side of unknown outcomes.

Temporal runs an activity at least once: an attempt whose worker dies, or that times out, is
retried, and the retry cannot know whether the lost attempt had already acted. For a ``"write"``
tool (a refund, a push) that is the difference between one effect and two, so:

- before the tool runs, the attempt records that it started, as a heartbeat detail the server
  *acknowledged* (an RPC awaited here, not the SDK's throttled background heartbeat, which a
  SIGKILL can lose): ``{"relaykit.attempt": {"attempt": n, "started_at": ..., "state":
  "started"}}``, kept as the last detail after the tool's own progress;
- every later heartbeat of the attempt repeats it (Temporal keeps only the latest details);
- an attempt that ends with an error the tool raised (``ApplicationError``, retried by its policy)
  first records ``"state": "raised"``: a known failure, so the next attempt may run the tool;
- an attempt that finds a ``"started"`` record from an earlier attempt does not run the tool and
  fails with a non-retryable ``ToolOutcomeUnknown`` error carrying when the lost attempt started
  and when the loss was noticed. The workflow turns it into an error result or a question for a
  person (:mod:`relaykit.workflows.tool_outcome`).

An attempt that completed its tool but could not report the result (the worker died in between)
also leaves ``"started"``: from Temporal's side it neither returned nor raised, and its outcome is
indeed unknown. ``"read"`` and ``"idempotent"`` tools record nothing and are retried as before, as
are calls whose input was recorded before tools had effects (``effect`` is ``None``).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from temporalio import activity
from temporalio.exceptions import ApplicationError

from relaykit import errors
from relaykit.tools import ATTEMPT_CLAIM_KEY, split_claim


class AttemptGuard:
    """One attempt's start record; it records nothing for calls that need none."""

    def __init__(self, active: bool, progress: tuple[Any, ...] = ()) -> None:
        self.active = active
        self.progress = progress
        self.claim_data: dict[str, Any] | None = None

    @property
    def details(self) -> dict[str, Any] | None:
        """The heartbeat detail to repeat after the progress (``None``: nothing recorded yet)."""
        return None if self.claim_data is None else {ATTEMPT_CLAIM_KEY: self.claim_data}

    @classmethod
    async def check(cls, effect: str | None, what: str) -> AttemptGuard:
        """Check the earlier attempts of this call: raises the ``ToolOutcomeUnknown`` error when
        one was lost after it started the tool."""
        if effect != "write" or not activity.in_activity():
            return cls(False)
        info = activity.info()
        progress, previous = split_claim(info.heartbeat_details)
        if previous is not None and previous.get("state") == "started":
            raise unknown_outcome_error(what, previous, noticed=info.current_attempt_scheduled_time)
        return cls(True, progress)

    @classmethod
    async def begin(cls, effect: str | None, what: str) -> AttemptGuard:
        """:meth:`check`, then :meth:`claim`: for tools that act as soon as they are called."""
        guard = await cls.check(effect, what)
        await guard.claim()
        return guard

    async def claim(self) -> None:
        """Record that this attempt starts the tool, once the server has it (before it acts)."""
        if not self.active or self.claim_data is not None:
            return
        info = activity.info()
        self.claim_data = {
            "attempt": info.attempt,
            "started_at": _iso(info.started_time or datetime.now(UTC)),
            "state": "started",
        }
        await self._record()

    @property
    def claimed(self) -> bool:
        return self.claim_data is not None

    def lost(self, what: str) -> ApplicationError:
        """The error for this attempt when it knows itself that it lost its call (a request sent
        and no answer came back)."""
        assert self.claim_data is not None
        return unknown_outcome_error(what, self.claim_data, noticed=datetime.now(UTC))

    async def raised(self) -> None:
        """The tool raised: a known failure, which the next attempt may retry."""
        if self.claim_data is None:
            return
        self.claim_data = {**self.claim_data, "state": "raised"}
        activity.heartbeat(*self.progress, self.details)  # replaces a beat still queued
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - not recorded: the next attempt reports unknown, safely
            activity.logger.warning("could not record that the tool raised; a retry will not run")

    async def _record(self) -> None:
        """Record the details and wait for the server to acknowledge them."""
        info = activity.info()
        try:
            client = activity.client()
        except RuntimeError:  # e.g. ActivityEnvironment without a client: best effort
            activity.heartbeat(*self.progress, self.details)
            return
        handle = client.get_async_activity_handle(task_token=info.task_token)
        await handle.heartbeat(*self.progress, self.details)


def unknown_outcome_error(
    what: str, previous: dict[str, Any], *, noticed: datetime | None
) -> ApplicationError:
    attempt = previous.get("attempt")
    started = previous.get("started_at")
    noticed_at = _iso(noticed) if noticed is not None else None
    message = (
        f"{what}: attempt {attempt} started at {started} and was lost before it returned or "
        "raised (its worker stopped, its connection broke or it timed out; noticed by "
        f"{noticed_at}). It may or may not have taken effect, so it was not run again."
    )
    return ApplicationError(
        message,
        {"attempt": attempt, "started_at": started, "noticed_at": noticed_at},
        type=errors.TOOL_OUTCOME_UNKNOWN,
        non_retryable=True,
    )


def _iso(moment: datetime) -> str:
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return moment.astimezone(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = ["AttemptGuard", "unknown_outcome_error"]
