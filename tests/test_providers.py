"""The provider layer over real HTTP: what is sent, what is understood, and how failures become
Temporal retry decisions."""

from __future__ import annotations

import contextlib
import gc
import gzip
import json
import socket
import ssl
import threading
import weakref
from collections.abc import AsyncIterator, Iterator
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx
import pytest
from temporalio.exceptions import ApplicationError

from relaykit.errors import (
    CONTEXT_WINDOW_EXCEEDED,
    MODEL_CALL_FAILED,
    MODEL_HTTP_ERROR,
    PAYLOAD_TOO_LARGE,
)
from relaykit.messages import Message, ModelResponse, OutputSpec, ToolCall, ToolSpec
from relaykit.models import providers
from relaykit.models.aiohttp_transport import AiohttpTransport
from relaykit.models.http_transport import PROXY_VARIABLES, ModelHttpClient, model_http_client
from relaykit.models.providers import (
    MAX_RETRY_DELAY,
    call_model,
    resolve_endpoint,
    retry_delay,
)
from relaykit.models.spec import ModelRequest, ModelSettings, ModelSpec
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    batch,
    call,
    context_overflow,
    disconnect,
    error,
    text,
)

_ENV = (
    "OPENAI_API_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
    "RELAYKIT_LOCAL_BASE_URL",
    "MY_KEY",
)

WEATHER = ToolSpec(
    name="get_weather",
    description="Current weather for a city.",
    parameters={
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
)
CLOCK = ToolSpec(name="clock", description="The time.")
ANSWER = OutputSpec(
    name="answer",
    json_schema={"type": "object", "properties": {"city": {"type": "string"}}},
)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as s:
        yield s


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, server: ScriptedModelServer) -> None:
    """Each test points the providers at the scripted server; nothing from the real
    environment may leak in."""
    for name in (*_ENV, *PROXY_VARIABLES):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OPENAI_BASE_URL", f"{server.base_url}/v1")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", server.base_url)
    monkeypatch.setenv("ANTHROPIC_API_KEY", "ant-test-key")


@pytest.fixture(params=["httpx", "aiohttp"])
async def http(request: pytest.FixtureRequest) -> AsyncIterator[httpx.AsyncClient]:
    """Every provider test runs on httpx's own connections and on the worker's (aiohttp's),
    which must fail the same way: the error kinds decide what is retried."""
    if request.param == "httpx":
        client: httpx.AsyncClient = ModelHttpClient()  # a worker's client behind a proxy
    else:
        client = model_http_client(
            timeout=httpx.Timeout(120.0, connect=10.0),
            max_connections=10,
            verify=ssl.create_default_context(),
        )
    async with client:
        yield client


def req(model: str, provider: str = "openai", *, stream: bool = False, **kw: Any) -> ModelRequest:
    spec_kw = {k: kw.pop(k) for k in ("tool_calls", "base_url", "api_key_env") if k in kw}
    spec = ModelSpec(provider=provider, name=model, stream=stream, timeout_seconds=10, **spec_kw)  # type: ignore[arg-type]
    kw.setdefault("messages", [Message.user("hi")])
    return ModelRequest(model=spec, **kw)


async def fails(request: ModelRequest, http: httpx.AsyncClient) -> ApplicationError:
    with pytest.raises(ApplicationError) as info:
        await call_model(request, http=http)
    return info.value


CALL_A = ToolCall(id="call_a", name="get_weather", arguments='{"city": "Paris"}')
CALL_B = ToolCall(id="call_b", name="clock", arguments="{not json")
HISTORY = [
    Message.user("weather and time?"),
    Message.assistant("checking", [CALL_A, CALL_B]),
    Message.tool_result(CALL_A, "sunny"),
    Message.tool_result(CALL_B, "bad arguments", is_error=True),
    Message.user("and tomorrow?"),
]


# --------------------------------------------------------------------------------------------
# Request shape
# --------------------------------------------------------------------------------------------


async def test_openai_request_shape(server: ScriptedModelServer, http: httpx.AsyncClient) -> None:
    server.script("oa-shape", [text("ok")])
    settings = ModelSettings(
        temperature=0.2,
        top_p=0.9,
        max_tokens=50,
        tool_choice="auto",
        parallel_tool_calls=False,
        extra_body={"seed": 7},
    )
    await call_model(
        req(
            "oa-shape",
            system="be brief",
            messages=HISTORY,
            tools=[WEATHER, CLOCK],
            output=ANSWER,
            settings=settings,
            reminder="2 tasks running",
        ),
        http=http,
    )
    body = server.requests("oa-shape")[0].body
    assert body["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "weather and time?"},
        {
            "role": "assistant",
            "content": "checking",
            "tool_calls": [
                {
                    "id": "call_a",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                },
                {
                    "id": "call_b",
                    "type": "function",
                    "function": {"name": "clock", "arguments": "{not json"},
                },
            ],
        },
        {"role": "tool", "tool_call_id": "call_a", "content": "sunny"},
        {"role": "tool", "tool_call_id": "call_b", "content": "Error: bad arguments"},
        {"role": "user", "content": "and tomorrow?"},
        {"role": "user", "content": "2 tasks running"},
    ]
    assert body["tools"][0] == {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": WEATHER.parameters,
        },
    }
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {"name": "answer", "schema": ANSWER.json_schema},
    }
    assert body["temperature"] == 0.2 and body["top_p"] == 0.9 and body["max_tokens"] == 50
    assert body["tool_choice"] == "auto" and body["parallel_tool_calls"] is False
    assert body["seed"] == 7
    assert "stream" not in body


async def test_openai_error_results_already_saying_error_are_not_prefixed_twice(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-errprefix", [text("ok")])
    messages = [
        Message.user("x"),
        Message.assistant("", [CALL_A]),
        Message.tool_result(CALL_A, "Error: city unknown", is_error=True),
    ]
    await call_model(req("oa-errprefix", messages=messages), http=http)
    sent = server.requests("oa-errprefix")[0].body["messages"]
    assert sent[1]["content"] is None
    assert sent[2]["content"] == "Error: city unknown"
    assert "tools" not in server.requests("oa-errprefix")[0].body


async def test_anthropic_request_shape(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("an-shape", [text("ok")])
    await call_model(
        req(
            "an-shape",
            "anthropic",
            system="be brief",
            messages=[Message.user("first"), *HISTORY],
            tools=[WEATHER],
            output=ANSWER,
            settings=ModelSettings(tool_choice="required", parallel_tool_calls=False),
            reminder="2 tasks running",
        ),
        http=http,
    )
    recorded = server.requests("an-shape")[0]
    body = recorded.body
    assert recorded.headers["x-api-key"] == "ant-test-key"
    assert recorded.headers["anthropic-version"] == "2023-06-01"
    assert recorded.headers["content-type"] == "application/json"
    assert "authorization" not in recorded.headers
    assert body["max_tokens"] == 4096
    assert body["system"].startswith("be brief\n\n")
    assert json.dumps(ANSWER.json_schema) in body["system"] and "only a JSON" in body["system"]
    assert body["tools"] == [
        {
            "name": "get_weather",
            "description": WEATHER.description,
            "input_schema": WEATHER.parameters,
        }
    ]
    assert body["tool_choice"] == {"type": "any", "disable_parallel_tool_use": True}
    assert body["messages"] == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "first"},
                {"type": "text", "text": "weather and time?"},
            ],
        },
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "checking"},
                {
                    "type": "tool_use",
                    "id": "call_a",
                    "name": "get_weather",
                    "input": {"city": "Paris"},
                },
                {
                    "type": "tool_use",
                    "id": "call_b",
                    "name": "clock",
                    "input": {"_raw_arguments": "{not json"},
                },
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "call_a", "content": "sunny"},
                {
                    "type": "tool_result",
                    "tool_use_id": "call_b",
                    "content": "bad arguments",
                    "is_error": True,
                },
                {"type": "text", "text": "and tomorrow?"},
                {"type": "text", "text": "2 tasks running"},
            ],
        },
    ]


async def test_anthropic_reminder_after_assistant_is_its_own_user_turn(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("an-reminder", [text("ok")])
    messages = [Message.user("hi"), Message.assistant("hello")]
    await call_model(req("an-reminder", "anthropic", messages=messages, reminder="note"), http=http)
    body = server.requests("an-reminder")[0].body
    assert body["messages"][-1] == {"role": "user", "content": [{"type": "text", "text": "note"}]}
    assert "system" not in body and "tools" not in body


# --------------------------------------------------------------------------------------------
# Parsing, streaming
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_text_answer(
    provider: str, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    model = f"{provider}-text"
    server.script(model, [text("Hello there", usage=(12, 3))])
    resp = await call_model(req(model, provider), http=http)
    assert resp.message == Message.assistant("Hello there")
    assert (resp.usage.requests, resp.usage.input_tokens, resp.usage.output_tokens) == (1, 12, 3)
    assert resp.model == model
    assert resp.finish_reason == ("stop" if provider == "openai" else "end_turn")


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_tool_calls(
    provider: str, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    model = f"{provider}-calls"
    server.script(
        model,
        [batch(call("get_weather", id="c1", city="Paris"), call("clock", id="c2"), text="let me")],
    )
    resp = await call_model(req(model, provider, tools=[WEATHER, CLOCK]), http=http)
    assert resp.message.content == "let me"
    assert [(c.id, c.name, json.loads(c.arguments)) for c in resp.message.tool_calls] == [
        ("c1", "get_weather", {"city": "Paris"}),
        ("c2", "clock", {}),
    ]
    assert resp.finish_reason == ("tool_calls" if provider == "openai" else "tool_use")


async def test_malformed_arguments_stay_raw(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-raw", [call("get_weather", raw_arguments='{"city": ', id="c1")])
    resp = await call_model(req("oa-raw", tools=[WEATHER]), http=http)
    assert resp.message.tool_calls[0].arguments == '{"city": '


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_streaming_matches_non_streaming(
    provider: str, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    model = f"{provider}-stream"
    step = batch(
        call("get_weather", id="c1", city="Paris, France"),
        call("clock", id="c2"),
        text="Let me look that up for you.",
        usage=(20, 9),
    )
    server.script(model, [step, step])
    pieces: list[str] = []
    beats: list[None] = []
    streamed = await call_model(
        req(model, provider, stream=True, tools=[WEATHER, CLOCK]),
        http=http,
        on_delta=pieces.append,
        heartbeat=lambda: beats.append(None),
    )
    whole = await call_model(req(model, provider, tools=[WEATHER, CLOCK]), http=http)
    assert streamed == whole
    assert "".join(pieces) == "Let me look that up for you."
    assert len(pieces) > 3  # really streamed, not one piece
    assert len(beats) > len(pieces)
    sent = server.requests(model)[0].body
    assert sent["stream"] is True
    if provider == "openai":
        assert sent["stream_options"] == {"include_usage": True}
    assert streamed.usage.input_tokens == 20 and streamed.usage.output_tokens == 9


class _Beats:
    """A heartbeat callable that can be watched by a weak reference."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


async def test_a_slow_answer_heartbeats_and_leaves_nothing_for_the_garbage_collector(
    server: ScriptedModelServer, http: httpx.AsyncClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every model call of a worker goes through this: what the heartbeats hold (the attempt's
    activity context, in a worker) must be freed when the call returns, not left in a
    reference cycle for the collector."""
    monkeypatch.setattr(providers, "HEARTBEAT_INTERVAL_SECONDS", 0.02)
    server.script("oa-slow", [text("done", delay=0.3)])
    beats = _Beats()
    watched = weakref.ref(beats)
    gc.disable()
    try:
        resp = await call_model(req("oa-slow"), http=http, heartbeat=beats)
        assert resp.message.content == "done"
        assert beats.count >= 3
        del beats
        assert watched() is None
    finally:
        gc.enable()


# --------------------------------------------------------------------------------------------
# Errors
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "delay"),
    [
        ({"retry-after": "7"}, timedelta(seconds=7)),
        ({"retry-after-ms": "1500", "retry-after": "9"}, timedelta(milliseconds=1500)),
        ({"retry-after": "3600"}, MAX_RETRY_DELAY),
        ({}, None),
    ],
)
async def test_rate_limit_is_retried_after_the_servers_delay(
    headers: dict[str, str],
    delay: timedelta | None,
    server: ScriptedModelServer,
    http: httpx.AsyncClient,
) -> None:
    model = f"oa-429-{len(headers)}-{delay}"
    server.script(model, [error(429, headers=headers, message="Rate limit reached")])
    exc = await fails(req(model), http)
    assert exc.type == MODEL_HTTP_ERROR and not exc.non_retryable
    assert exc.next_retry_delay == delay
    assert "429" in exc.message and "Rate limit reached" in exc.message


def test_retry_after_http_date() -> None:
    when = datetime.now(UTC) + timedelta(seconds=30)
    delay = retry_delay({"retry-after": format_datetime(when, usegmt=True)})
    assert delay is not None and timedelta(seconds=25) < delay <= timedelta(seconds=30)
    assert retry_delay({"retry-after": "soon"}) is None
    assert retry_delay({"retry-after": "-3"}) is None


@pytest.mark.parametrize(
    ("provider", "status", "headers", "retryable"),
    [
        ("openai", 500, {}, True),
        ("openai", 503, {"x-should-retry": "false"}, False),
        ("openai", 400, {"x-should-retry": "true"}, True),
        ("openai", 408, {}, True),
        ("openai", 409, {}, True),
        ("anthropic", 529, {}, True),
        ("anthropic", 404, {}, False),
        ("openai", 422, {}, False),
    ],
)
async def test_status_decides_retry(
    provider: str,
    status: int,
    headers: dict[str, str],
    retryable: bool,
    server: ScriptedModelServer,
    http: httpx.AsyncClient,
) -> None:
    model = f"{provider}-status-{status}-{len(headers)}"
    server.script(model, [error(status, headers=headers, message="scripted trouble")])
    exc = await fails(req(model, provider), http)
    assert exc.type == MODEL_HTTP_ERROR
    assert exc.non_retryable is not retryable
    assert f"{status} from {provider}" in exc.message and "scripted trouble" in exc.message


async def test_bad_key_is_final_and_never_shown(
    monkeypatch: pytest.MonkeyPatch, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    key = "sk-very-secret-0123456789"
    monkeypatch.setenv("OPENAI_API_KEY", key)
    server.script("oa-401", [error(401, message=f"Incorrect API key provided: {key}.")])
    exc = await fails(req("oa-401"), http)
    assert exc.type == MODEL_HTTP_ERROR and exc.non_retryable
    assert "401 from openai: Incorrect API key provided" in exc.message
    assert "check OPENAI_API_KEY on the worker" in exc.message
    assert key not in exc.message and key not in str(exc.details)


async def test_anthropic_bad_key_names_its_variable(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("an-401", [error(401, message="invalid x-api-key")])
    exc = await fails(req("an-401", "anthropic"), http)
    assert exc.non_retryable and "ANTHROPIC_API_KEY" in exc.message
    assert "ant-test-key" not in exc.message


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_context_overflow(
    provider: str, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    model = f"{provider}-overflow"
    server.script(model, [context_overflow()])
    exc = await fails(req(model, provider), http)
    assert exc.type == CONTEXT_WINDOW_EXCEEDED and exc.non_retryable
    assert "context window" in exc.message  # the hint


async def test_context_overflow_from_a_local_server_message(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    body = {
        "error": {
            "code": 400,
            "type": "exceed_context_size_error",
            "message": "the request exceeds the available context size",
        }
    }
    server.script("llama-overflow", [error(400, body=body)])
    exc = await fails(req("llama-overflow"), http)
    assert exc.type == CONTEXT_WINDOW_EXCEEDED and exc.non_retryable


async def test_the_body_is_json_that_keeps_every_character(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-unicode", [text("ok")])
    said = 'café ☕, "quoted" \\ and a newline\n, 𝄞'
    await call_model(req("oa-unicode", messages=[Message.user(said)]), http=http)
    recorded = server.requests("oa-unicode")[0]
    assert recorded.headers["content-type"] == "application/json"
    assert recorded.body["messages"][-1]["content"] == said


@pytest.mark.parametrize(
    ("base_url", "said"),
    [
        ("ftp://127.0.0.1:9/v1", "unsupported protocol 'ftp://'"),
        ("localhost:8000/v1", "missing an 'http://' or 'https://' protocol"),
        ("http:///v1", "missing an 'http://' or 'https://' protocol"),
    ],
)
async def test_a_base_url_that_is_not_http_is_a_configuration_error(
    http: httpx.AsyncClient, base_url: str, said: str
) -> None:
    exc = await fails(req("m", base_url=base_url), http)
    assert exc.type == MODEL_CALL_FAILED and exc.non_retryable
    assert said in exc.message and "must start with http:// or https://" in exc.message, exc.message


async def test_connection_refused_is_retried(http: httpx.AsyncClient) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    exc = await fails(req("gone", base_url=f"http://127.0.0.1:{port}/v1"), http)
    assert exc.type == MODEL_CALL_FAILED and not exc.non_retryable
    assert "could not reach openai" in exc.message


async def test_a_server_that_never_answers_times_out_and_is_retried(
    http: httpx.AsyncClient,
) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()  # accepts the connection, never reads nor answers
        port = listener.getsockname()[1]
        request = req("silent", base_url=f"http://127.0.0.1:{port}/v1")
        request = request.model_copy(
            update={"model": request.model.model_copy(update={"timeout_seconds": 0.3})}
        )
        exc = await fails(request, http)
    assert exc.type == MODEL_CALL_FAILED and not exc.non_retryable
    assert "did not answer within 0.3s (ReadTimeout)" in exc.message, exc.message


def test_a_worker_behind_a_proxy_keeps_httpx_transport(monkeypatch: pytest.MonkeyPatch) -> None:
    def transport() -> httpx.AsyncBaseTransport:
        client = model_http_client(
            timeout=httpx.Timeout(1.0), max_connections=1, verify=ssl.create_default_context()
        )
        return client._transport

    assert isinstance(transport(), AiohttpTransport)  # clean_env removed every proxy variable
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy.internal:3128")
    assert isinstance(transport(), httpx.AsyncHTTPTransport)  # which honours the proxy


async def test_dropped_connection_is_retried(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-drop", [disconnect()])
    exc = await fails(req("oa-drop"), http)
    assert exc.type == MODEL_CALL_FAILED and not exc.non_retryable


async def test_unreadable_body_is_final(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-html", [error(200, body="<html>gateway says hi</html>")])
    exc = await fails(req("oa-html"), http)
    assert exc.type == MODEL_CALL_FAILED and exc.non_retryable
    assert "not JSON" in exc.message and "gateway says hi" in exc.message
    server.script("oa-shape-wrong", [error(200, body={"id": "x", "object": "list"})])
    exc = await fails(req("oa-shape-wrong"), http)
    assert exc.type == MODEL_CALL_FAILED and exc.non_retryable


async def test_non_json_error_body_still_classified(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-502", [error(502, body="<html>Bad Gateway</html>")])
    exc = await fails(req("oa-502"), http)
    assert exc.type == MODEL_HTTP_ERROR and not exc.non_retryable and "Bad Gateway" in exc.message


async def test_oversized_answer(server: ScriptedModelServer, http: httpx.AsyncClient) -> None:
    server.script("oa-huge", [text("x" * 1_700_000)])
    exc = await fails(req("oa-huge"), http)
    assert exc.type == PAYLOAD_TOO_LARGE and exc.non_retryable and "max_tokens" in exc.message


class _Gzipped(BaseHTTPRequestHandler):
    """Answers every POST with a gzip-compressed body and a cookie, and keeps each request's
    headers: what a provider behind a CDN does."""

    status = 200
    body = b""
    seen: list[dict[str, str]]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.seen.append({name.lower(): value for name, value in self.headers.items()})
        compressed = gzip.compress(self.body)
        self.send_response(self.status)
        self.send_header("content-type", "application/json")
        self.send_header("content-encoding", "gzip")
        self.send_header("set-cookie", "__cf_bm=abc; Path=/; HttpOnly")
        self.send_header("content-length", str(len(compressed)))
        self.end_headers()
        self.wfile.write(compressed)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def _gzip_server(status: int, body: dict[str, Any]) -> Iterator[tuple[str, list[dict[str, str]]]]:
    seen: list[dict[str, str]] = []
    handler = type(
        "Handler", (_Gzipped,), {"status": status, "body": json.dumps(body).encode(), "seen": seen}
    )
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}/v1", seen
    finally:
        httpd.shutdown()
        httpd.server_close()


_ANSWER = {
    "id": "c1",
    "model": "m",
    "choices": [
        {"index": 0, "message": {"role": "assistant", "content": "zipped"}, "finish_reason": "stop"}
    ],
    "usage": {"prompt_tokens": 3, "completion_tokens": 1},
}


async def test_a_compressed_answer_is_read_and_no_cookie_is_kept(http: httpx.AsyncClient) -> None:
    """Both clients ask for gzip as httpx does, read the answer decoded, and send the cookie a
    provider set on one call with none of the calls after it."""
    with _gzip_server(200, _ANSWER) as (base_url, seen):
        first = await call_model(req("m", base_url=base_url), http=http)
        again = await call_model(req("m", base_url=base_url), http=http)
    assert first.message.content == again.message.content == "zipped"
    assert [headers.get("cookie") for headers in seen] == [None, None]
    assert all("gzip" in headers["accept-encoding"] for headers in seen)
    assert all(headers["content-type"] == "application/json" for headers in seen)


async def test_a_compressed_error_is_read(http: httpx.AsyncClient) -> None:
    body = {"error": {"message": "the model is overloaded", "type": "server_error"}}
    with _gzip_server(503, body) as (base_url, _):
        exc = await fails(req("m", base_url=base_url), http)
    assert exc.type == MODEL_HTTP_ERROR and not exc.non_retryable
    assert "the model is overloaded" in exc.message, exc.message


async def test_a_base_url_no_parser_reads_is_a_configuration_error(
    http: httpx.AsyncClient,
) -> None:
    exc = await fails(req("m", base_url="http://[::1/v1"), http)
    assert exc.type == MODEL_CALL_FAILED and exc.non_retryable
    assert "base URL is not a URL" in exc.message, exc.message


class _RawSSE(BaseHTTPRequestHandler):
    """Serves a fixed SSE body, for stream failures the scripted server does not produce."""

    body = b""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length") or 0))
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("content-length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, format: str, *args: Any) -> None:
        pass


def _raw_sse_server(body: str) -> ThreadingHTTPServer:
    handler = type("Handler", (_RawSSE,), {"body": body.encode()})
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(
        target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    ).start()
    return httpd


def _events(*events: dict[str, Any]) -> str:
    return "".join(f"event: {e['type']}\ndata: {json.dumps(e)}\n\n" for e in events)


_START = {"type": "message_start", "message": {"model": "m", "usage": {"input_tokens": 3}}}
_TEXT = {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}}


@pytest.mark.parametrize(
    ("events", "retryable", "etype"),
    [
        (
            [
                _START,
                _TEXT,
                {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}},
            ],
            True,
            MODEL_HTTP_ERROR,
        ),
        ([_START, _TEXT], True, MODEL_CALL_FAILED),  # cut off before message_stop
        (
            [
                _START,
                {
                    "type": "error",
                    "error": {"type": "invalid_request_error", "message": "prompt is too long"},
                },
            ],
            False,
            CONTEXT_WINDOW_EXCEEDED,
        ),
    ],
)
async def test_anthropic_stream_failures(
    events: list[dict[str, Any]], retryable: bool, etype: str, http: httpx.AsyncClient
) -> None:
    httpd = _raw_sse_server(_events(*events))
    try:
        request = req(
            "m", "anthropic", stream=True, base_url=f"http://127.0.0.1:{httpd.server_address[1]}"
        )
        exc = await fails(request, http)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert exc.type == etype and exc.non_retryable is not retryable


async def test_openai_stream_error_event(http: httpx.AsyncClient) -> None:
    body = 'data: {"error": {"message": "model crashed", "type": "server_error"}}\n\n'
    httpd = _raw_sse_server(body)
    try:
        exc = await fails(
            req("m", stream=True, base_url=f"http://127.0.0.1:{httpd.server_address[1]}"), http
        )
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert exc.type == MODEL_HTTP_ERROR and not exc.non_retryable and "model crashed" in exc.message


async def test_streaming_error_status_is_classified_before_reading_sse(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("oa-stream-429", [error(429, headers={"retry-after": "2"})])
    exc = await fails(req("oa-stream-429", stream=True), http)
    assert exc.type == MODEL_HTTP_ERROR and exc.next_retry_delay == timedelta(seconds=2)
    server.script("an-stream-401", [error(401)])
    exc = await fails(req("an-stream-401", "anthropic", stream=True), http)
    assert exc.non_retryable and "ANTHROPIC_API_KEY" in exc.message


# --------------------------------------------------------------------------------------------
# Constrained tool calls
# --------------------------------------------------------------------------------------------


def _constrained(model: str, **kw: Any) -> ModelRequest:
    kw.setdefault("tools", [WEATHER, CLOCK])
    return req(model, tool_calls="constrained", **kw)


async def test_constrained_request_shape(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("cs-shape", [text('{"reply": "ok"}')])
    await call_model(_constrained("cs-shape", system="be brief", messages=HISTORY), http=http)
    body = server.requests("cs-shape")[0].body
    assert "tools" not in body and "tool_choice" not in body
    fmt = body["response_format"]
    assert fmt["type"] == "json_schema"
    options = fmt["json_schema"]["schema"]["anyOf"]
    assert options == [
        {
            "type": "object",
            "properties": {"name": {"const": "get_weather"}, "arguments": WEATHER.parameters},
            "required": ["name", "arguments"],
        },
        {
            "type": "object",
            "properties": {"name": {"const": "clock"}, "arguments": CLOCK.parameters},
            "required": ["name", "arguments"],
        },
        {"type": "object", "properties": {"reply": {"type": "string"}}, "required": ["reply"]},
    ]
    messages = body["messages"]
    assert messages[0]["role"] == "system"
    assert messages[0]["content"].startswith("be brief\n\n")
    assert "get_weather: Current weather for a city." in messages[0]["content"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert messages[2]["content"] == (
        'checking\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        '{"name": "clock", "arguments": "{not json"}'
    )
    assert messages[3]["content"] == (
        "Tool get_weather returned: sunny\n\nTool clock failed: bad arguments\n\nand tomorrow?"
    )


async def test_constrained_answers(server: ScriptedModelServer, http: httpx.AsyncClient) -> None:
    answer = '{"name": "get_weather", "arguments": {"city": "Oslo"}}'
    server.script(
        "cs-answers",
        [text(answer), text(answer), text('{"reply": "It is sunny."}'), text("plain words")],
    )
    first = await call_model(_constrained("cs-answers"), http=http)
    again = await call_model(_constrained("cs-answers"), http=http)
    [tc] = first.message.tool_calls
    assert tc.name == "get_weather" and json.loads(tc.arguments) == {"city": "Oslo"}
    assert tc.id.startswith("call_") and len(tc.id) == len("call_") + 8
    assert again.message.tool_calls[0].id == tc.id  # deterministic across retries
    assert first.message.content == "" and first.finish_reason == "tool_calls"
    reply = await call_model(_constrained("cs-answers"), http=http)
    assert reply.message == Message.assistant("It is sunny.")
    plain = await call_model(_constrained("cs-answers"), http=http)
    assert plain.message == Message.assistant("plain words")


async def test_constrained_required_and_output(
    server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("cs-req", [text('{"name": "clock", "arguments": {}}')])
    await call_model(
        _constrained("cs-req", settings=ModelSettings(tool_choice="required")), http=http
    )
    options = server.requests("cs-req")[0].body["response_format"]["json_schema"]["schema"]["anyOf"]
    assert len(options) == 2 and all("name" in o["properties"] for o in options)

    server.script("cs-out", [text('{"city": "Rome"}')])
    resp = await call_model(_constrained("cs-out", tools=[], output=ANSWER), http=http)
    body = server.requests("cs-out")[0].body
    assert body["response_format"]["json_schema"] == {
        "name": "answer",
        "schema": ANSWER.json_schema,
    }
    assert resp.message.content == '{"city": "Rome"}'

    server.script("cs-both", [text('{"reply": {"city": "Rome"}}')])
    resp = await call_model(_constrained("cs-both", output=ANSWER), http=http)
    options = server.requests("cs-both")[0].body["response_format"]["json_schema"]["schema"][
        "anyOf"
    ]
    assert options[-1]["properties"]["reply"] == ANSWER.json_schema
    assert json.loads(resp.message.content) == {"city": "Rome"}


async def test_constrained_streaming(server: ScriptedModelServer, http: httpx.AsyncClient) -> None:
    server.script(
        "cs-stream",
        [text('{"reply": "Hello from a small model"}'), text('{"name": "clock", "arguments": {}}')],
    )
    pieces: list[str] = []
    reply = await call_model(
        _constrained("cs-stream", stream=True), http=http, on_delta=pieces.append
    )
    assert reply.message.content == "Hello from a small model"
    assert pieces == ["Hello from a small model"]
    pieces.clear()
    tool = await call_model(
        _constrained("cs-stream", stream=True), http=http, on_delta=pieces.append
    )
    assert tool.message.tool_calls[0].name == "clock" and pieces == []


# --------------------------------------------------------------------------------------------
# Endpoints and keys
# --------------------------------------------------------------------------------------------


async def test_openai_key_header_and_base_url_from_env(
    monkeypatch: pytest.MonkeyPatch, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("env-key", [text("a")])
    server.script("env-nokey", [text("b")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-env")
    await call_model(req("env-key"), http=http)
    assert server.requests("env-key")[0].headers["authorization"] == "Bearer sk-env"
    monkeypatch.delenv("OPENAI_API_KEY")
    await call_model(req("env-nokey"), http=http)
    assert "authorization" not in server.requests("env-nokey")[0].headers


async def test_named_key_variable(
    monkeypatch: pytest.MonkeyPatch, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    server.script("env-named", [text("a")])
    monkeypatch.setenv("OPENAI_API_KEY", "sk-default")
    monkeypatch.setenv("MY_KEY", "sk-mine")
    await call_model(req("env-named", api_key_env="MY_KEY"), http=http)
    assert server.requests("env-named")[0].headers["authorization"] == "Bearer sk-mine"
    monkeypatch.delenv("MY_KEY")
    exc = await fails(req("env-named", api_key_env="MY_KEY"), http)
    assert exc.non_retryable and "MY_KEY" in exc.message


def test_endpoint_resolution(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OPENAI_BASE_URL")
    spec = ModelSpec(name="gpt")
    with pytest.raises(ApplicationError) as raised:
        resolve_endpoint(spec)
    exc = raised.value
    assert exc.non_retryable and "OPENAI_API_KEY" in exc.message  # fails before any request
    monkeypatch.setenv("OPENAI_API_KEY", "sk-x")
    official = resolve_endpoint(spec)
    assert official.url == "https://api.openai.com/v1/chat/completions"
    assert "sk-x" not in repr(official)
    assert resolve_endpoint(spec.model_copy(update={"base_url": "http://h:1"})).url == (
        "http://h:1/v1/chat/completions"
    )
    assert resolve_endpoint(spec.model_copy(update={"base_url": "http://h:1/api/v1/"})).url == (
        "http://h:1/api/v1/chat/completions"
    )
    monkeypatch.setenv("ANTHROPIC_BASE_URL", "http://proxy/v1")
    assert (
        resolve_endpoint(ModelSpec(provider="anthropic", name="c")).url
        == "http://proxy/v1/messages"
    )


async def test_local_provider(
    monkeypatch: pytest.MonkeyPatch, server: ScriptedModelServer, http: httpx.AsyncClient
) -> None:
    exc = await fails(req("small", "local"), http)
    assert exc.type == MODEL_CALL_FAILED and exc.non_retryable
    assert "local model server is not running" in exc.message
    monkeypatch.setenv("RELAYKIT_LOCAL_BASE_URL", server.base_url)
    monkeypatch.setenv("OPENAI_API_KEY", "sk-not-for-local")
    server.script("small", [text("local hello")])
    resp = await call_model(req("small", "local"), http=http)
    assert resp.message.content == "local hello"
    assert "authorization" not in server.requests("small")[0].headers


async def test_openai_official_host_uses_max_completion_tokens() -> None:
    from relaykit.models.providers import _build

    request = req("gpt", settings=ModelSettings(max_tokens=10))
    official = resolve_endpoint(request.model, {"OPENAI_API_KEY": "k"})
    assert _build(request, official)["max_completion_tokens"] == 10


def test_model_response_round_trips() -> None:
    """The response is activity output: it must survive JSON as Temporal stores it."""
    resp = ModelResponse(message=Message.assistant("x", [CALL_A]), model="m")
    assert ModelResponse.model_validate_json(resp.model_dump_json()) == resp
