"""Errors a relaykit user can meet, each with a hint on what to do.

Errors raised inside a workflow or an activity cross the Temporal boundary as
:class:`temporalio.exceptions.ApplicationError`; the ``type`` string of that error is the class
name below, so a client can tell a budget stop from a model failure without importing anything.
"""

from __future__ import annotations

from pydantic import ValidationError


class RelaykitError(Exception):
    """Base class of every relaykit error."""

    def __init__(self, message: str, *, hint: str | None = None) -> None:
        self.message = message
        self.hint = hint
        super().__init__(f"{message} (hint: {hint})" if hint else message)


class ConfigurationError(RelaykitError, ValueError):
    """Agents, tools or settings are defined in a way that cannot run (raised at definition time
    or when a worker starts, never in the middle of a run)."""


class RunFailed(RelaykitError):
    """A run ended without an answer; ``type`` is the Temporal error type (e.g.
    ``MaxTurnsExceeded``, ``BudgetExceeded``, ``ModelCallFailed``)."""

    def __init__(self, message: str, *, type: str | None = None, hint: str | None = None):
        self.type = type
        super().__init__(message, hint=hint)


class ApprovalNotWaiting(RelaykitError, ValueError):
    """An answer to a call that is not waiting for approval in that run (an unknown call id, or
    one answered already): nothing was sent."""


class TextTooLong(RelaykitError, ValueError):
    """A message, steer, resume text or approval reason too long to send to a run: nothing was
    sent (:data:`relaykit.client.MAX_TEXT_BYTES`)."""


MAX_DETAIL_CHARS = 1_000


def error_detail(exc: BaseException, limit: int = MAX_DETAIL_CHARS) -> str:
    """What is wrong with a value that did not decode, on one line and at most ``limit``
    characters: it goes into a run's failure, a report line or a terminal. pydantic's errors
    read ``field.path: message`` (the first ten, without their links); others ``Type: message``."""
    if isinstance(exc, ValidationError):
        detail = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'input'}: {err['msg']}"
            for err in exc.errors(include_url=False)[:10]
        )
    else:
        detail = f"{type(exc).__name__}: {exc}"
    detail = " ".join(detail.split())
    return detail if len(detail) <= limit else detail[: limit - 1] + "…"


# Error type names used in ApplicationError.type (stable: clients match on them).
MAX_TURNS_EXCEEDED = "MaxTurnsExceeded"
BUDGET_EXCEEDED = "BudgetExceeded"
UNPRICED_MODEL = "UnpricedModel"
"""A run with a dollar limit reaches a model without a known price (docs/budgets.md)."""
OUTPUT_VALIDATION_FAILED = "OutputValidationFailed"
MODEL_CALL_FAILED = "ModelCallFailed"
MODEL_HTTP_ERROR = "ModelHTTPError"
CONTEXT_WINDOW_EXCEEDED = "ContextWindowExceeded"
PAYLOAD_TOO_LARGE = "PayloadTooLarge"
UNKNOWN_AGENT = "UnknownAgent"
INVALID_RUN_INPUT = "InvalidRunInput"
RUN_CANCELLED = "RunCancelled"
HANDOFF_FILTER_FAILED = "HandoffFilterFailed"
"""A handoff's ``input_filter`` raised or returned something other than messages: a bug in
workflow code that every retry would repeat, so the run ends instead of its tasks failing."""
MCP_SERVER_UNAVAILABLE = "MCPServerUnavailable"
"""An MCP server could not list its tools (after its retries): the run cannot show them."""
TOOL_OUTCOME_UNKNOWN = "ToolOutcomeUnknown"
"""A ``"write"`` tool's attempt started and was lost (its worker died, or it timed out) without a
result or an error: it may or may not have taken effect, so relaykit does not run it again."""
