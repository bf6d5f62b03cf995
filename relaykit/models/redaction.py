"""Credentials out of every message that may reach Temporal history.

:func:`redacted_error` is the single exit of :func:`relaykit.models.providers.call_model`: every
error, whichever path built it, passes through it before Temporal records it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any
from urllib.parse import quote

from temporalio.exceptions import ApplicationError

from relaykit.errors import (
    MODEL_CALL_FAILED,
)
from relaykit.models.endpoints import Endpoint

MAX_PROVIDER_MESSAGE = 500

REDACTED = "[redacted]"

# Credentials that look like credentials, even when relaykit does not know them (a proxy's own
# key, a key echoed by a server from another header): bearer tokens and key-like assignments.
_CREDENTIAL_PATTERNS = (
    re.compile(r"(?i)\b(bearer|basic)(\s+)[A-Za-z0-9._~+/=-]{8,}"),
    re.compile(
        r"(?i)(\b(?:x-api-key|api[-_]?key|authorization|access[-_]?token|secret)\b[\"']?\s*[:=]\s*[\"']?)"
        r"(?!bearer\b|basic\b)[A-Za-z0-9._~+/=-]{8,}"
    ),
)


def _variants(secret: str) -> set[str]:
    """The forms a secret takes when a server echoes it inside JSON or a URL."""
    return {secret, json.dumps(secret)[1:-1], quote(secret, safe="")}


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """Remove credentials from text that came from outside the worker.

    Every message relaykit builds from a provider's response (error bodies, non-JSON bodies, SSE
    events, parser exceptions, transport errors) passes through here before it can become an
    exception, a log line or a Temporal failure, where it would be stored in history forever.
    Known secrets are removed in their raw, JSON-escaped and URL-encoded forms; anything that
    looks like a bearer token or an ``api_key=…`` assignment is removed too.
    """
    for secret in secrets:
        if secret and len(secret) >= 4:
            for form in sorted(_variants(secret), key=len, reverse=True):
                text = text.replace(form, REDACTED)
    text = _CREDENTIAL_PATTERNS[0].sub(lambda m: f"{m.group(1)}{m.group(2)}{REDACTED}", text)
    return _CREDENTIAL_PATTERNS[1].sub(lambda m: f"{m.group(1)}{REDACTED}", text)


def redact_secret(text: str, secret: str | None) -> str:
    return redact(text, (secret,))


def _redact_value(value: Any, secrets: tuple[str | None, ...]) -> Any:
    if isinstance(value, str):
        return redact(value, secrets)
    if isinstance(value, dict):
        return {k: _redact_value(v, secrets) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_redact_value(v, secrets) for v in value]
    return value


def redacted_error(exc: BaseException, endpoint: Endpoint) -> ApplicationError:
    """``exc`` as an :class:`ApplicationError` with no credential in its message or details.

    The one exit of :func:`call_model`: whatever path built the error, this is the last thing it
    passes before Temporal records it. Errors that are not ``ApplicationError`` (a bug or an
    unexpected library exception) keep Temporal's retries but lose their traceback context.
    """
    secrets = endpoint.secrets
    if isinstance(exc, ApplicationError):
        return ApplicationError(
            redact(exc.message, secrets),
            *(_redact_value(d, secrets) for d in exc.details),
            type=exc.type,
            non_retryable=exc.non_retryable,
            next_retry_delay=exc.next_retry_delay,
        )
    return ApplicationError(
        f"calling {endpoint.provider} failed unexpectedly: "
        f"{type(exc).__name__}: {shorten(redact(str(exc), secrets))}",
        {"provider": endpoint.provider},
        type=MODEL_CALL_FAILED,
        non_retryable=False,
    )


def shorten(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > MAX_PROVIDER_MESSAGE:
        return text[: MAX_PROVIDER_MESSAGE - 3] + "..."
    return text
