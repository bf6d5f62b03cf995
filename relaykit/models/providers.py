"""Calling a model over HTTP, from inside the model activity.

Two things are decided here and nowhere else:

- **Where requests go and with which key.** Endpoints and keys come from the environment of the
  worker that runs the activity, never from workflow data: a :class:`ModelSpec` is stored in
  Temporal history, so it may name an environment variable but never hold a key.
- **What a failure means to Temporal.** Every provider's failures become an
  :class:`~temporalio.exceptions.ApplicationError` through :func:`classify_error`, so retries
  behave the same whichever model an agent uses: overload, rate limits and network trouble are
  retried (honouring the server's ``retry-after``), while a bad key, a bad request or a transcript
  too long for the model stop the run with a message that says what to fix.

Error types (``ApplicationError.type``, from :mod:`relaykit.errors`):

============================  =============  ===============================================
type                          retried        when
============================  =============  ===============================================
``ModelCallFailed``           yes            connection refused/reset, timeout, cut stream
``ModelHTTPError``            yes            408, 409, 429, 5xx (incl. 529), x-should-retry
``ModelHTTPError``            no             other 4xx (401, 403, 404, 400, 413, 422, ...)
``ContextWindowExceeded``     no             the prompt does not fit the model's context
``ModelCallFailed``           no             unreadable body, bad endpoint configuration
``PayloadTooLarge``           no             the answer is too large for Temporal history
============================  =============  ===============================================
"""

from __future__ import annotations

import asyncio
import json
import math
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from email.utils import parsedate_to_datetime
from typing import Any, Protocol, TypeVar
from urllib.parse import quote, urlsplit

import httpx
from temporalio.exceptions import ApplicationError

from relaykit.errors import (
    CONTEXT_WINDOW_EXCEEDED,
    MODEL_CALL_FAILED,
    MODEL_HTTP_ERROR,
    PAYLOAD_TOO_LARGE,
)
from relaykit.messages import ModelResponse
from relaykit.models import anthropic as anthropic_format
from relaykit.models import openai as openai_format
from relaykit.models.spec import ModelRequest, ModelSpec

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
#: Set by the worker when it runs the bundled local model server.
LOCAL_BASE_URL_ENV = "RELAYKIT_LOCAL_BASE_URL"

#: The longest wait relaykit accepts from a ``retry-after`` header; past that, the activity's
#: retry policy decides, so one header cannot park a run for hours.
MAX_RETRY_DELAY = timedelta(seconds=60)
#: Temporal refuses payloads over 2 MiB; the response also travels inside a larger activity
#: completion, so the answer itself must stay well below.
MAX_RESPONSE_BYTES = 1536 * 1024
#: While a non-streaming request is in flight, the activity heartbeats this often (the SDK
#: throttles what it sends to the server, so a short interval costs nothing).
HEARTBEAT_INTERVAL_SECONDS = 1.0

_RETRYABLE_STATUSES = frozenset({408, 409, 429})
_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})
_MAX_PROVIDER_MESSAGE = 500

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


# --------------------------------------------------------------------------------------------
# Endpoints
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where one model call goes. Built in the worker; never stored in history."""

    provider: str
    url: str
    headers: dict[str, str] = field(repr=False)
    key_env: str | None = None
    """Name of the variable the key came from (or should have), for error hints."""
    secret: str | None = field(default=None, repr=False)
    """Kept only to scrub it from any error text."""

    @property
    def secrets(self) -> tuple[str | None, ...]:
        """Everything to scrub from error text: the key and the credential headers built from it."""
        sent = (v for k, v in self.headers.items() if k.lower() in _CREDENTIAL_HEADERS)
        return (self.secret, *sent)

    @property
    def compatible(self) -> bool:
        """Whether the endpoint speaks OpenAI chat completions."""
        return self.provider != "anthropic"


def _config_error(message: str, hint: str) -> ApplicationError:
    return ApplicationError(f"{message} — {hint}", type=MODEL_CALL_FAILED, non_retryable=True)


def _chat_completions_url(base: str) -> str:
    """A bare host (``http://127.0.0.1:8080``) gets ``/v1``, since that is where every
    OpenAI-compatible server mounts its API; any other path is kept as the user wrote it."""
    base = base.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if urlsplit(base).path in ("", "/"):
        base += "/v1"
    return base + "/chat/completions"


def _messages_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/v1/messages"):
        return base
    if base.endswith("/v1"):
        return base + "/messages"
    return base + "/v1/messages"


def _key(
    spec: ModelSpec, default_env: str | None, env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The key and the name of its variable. A variable the spec names explicitly must be set:
    naming it says a key is needed, and failing here beats a 401 from the server."""
    if spec.api_key_env:
        value = env.get(spec.api_key_env) or None
        if value is None:
            raise _config_error(
                f"{spec.api_key_env} is not set on the worker",
                f"model {spec.label!r} reads its API key from {spec.api_key_env}; set it in the "
                "environment of the worker that runs model activities",
            )
        return value, spec.api_key_env
    if default_env is None:
        return None, None
    return env.get(default_env) or None, default_env


def resolve_endpoint(spec: ModelSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """The URL and headers for ``spec``, from the worker's environment (``os.environ`` unless
    ``env`` is given)."""
    env = os.environ if env is None else env
    if spec.provider == "anthropic":
        return _anthropic_endpoint(spec, env)
    return _compatible_endpoint(spec, env)


def _anthropic_endpoint(spec: ModelSpec, env: Mapping[str, str]) -> Endpoint:
    base = spec.base_url or env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_BASE_URL
    key, key_env = _key(spec, "ANTHROPIC_API_KEY", env)
    if key is None and base.rstrip("/") == ANTHROPIC_DEFAULT_BASE_URL:
        raise _config_error(
            f"{key_env} is not set on the worker",
            f"model {spec.label!r} needs an Anthropic API key in the environment of the "
            "worker that runs model activities",
        )
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if key is not None:
        headers["x-api-key"] = key
    return Endpoint("anthropic", _messages_url(base), headers, key_env, key)


def _compatible_endpoint(spec: ModelSpec, env: Mapping[str, str]) -> Endpoint:
    if spec.provider == "local":
        local = spec.base_url or env.get(LOCAL_BASE_URL_ENV)
        if not local:
            raise _config_error(
                f"the local model server is not running ({LOCAL_BASE_URL_ENV} is not set on "
                f"the worker), so model {spec.label!r} cannot be called",
                "start the worker with its local model server enabled, or point "
                f"{LOCAL_BASE_URL_ENV} at an OpenAI-compatible server",
            )
        base = local
        key, key_env = _key(spec, None, env)
    else:
        base = spec.base_url or env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL
        key, key_env = _key(spec, "OPENAI_API_KEY", env)
        if key is None and urlsplit(base).hostname == "api.openai.com":
            raise _config_error(
                f"{key_env} is not set on the worker",
                f"model {spec.label!r} needs an OpenAI API key in the environment of the worker "
                "that runs model activities (or set OPENAI_BASE_URL for a local server)",
            )
    headers: dict[str, str] = {}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return Endpoint(spec.provider, _chat_completions_url(base), headers, key_env, key)


# --------------------------------------------------------------------------------------------
# Error classification
# --------------------------------------------------------------------------------------------


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


def _redact(text: str, secret: str | None) -> str:
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
        f"{type(exc).__name__}: {_short(redact(str(exc), secrets))}",
        {"provider": endpoint.provider},
        type=MODEL_CALL_FAILED,
        non_retryable=False,
    )


def _short(text: str) -> str:
    text = " ".join(text.split())
    if len(text) > _MAX_PROVIDER_MESSAGE:
        return text[: _MAX_PROVIDER_MESSAGE - 3] + "..."
    return text


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
    text = _short(_redact(message, secret))
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


def _payload_error(endpoint: Endpoint, payload: dict[str, Any], model: str) -> ApplicationError:
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


def _is_error_payload(payload: Any) -> bool:
    if not isinstance(payload, dict) or not payload.get("error"):
        return False
    return payload.get("type") == "error" or "choices" not in payload


def _unreadable(endpoint: Endpoint, what: str) -> ApplicationError:
    return ApplicationError(
        f"{endpoint.provider} at {endpoint.url} returned {what} — check that the base URL points "
        "at an API of this provider (not a web page or a proxy error)",
        type=MODEL_CALL_FAILED,
        non_retryable=True,
    )


# --------------------------------------------------------------------------------------------
# Calling
# --------------------------------------------------------------------------------------------


class _Accumulator(Protocol):
    @property
    def complete(self) -> bool: ...

    def feed(self, event: Any) -> str | None: ...

    def final_delta(self) -> str | None: ...

    def result(self) -> ModelResponse: ...


_PARSE_ERRORS = (ValueError, KeyError, TypeError, IndexError, AttributeError)


def _build(request: ModelRequest, endpoint: Endpoint) -> dict[str, Any]:
    if not endpoint.compatible:
        return anthropic_format.build_request(request)
    official = urlsplit(endpoint.url).hostname == "api.openai.com"
    return openai_format.build_request(
        request, max_tokens_field="max_completion_tokens" if official else "max_tokens"
    )


def _parse(request: ModelRequest, endpoint: Endpoint, data: Any) -> ModelResponse:
    if _is_error_payload(data):
        raise _payload_error(endpoint, data, request.model.name)
    try:
        if endpoint.compatible:
            return openai_format.parse_response(data, request)
        return anthropic_format.parse_response(data, request)
    except _PARSE_ERRORS as exc:
        raise _unreadable(endpoint, f"a JSON body relaykit cannot read ({exc})") from None


def _json_body(endpoint: Endpoint, response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        ctype = response.headers.get("content-type", "no content type")
        text = _short(response.text) or "an empty body"
        raise _unreadable(endpoint, f"a body that is not JSON ({ctype}): {text}") from None


def _raise_for_status(request: ModelRequest, endpoint: Endpoint, response: httpx.Response) -> None:
    if not 200 <= response.status_code < 300:
        raise classify_http_error(
            endpoint.provider,
            response,
            key_env=endpoint.key_env,
            secret=endpoint.secret,
            model=request.model.name,
        )


T = TypeVar("T")


async def _heartbeating(work: Awaitable[T], heartbeat: Callable[[], None] | None) -> T:
    """Keep the activity's heartbeat going while a long non-streaming answer is generated, so a
    heartbeat timeout only fires when the worker itself is gone."""
    if heartbeat is None:
        return await work
    loop = asyncio.get_running_loop()
    timer: asyncio.TimerHandle | None = None

    def beat() -> None:
        nonlocal timer
        heartbeat()
        timer = loop.call_later(HEARTBEAT_INTERVAL_SECONDS, beat)

    timer = loop.call_later(HEARTBEAT_INTERVAL_SECONDS, beat)
    try:
        return await work
    finally:
        timer.cancel()


async def _sse_data(lines: AsyncIterator[str]) -> AsyncIterator[str]:
    """The ``data`` of each server-sent event. Event names are ignored: both providers repeat
    the kind of event inside its JSON."""
    data: list[str] = []
    async for line in lines:
        if not line:
            if data:
                yield "\n".join(data)
                data = []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        if name == "data":
            data.append(value.removeprefix(" "))
    if data:
        yield "\n".join(data)


async def _call_once(
    request: ModelRequest,
    endpoint: Endpoint,
    body: dict[str, Any],
    http: httpx.AsyncClient,
    heartbeat: Callable[[], None] | None,
) -> ModelResponse:
    response = await _heartbeating(
        http.post(
            endpoint.url,
            json=body,
            headers=endpoint.headers,
            timeout=httpx.Timeout(request.model.timeout_seconds),
        ),
        heartbeat,
    )
    _raise_for_status(request, endpoint, response)
    return _parse(request, endpoint, _json_body(endpoint, response))


async def _call_streaming(
    request: ModelRequest,
    endpoint: Endpoint,
    body: dict[str, Any],
    http: httpx.AsyncClient,
    on_delta: Callable[[str], None] | None,
    heartbeat: Callable[[], None] | None,
) -> ModelResponse:
    acc: _Accumulator = (
        openai_format.StreamAccumulator(request)
        if endpoint.compatible
        else anthropic_format.StreamAccumulator(request)
    )
    saw_done = False
    headers = endpoint.headers
    if request.model.provider == "local":
        # llama.cpp's server sometimes drops a kept-alive connection after a streamed answer,
        # failing the next request on it: do not reuse streaming connections there.
        headers = {**headers, "connection": "close"}
    async with http.stream(
        "POST",
        endpoint.url,
        json=body,
        headers=headers,
        timeout=httpx.Timeout(request.model.timeout_seconds),
    ) as response:
        if not 200 <= response.status_code < 300:
            await response.aread()
            _raise_for_status(request, endpoint, response)
        if response.headers.get("content-type", "").startswith("application/json"):
            # The server ignored ``stream: true`` and answered in one piece.
            await response.aread()
            result = _parse(request, endpoint, _json_body(endpoint, response))
            if on_delta is not None and result.message.content and not result.message.tool_calls:
                on_delta(result.message.content)
            return result
        async for data in _sse_data(response.aiter_lines()):
            if heartbeat is not None:
                heartbeat()
            if data.strip() == "[DONE]":
                saw_done = True
                break
            try:
                payload = json.loads(data)
            except ValueError:
                raise _unreadable(
                    endpoint, f"a stream event that is not JSON: {_short(data)}"
                ) from None
            if _is_error_payload(payload):
                raise _payload_error(endpoint, payload, request.model.name)
            try:
                piece = acc.feed(payload)
            except _PARSE_ERRORS as exc:
                raise _unreadable(
                    endpoint, f"a stream event relaykit cannot read ({exc})"
                ) from None
            if piece and on_delta is not None:
                on_delta(piece)
    if not (saw_done or acc.complete):
        raise ApplicationError(
            f"the {endpoint.provider} stream ended before the answer was complete",
            {"provider": endpoint.provider},
            type=MODEL_CALL_FAILED,
            non_retryable=False,
        )
    try:
        result = acc.result()
        final = acc.final_delta()
    except _PARSE_ERRORS as exc:
        raise _unreadable(endpoint, f"a stream relaykit cannot reassemble ({exc})") from None
    if final and on_delta is not None:
        on_delta(final)
    return result


def check_payload_size(response: ModelResponse) -> None:
    """Fail before Temporal does: an oversized activity result fails the workflow task with an
    error far from its cause, and retrying would only produce another huge answer."""
    size = len(response.model_dump_json().encode())
    if size > MAX_RESPONSE_BYTES:
        raise ApplicationError(
            f"the model's answer is {size} bytes once serialised, more than the "
            f"{MAX_RESPONSE_BYTES} bytes a Temporal payload can safely carry — lower "
            "ModelSettings.max_tokens or ask the model for a shorter answer",
            {"size": size, "limit": MAX_RESPONSE_BYTES},
            type=PAYLOAD_TOO_LARGE,
            non_retryable=True,
        )


async def call_model(
    request: ModelRequest,
    *,
    http: httpx.AsyncClient,
    on_delta: Callable[[str], None] | None = None,
    heartbeat: Callable[[], None] | None = None,
) -> ModelResponse:
    """Make one model call for the model activity.

    ``on_delta`` receives each piece of text as the model writes it (only when
    ``ModelSpec.stream`` is set; in constrained tool-call mode the reply arrives as one piece at
    the end, since until then it may still turn out to be a tool call). ``heartbeat`` is called
    for every stream event, and every few seconds while a non-streaming call waits.

    Every failure is raised as an :class:`ApplicationError` whose ``type`` and ``non_retryable``
    tell Temporal whether to retry (see the module docstring).
    """
    endpoint = resolve_endpoint(request.model)
    body = _build(request, endpoint)
    try:
        result = await _call(request, endpoint, body, http, on_delta, heartbeat)
    except Exception as exc:  # noqa: BLE001 - one redaction for every way a call can fail
        raise redacted_error(exc, endpoint) from None
    check_payload_size(result)
    return result


async def _call(
    request: ModelRequest,
    endpoint: Endpoint,
    body: dict[str, Any],
    http: httpx.AsyncClient,
    on_delta: Callable[[str], None] | None,
    heartbeat: Callable[[], None] | None,
) -> ModelResponse:
    try:
        if request.model.stream:
            result = await _call_streaming(request, endpoint, body, http, on_delta, heartbeat)
        else:
            result = await _call_once(request, endpoint, body, http, heartbeat)
    except httpx.TimeoutException as exc:
        raise ApplicationError(
            f"{endpoint.provider} at {endpoint.url} did not answer within "
            f"{request.model.timeout_seconds:g}s ({type(exc).__name__})",
            {"provider": endpoint.provider},
            type=MODEL_CALL_FAILED,
            non_retryable=False,
        ) from None
    except httpx.UnsupportedProtocol as exc:
        raise _config_error(
            f"cannot call {endpoint.provider} at {endpoint.url}: {_redact(str(exc), endpoint.secret)}",
            "the base URL must start with http:// or https://",
        ) from None
    except httpx.TransportError as exc:
        reason = _redact(str(exc), endpoint.secret) or type(exc).__name__
        raise ApplicationError(
            f"could not reach {endpoint.provider} at {endpoint.url}: {reason}",
            {"provider": endpoint.provider},
            type=MODEL_CALL_FAILED,
            non_retryable=False,
        ) from None
    except (httpx.InvalidURL, httpx.RequestError) as exc:
        raise _config_error(
            f"cannot call {endpoint.provider} at {endpoint.url}: {_redact(str(exc), endpoint.secret)}",
            "check the base URL configured for this model",
        ) from None
    return result
