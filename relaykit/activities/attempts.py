"""Which attempt of a ``"write"`` call may run its tool: the activity side of unknown outcomes.

Temporal runs an activity at least once: an attempt whose worker dies, or that times out, is
retried, and the retry cannot know whether the lost attempt had already acted. For a ``"write"``
tool (a refund, a push) that is the difference between one effect and two, so:

- before the tool runs, the attempt records that it started, as a heartbeat detail the server
  *acknowledged* (an RPC awaited here, not the SDK's throttled background heartbeat, which a
  SIGKILL can lose): ``{"relaykit.attempt": {"attempt": n, "started_at": ..., "state":
  "started"}}``, kept as the last detail after the tool's own progress;
- every later heartbeat of the attempt repeats it (Temporal keeps only the latest details), the
  tool's own ``activity.heartbeat(...)`` calls too (:mod:`relaykit.activities.heartbeats`); a
  worker whose heartbeats would bypass that does not run ``"write"`` tools at all;
- an attempt that ends with an error the tool raised (``ApplicationError``, retried by its policy)
  first records ``"state": "raised"``: a known failure, so the next attempt may run the tool;
- an attempt that finds a ``"started"`` record from an earlier attempt does not run the tool and
  fails with a non-retryable ``ToolOutcomeUnknown`` error carrying when the lost attempt started
  and when the loss was noticed. The workflow turns it into an error result or a question for a
  person (:mod:`relaykit.workflows.tool_outcome`). So does one that finds heartbeat details
  without a record it can read: nothing then shows that no earlier attempt started the tool.

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
from relaykit.activities.heartbeats import AttemptBeats, attempt_beats
from relaykit.tools import ATTEMPT_CLAIM_KEY, split_claim

UNREADABLE = "its start record could not be read back"
START_NOT_KEPT = "ToolStartNotKept"
"""A ``"write"`` tool that was not run because its worker could not keep its start record."""


class AttemptGuard:
    """One attempt's start record; it records nothing for calls that need none."""

    def __init__(self, active: bool, beats: AttemptBeats | None = None, what: str = "") -> None:
        self.active = active
        self.beats = beats
        self.what = what

    @property
    def claim_data(self) -> dict[str, Any] | None:
        return self.beats.claim if self.beats is not None else None

    @property
    def details(self) -> dict[str, Any] | None:
        """The heartbeat detail to repeat after the progress (``None``: nothing recorded yet)."""
        claim = self.claim_data
        return None if claim is None else {ATTEMPT_CLAIM_KEY: claim}

    @classmethod
    async def check(cls, effect: str | None, what: str) -> AttemptGuard:
        """Check the earlier attempts of this call: raises the ``ToolOutcomeUnknown`` error when
        one was lost after it started the tool, or when what they left cannot say (details
        without a start record that reads as one: it was erased or is not ours, so no attempt
        can be shown not to have started the tool)."""
        if effect != "write" or not activity.in_activity():
            return cls(False)
        beats = attempt_beats()
        noticed = activity.info().current_attempt_scheduled_time
        previous = beats.previous
        claim = split_claim(previous)[1]
        if claim is not None and claim.get("state") == "raised":
            return cls(True, beats, what)
        if claim is not None:  # "started", or a state this code does not know
            raise unknown_outcome_error(what, claim, noticed=noticed)
        if previous:
            raise unknown_outcome_error(what, {}, noticed=noticed, why=UNREADABLE)
        return cls(True, beats, what)

    @classmethod
    async def begin(cls, effect: str | None, what: str, *, user_code: bool = False) -> AttemptGuard:
        """:meth:`check`, then :meth:`claim`: for tools that act as soon as they are called.
        ``user_code``: the tool is code that may call ``activity.heartbeat(...)`` itself."""
        guard = await cls.check(effect, what)
        await guard.claim(user_code=user_code)
        return guard

    async def claim(self, *, user_code: bool = False) -> None:
        """Record that this attempt starts the tool, once the server has it (before it acts).

        With ``user_code``, the record must also survive the tool's own heartbeats; when this
        worker cannot keep it so (its heartbeats do not reach :mod:`relaykit.activities.
        heartbeats`), the tool does not run."""
        if not self.active or self.beats is None or self.beats.claim is not None:
            return
        info = activity.info()
        self.beats.claim = {
            "attempt": info.attempt,
            "started_at": _iso(info.started_time or datetime.now(UTC)),
            "state": "started",
        }
        # Through the SDK's heartbeat first: a throttled beat still queued from before (without
        # the record) must not reach the server after the acknowledged one below.
        kept = self.beats.kept()
        await self._record()
        if user_code and not kept:
            raise ApplicationError(
                f"{self.what}: this worker cannot keep the record that the call started (its "
                "heartbeats do not pass through relaykit's worker interceptor), so the tool was "
                "not run: a lost attempt could not be told from one that never started",
                type=START_NOT_KEPT,
                non_retryable=True,
            )

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
        if self.beats is None or self.beats.claim is None:
            return
        self.beats.claim = {**self.beats.claim, "state": "raised"}
        self.beats.beat(*self.beats.progress)  # replaces a beat still queued
        try:
            await self._record()
        except Exception:  # noqa: BLE001 - not recorded: the next attempt reports unknown, safely
            activity.logger.warning("could not record that the tool raised; a retry will not run")

    async def _record(self) -> None:
        """Record the details and wait for the server to acknowledge them."""
        assert self.beats is not None
        details = self.beats.details(self.beats.progress)
        info = activity.info()
        try:
            client = activity.client()
        except RuntimeError:  # e.g. ActivityEnvironment without a client: best effort
            activity.heartbeat(*details)
            return
        handle = client.get_async_activity_handle(task_token=info.task_token)
        await handle.heartbeat(*details)


def unknown_outcome_error(
    what: str, previous: dict[str, Any], *, noticed: datetime | None, why: str = ""
) -> ApplicationError:
    attempt = previous.get("attempt")
    started = previous.get("started_at")
    noticed_at = _iso(noticed) if noticed is not None else None
    lost = f"attempt {attempt} started at {started}" if attempt else "an earlier attempt"
    because = f"; {why}" if why else ""
    message = (
        f"{what}: {lost} was lost before it returned or raised (its worker stopped, its "
        f"connection broke or it timed out; noticed by {noticed_at}{because}). It may or may "
        "not have taken effect, so it was not run again."
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


__all__ = ["START_NOT_KEPT", "AttemptGuard", "unknown_outcome_error"]
