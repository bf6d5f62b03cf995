"""Unknown outcomes, the workflow side: a ``"write"`` call lost in flight is a fact the model or a
person decides on, never a silent retry.

A tool call's outcome is *unknown* when an attempt started the tool and then neither returned nor
raised: its worker died, or it hit its heartbeat or start-to-close timeout. The activity side
(:mod:`relaykit.activities.attempts`) refuses to run a ``"write"`` tool again after such an
attempt and fails with ``ToolOutcomeUnknown``; when the *last* attempt is the lost one, the
workflow sees a timeout failure whose heartbeat details say the attempt had started. Both end
here:

- ``on_unknown="report"``: the model reads an error result saying the outcome is unknown (it may
  or may not have taken effect) and when the attempt was lost;
- ``on_unknown="ask"``: the call waits for a person like an approval, under the id
  ``<call id>.rerun`` (``relaykit pending`` lists it with the reason); an approval runs it again
  as a new activity (``rerun_approved`` in its input, the same idempotency key), a rejection is
  an error result.

Invariants:
- The decision is recorded once per run: :data:`PATCH_TOOL_EFFECTS` is consulted at the run's
  first workflow task and kept in ``RunSetup.tool_effects``, which a continue-as-new carries.
  Runs recorded without its marker schedule calls without an effect, so their attempts record
  nothing and they replay (and go on, to their end) exactly as before.
- The effect and the policy travel in the activity input, so a replay follows what was scheduled,
  not today's tool definition.
- The idempotency key is computed here from recorded data only (the workflow run id, the turn,
  the call's position and id): the same for every attempt and replay of a call, different for
  every other call, including after a continue-as-new (a new run id) or in a fork.

Entry points (one call site each): :func:`recorded_setup` when the run records its setup
(kept in :mod:`relaykit.workflows.semantics` with the other choices recorded once per run),
:func:`invocation_fields` when a call's activity input is built, :func:`run_guarded` around the
activity.
"""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from temporalio import workflow
from temporalio.exceptions import ActivityError, ApplicationError, TimeoutError, TimeoutType

from relaykit import errors
from relaykit.agent import Agent
from relaykit.messages import ToolCall
from relaykit.tools import ToolOutcome, split_claim
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.run_state import Run
from relaykit.workflows.semantics import PATCH_TOOL_EFFECTS
from relaykit.workflows.semantics import recorded_tool_effects as recorded_setup

RERUN_SUFFIX = ".rerun"
"""Appended to a call's id for the approval that decides whether it runs again."""

Request = TypeVar("Request")


def idempotency_key(run: Run, call: ToolCall) -> str:
    """The call's key (see :attr:`relaykit.ToolContext.idempotency_key`)."""
    position = _position(run, call)
    source = f"{workflow.info().run_id}/{run.state.turn}/{position}/{call.id}"
    return "rk-" + hashlib.sha256(source.encode("utf-8")).hexdigest()[:40]


def _position(run: Run, call: ToolCall) -> int:
    """Where the call stands in the assistant message of this turn (recorded in the transcript)."""
    for message in reversed(run.state.transcript):
        if message.role == "assistant" and message.tool_calls:
            for index, candidate in enumerate(message.tool_calls):
                if candidate.id == call.id:
                    return index
            break
    return -1


def invocation_fields(run: Run, call: ToolCall, effect: str, on_unknown: str) -> dict[str, Any]:
    """The fields a call's activity input carries for effects: its idempotency key, and its
    effect and unknown-outcome choice when this run records effects (``effect=None``
    otherwise: attempts then record nothing). What :func:`run_guarded` later decides follows
    these recorded values, not a tool definition changed since."""
    if not run.setup_flag("tool_effects"):
        return {"idempotency_key": idempotency_key(run, call)}
    return {
        "idempotency_key": idempotency_key(run, call),
        "effect": effect,
        "on_unknown": on_unknown,
    }


def summary(text: str, request: Any) -> str:
    """The Temporal UI summary of a call's activity; a run-again says why it runs."""
    if getattr(request, "rerun_approved", False):
        return f"{text} · run again: approved after an unknown outcome"
    return text


async def run_guarded(
    run: Run,
    approvals: Approvals,
    agent: Agent,
    entry: Any,
    call: ToolCall,
    request: Request,
    execute: Callable[[Request], Awaitable[ToolOutcome]],
    *,
    what: str,
    asked: int = 0,
) -> ToolOutcome:
    """``execute(request)``, turning an unknown outcome of a ``"write"`` call into the result the
    model reads. Any other failure propagates to the caller's own handling, as before.

    ``entry`` is what an ask lists (a :class:`~relaykit.Tool` or an MCP tool entry: ``name`` and
    ``approval_timeout``); ``what`` names the call in texts (``tool 'issue_refund'``)."""
    try:
        return await execute(request)
    except ActivityError as exc:
        lost = lost_attempt(exc) if getattr(request, "effect", None) == "write" else None
        if lost is None:
            raise
    on_unknown = getattr(request, "on_unknown", "report")
    run.emit(
        "tool_outcome_unknown",
        {
            "call_id": call.id,
            "name": call.name,
            "attempt": lost.get("attempt"),
            "started_at": lost.get("started_at"),
            "noticed_at": lost.get("noticed_at"),
            "on_unknown": on_unknown,
        },
    )
    told = unknown_text(what, lost)
    if on_unknown != "ask":
        return ToolOutcome(
            content=f"{told} It was not run again: check whether it took effect before you call "
            "it again.",
            is_error=True,
        )
    ask = call.model_copy(update={"id": f"{call.id}{RERUN_SUFFIX}{asked + 1 if asked else ''}"})
    decision = await approvals.ask(  # the approval path, under the rerun's own id
        agent, entry, ask, reason=f"outcome unknown: {told} Approve to run it again."
    )
    if decision.approved:
        again = request.model_copy(update={"rerun_approved": True})  # type: ignore[attr-defined]
        return await run_guarded(
            run,
            approvals,
            agent,
            entry,
            call,
            again,
            execute,
            what=what,
            asked=asked + 1,
        )
    if decision.timed_out:
        why = "nobody decided in time whether to run it again (approval timed out)"
    elif decision.reason:
        why = f"a person decided not to run it again: {decision.reason}"
    else:
        why = "a person decided not to run it again"
    return ToolOutcome(content=f"{told} It was not run again: {why}.", is_error=True)


def lost_attempt(exc: ActivityError) -> dict[str, Any] | None:
    """What is known of the lost attempt when ``exc`` says the call's outcome is unknown."""
    cause = exc.cause
    if isinstance(cause, ApplicationError) and cause.type == errors.TOOL_OUTCOME_UNKNOWN:
        details = cause.details[0] if cause.details and isinstance(cause.details[0], dict) else {}
        return dict(details)
    if isinstance(cause, TimeoutError) and cause.type in (
        TimeoutType.START_TO_CLOSE,
        TimeoutType.HEARTBEAT,
    ):
        # The last attempt timed out. It recorded a claim before running the tool; a claim that
        # says "raised" belongs to an earlier attempt, so this one never started the tool.
        claim = split_claim(cause.last_heartbeat_details)[1]
        if claim is not None and claim.get("state") != "started":
            return None
        claim = claim or {}
        return {
            "attempt": claim.get("attempt"),
            "started_at": claim.get("started_at"),
            "noticed_at": _iso_now(),
        }
    return None


def unknown_text(what: str, lost: dict[str, Any]) -> str:
    attempt = lost.get("attempt")
    started = lost.get("started_at")
    noticed = lost.get("noticed_at")
    when = f"attempt {attempt} started at {started}" if attempt else "an attempt started"
    by = f"; noticed at {noticed}" if noticed else ""
    return (
        f"The call to {what} has an unknown outcome: {when} and was lost before it returned "
        f"(its worker stopped, its connection broke or it timed out{by}). It may or may not have "
        "taken effect."
    )


def _iso_now() -> str:
    return workflow.now().isoformat(timespec="seconds").replace("+00:00", "Z")


__all__ = [
    "PATCH_TOOL_EFFECTS",
    "idempotency_key",
    "invocation_fields",
    "lost_attempt",
    "recorded_setup",
    "run_guarded",
    "summary",
]
