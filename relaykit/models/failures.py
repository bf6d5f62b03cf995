"""What a provider's failure means to Temporal: retried or not, and with which error type
(the table is in :mod:`relaykit.models.providers`)."""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from temporalio.exceptions import ApplicationError

from relaykit.errors import (
    CONTEXT_WINDOW_EXCEEDED,
    MODEL_CALL_FAILED,
    MODEL_HTTP_ERROR,
)
from relaykit.models.endpoints import Endpoint
from relaykit.models.redaction import redact_secret, shorten

#: The longest wait relaykit accepts from a ``retry-after`` header; past that, the activity's
#: retry policy decides, so one header cannot park a run for hours.
MAX_RETRY_DELAY = timedelta(seconds=60)

_RETRYABLE_STATUSES = frozenset({408, 409, 429})

_CONTEXT_MARKERS = frozenset(
    {"context_length_exceeded", "exceed_context_size_error", "string_above_max_length"}
)
_CONTEXT_PHRASES = (
    "maximum context length",
    "context length",
    "context window",
    "context size",
    "prompt is too long",
    "too many tokens in the prompt",
    "input is too long",
)
_CONTEXT_HINT = (
    "the transcript no longer fits the model's context window: return shorter tool results, "
    "start a run with less history, or use a model with a larger context"
)

#: Error ``type`` values of Anthropic's error bodies (also sent inside a stream) as statuses.
_ANTHROPIC_ERROR_STATUS = {
    "invalid_request_error": 400,
    "authentication_error": 401,
    "permission_error": 403,
    "not_found_error": 404,
    "request_too_large": 413,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
    "overloaded_error": 529,
}


def error_fields(data: Any) -> tuple[str, set[str]]:
    """The human message and the machine codes of an error body, in any of the shapes servers
    use (OpenAI/Anthropic ``error`` objects, a bare ``error`` string, FastAPI ``detail``)."""
    markers: set[str] = set()
    if isinstance(data, dict):
        err = data.get("error")
        if isinstance(err, dict):
            for k in ("code", "type"):
                if err.get(k) is not None:
                    markers.add(str(err[k]))
            message = err.get("message")
            return (str(message) if message else json.dumps(err)), markers
        if isinstance(err, str) and err:
            return err, markers
        detail = data.get("detail")
        if detail:
            return (detail if isinstance(detail, str) else json.dumps(detail)), markers
        if isinstance(data.get("message"), str):
            return data["message"], markers
    return json.dumps(data), markers


def _is_context_overflow(message: str, markers: set[str]) -> bool:
    if markers & _CONTEXT_MARKERS:
        return True
    low = message.lower()
    return any(p in low for p in _CONTEXT_PHRASES)


def retry_delay(headers: Mapping[str, str]) -> timedelta | None:
    """The wait a server asked for, from ``retry-after-ms`` or ``retry-after`` (seconds or an
    HTTP date), capped at :data:`MAX_RETRY_DELAY`; ``None`` leaves it to the retry policy."""
    seconds: float | None = None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            seconds = float(raw_ms) / 1000.0
        except ValueError:
            seconds = None
    raw = headers.get("retry-after")
    if seconds is None and raw:
        try:
            seconds = float(raw)
        except ValueError:
            try:
                when = parsedate_to_datetime(raw)
            except (TypeError, ValueError, IndexError):
                when = None
            if when is not None:
                if when.tzinfo is None:
                    when = when.replace(tzinfo=UTC)
                seconds = (when - datetime.now(UTC)).total_seconds()
    if seconds is None or not math.isfinite(seconds) or seconds <= 0:
        return None
    return min(timedelta(seconds=seconds), MAX_RETRY_DELAY)


def _hint(status: int, provider: str, key_env: str | None, model: str | None) -> str | None:
    if status in (401, 403):
        if key_env:
            return f"check {key_env} on the worker"
        return "check the API key and the base URL configured on the worker"
    if status == 404:
        name = f"{model!r}" if model else "the model name"
        return f"check the model name {name} and the base URL"
    if status == 413:
        return "the request is too large for the server: return shorter tool results"
    if status in (400, 422):
        return "the server rejected the request: check the model settings and tool schemas"
    return None


def classify_error(
    provider: str,
    status: int,
    message: str,
    *,
    markers: set[str] | None = None,
    headers: Mapping[str, str] | None = None,
    key_env: str | None = None,
    secret: str | None = None,
    model: str | None = None,
    where: str | None = None,
) -> ApplicationError:
    """The retry decision for a failed call, the same for every provider.

    ``x-should-retry`` overrides the status (the server knows best whether a retry can succeed),
    except for a context-window overflow, which the same request can never get past.
    """
    markers = markers or set()
    headers = headers or {}
    text = shorten(redact_secret(message, secret))
    where = where or f"{status} from {provider}"
    details = {"provider": provider, "status": status}

    if (
        400 <= status < 500
        and status not in _RETRYABLE_STATUSES
        and _is_context_overflow(text, markers)
    ):
        return ApplicationError(
            f"{where}: {text} — {_CONTEXT_HINT}",
            details,
            type=CONTEXT_WINDOW_EXCEEDED,
            non_retryable=True,
        )

    retryable = status in _RETRYABLE_STATUSES or status >= 500
    forced = (headers.get("x-should-retry") or "").strip().lower()
    if forced == "true":
        retryable = True
    elif forced == "false":
        retryable = False

    if retryable:
        return ApplicationError(
            f"{where}: {text}",
            details,
            type=MODEL_HTTP_ERROR,
            non_retryable=False,
            next_retry_delay=retry_delay(headers),
        )
    hint = _hint(status, provider, key_env, model)
    return ApplicationError(
        f"{where}: {text} — {hint}" if hint else f"{where}: {text}",
        details,
        type=MODEL_HTTP_ERROR,
        non_retryable=True,
    )


def classify_http_error(
    provider: str,
    response: httpx.Response,
    *,
    key_env: str | None = None,
    secret: str | None = None,
    model: str | None = None,
) -> ApplicationError:
    """The :func:`classify_error` of an error response (its body must have been read)."""
    try:
        body = response.text
    except httpx.ResponseNotRead:
        body = ""
    markers: set[str] = set()
    try:
        message, markers = error_fields(json.loads(body))
    except ValueError:
        message = body.strip() or response.reason_phrase or "no error message"
    return classify_error(
        provider,
        response.status_code,
        message,
        markers=markers,
        headers=response.headers,
        key_env=key_env,
        secret=secret,
        model=model,
    )


def payload_error(endpoint: Endpoint, payload: dict[str, Any], model: str) -> ApplicationError:
    """An error object sent with a success status, typically in the middle of a stream: the
    status is inferred from the error's own code or type."""
    message, markers = error_fields(payload)
    status = 500
    for m in markers:
        if m in _ANTHROPIC_ERROR_STATUS:
            status = _ANTHROPIC_ERROR_STATUS[m]
        elif m.isdigit() and 400 <= int(m) < 600:
            status = int(m)
    if status >= 500 and _is_context_overflow(message, markers):
        status = 400
    return classify_error(
        endpoint.provider,
        status,
        message,
        markers=markers,
        key_env=endpoint.key_env,
        secret=endpoint.secret,
        model=model,
        where=f"{endpoint.provider} reported an error ({', '.join(sorted(markers)) or status})",
    )


def is_error_payload(payload: Any) -> bool:
    if not isinstance(payload, dict) or not payload.get("error"):
        return False
    return payload.get("type") == "error" or "choices" not in payload


def unreadable(endpoint: Endpoint, what: str) -> ApplicationError:
    return ApplicationError(
        f"{endpoint.provider} at {endpoint.url} returned {what} — check that the base URL points "
        "at an API of this provider (not a web page or a proxy error)",
        type=MODEL_CALL_FAILED,
        non_retryable=True,
    )
