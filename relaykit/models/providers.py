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

The pieces live beside this module: :mod:`relaykit.models.endpoints` (where a request goes, with
which key), :mod:`relaykit.models.failures` (what a failure means to Temporal) and
:mod:`relaykit.models.redaction` (no credential in any message). This module sends the request
and reads the answer, whole or as a stream; its names are the ones the rest of relaykit uses.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

import httpx
import pydantic_core
from temporalio.exceptions import ApplicationError

from relaykit.errors import MODEL_CALL_FAILED, PAYLOAD_TOO_LARGE
from relaykit.messages import ModelResponse
from relaykit.models import anthropic as anthropic_format
from relaykit.models import openai as openai_format
from relaykit.models.endpoints import (
    ANTHROPIC_DEFAULT_BASE_URL,
    ANTHROPIC_VERSION,
    LOCAL_BASE_URL_ENV,
    OPENAI_DEFAULT_BASE_URL,
    Endpoint,
    config_error,
    resolve_endpoint,
)
from relaykit.models.failures import (
    MAX_RETRY_DELAY,
    classify_error,
    classify_http_error,
    error_fields,
    is_error_payload,
    payload_error,
    retry_delay,
    unreadable,
)
from relaykit.models.http_transport import post
from relaykit.models.redaction import REDACTED, redact, redact_secret, redacted_error, shorten
from relaykit.models.spec import ModelRequest

#: Temporal refuses payloads over 2 MiB; the response also travels inside a larger activity
#: completion, so the answer itself must stay well below.
MAX_RESPONSE_BYTES = 1536 * 1024
#: While a non-streaming request is in flight, the activity heartbeats this often (the SDK
#: throttles what it sends to the server, so a short interval costs nothing).
HEARTBEAT_INTERVAL_SECONDS = 1.0

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
    if is_error_payload(data):
        raise payload_error(endpoint, data, request.model.name)
    try:
        if endpoint.compatible:
            return openai_format.parse_response(data, request)
        return anthropic_format.parse_response(data, request)
    except _PARSE_ERRORS as exc:
        raise unreadable(endpoint, f"a JSON body relaykit cannot read ({exc})") from None


def _json_body(endpoint: Endpoint, response: httpx.Response) -> Any:
    try:
        return json.loads(response.content)
    except ValueError:
        ctype = response.headers.get("content-type", "no content type")
        text = shorten(response.text) or "an empty body"
        raise unreadable(endpoint, f"a body that is not JSON ({ctype}): {text}") from None


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


class _Heartbeats:
    """Calls ``heartbeat`` every :data:`HEARTBEAT_INTERVAL_SECONDS` until stopped.

    A timer, not a task: one model call in flight costs a scheduled callback, not a coroutine.
    The callback is a bound method, and ``stop`` cancels its timer, which drops the callback:
    nothing is left in a reference cycle. (A closure that rescheduled itself was one: after every
    model call it kept the attempt's activity context, and the heartbeat with it, until the
    garbage collector found them.)
    """

    __slots__ = ("_heartbeat", "_loop", "_timer")

    def __init__(self, heartbeat: Callable[[], None]) -> None:
        self._heartbeat = heartbeat
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(HEARTBEAT_INTERVAL_SECONDS, self._beat)

    def _beat(self) -> None:
        self._heartbeat()
        self._timer = self._loop.call_later(HEARTBEAT_INTERVAL_SECONDS, self._beat)

    def stop(self) -> None:
        self._timer.cancel()


async def _heartbeating(work: Awaitable[T], heartbeat: Callable[[], None] | None) -> T:
    """Keep the activity's heartbeat going while a long non-streaming answer is generated, so a
    heartbeat timeout only fires when the worker itself is gone."""
    if heartbeat is None:
        return await work
    beats = _Heartbeats(heartbeat)
    try:
        return await work
    finally:
        beats.stop()


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


_JSON_CONTENT = {"content-type": "application/json"}


def _encoded(body: dict[str, Any]) -> bytes:
    """The request body as compact UTF-8 JSON, as httpx's ``json=`` writes it, by pydantic's
    encoder: the body repeats the whole transcript every turn, and the standard library's
    encoder took three times as long over it (28 against 8 us for the 3 kB body of a tenth
    turn, 270 against 91 us for the 33 kB one of a hundredth)."""
    return pydantic_core.to_json(body)


async def _call_once(
    request: ModelRequest,
    endpoint: Endpoint,
    body: dict[str, Any],
    http: httpx.AsyncClient,
    heartbeat: Callable[[], None] | None,
) -> ModelResponse:
    answer = await _heartbeating(
        post(
            http,
            endpoint.url,
            _encoded(body),
            {**endpoint.headers, **_JSON_CONTENT},
            request.model.timeout_seconds,
        ),
        heartbeat,
    )
    if not 200 <= answer.status_code < 300:
        _raise_for_status(request, endpoint, answer.response())
    try:
        data = json.loads(answer.content)
    except ValueError:
        data = _json_body(endpoint, answer.response())  # raises, in the same words as streaming
    return _parse(request, endpoint, data)


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
    headers = {**endpoint.headers, **_JSON_CONTENT}
    if request.model.provider == "local":
        # llama.cpp's server sometimes drops a kept-alive connection after a streamed answer,
        # failing the next request on it: do not reuse streaming connections there.
        headers["connection"] = "close"
    async with http.stream(
        "POST",
        endpoint.url,
        content=_encoded(body),
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
                raise unreadable(
                    endpoint, f"a stream event that is not JSON: {shorten(data)}"
                ) from None
            if is_error_payload(payload):
                raise payload_error(endpoint, payload, request.model.name)
            try:
                piece = acc.feed(payload)
            except _PARSE_ERRORS as exc:
                raise unreadable(endpoint, f"a stream event relaykit cannot read ({exc})") from None
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
        raise unreadable(endpoint, f"a stream relaykit cannot reassemble ({exc})") from None
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
        reason = redact_secret(str(exc), endpoint.secret)
        raise config_error(
            f"cannot call {endpoint.provider} at {endpoint.url}: {reason}",
            "the base URL must start with http:// or https://",
        ) from None
    except httpx.TransportError as exc:
        reason = redact_secret(str(exc), endpoint.secret) or type(exc).__name__
        raise ApplicationError(
            f"could not reach {endpoint.provider} at {endpoint.url}: {reason}",
            {"provider": endpoint.provider},
            type=MODEL_CALL_FAILED,
            non_retryable=False,
        ) from None
    except (httpx.InvalidURL, httpx.RequestError) as exc:
        reason = redact_secret(str(exc), endpoint.secret)
        raise config_error(
            f"cannot call {endpoint.provider} at {endpoint.url}: {reason}",
            "check the base URL configured for this model",
        ) from None
    return result


__all__ = [
    "ANTHROPIC_DEFAULT_BASE_URL",
    "ANTHROPIC_VERSION",
    "HEARTBEAT_INTERVAL_SECONDS",
    "LOCAL_BASE_URL_ENV",
    "MAX_RESPONSE_BYTES",
    "MAX_RETRY_DELAY",
    "OPENAI_DEFAULT_BASE_URL",
    "REDACTED",
    "Endpoint",
    "call_model",
    "check_payload_size",
    "classify_error",
    "classify_http_error",
    "error_fields",
    "redact",
    "redacted_error",
    "resolve_endpoint",
    "retry_delay",
]
