"""The scripted server must speak the real wire formats, or the tests built on it prove nothing."""

from __future__ import annotations

import json
import threading
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    batch,
    call,
    context_overflow,
    disconnect,
    echo,
    error,
    text,
)


@pytest.fixture(scope="module")
def server() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer() as s:
        yield s


def openai(server: ScriptedModelServer, model: str, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "messages": [
            {"role": "system", "content": "be brief"},
            {"role": "user", "content": "hello"},
        ],
        **extra,
    }
    return httpx.post(f"{server.base_url}/v1/chat/completions", json=body, timeout=10)


def anthropic(server: ScriptedModelServer, model: str, **extra: Any) -> httpx.Response:
    body = {
        "model": model,
        "max_tokens": 100,
        "system": "be brief",
        "messages": [{"role": "user", "content": [{"type": "text", "text": "hello"}]}],
        **extra,
    }
    return httpx.post(f"{server.base_url}/v1/messages", json=body, timeout=10)


def sse(response: httpx.Response) -> list[tuple[str | None, str]]:
    """(event name, data) pairs of an SSE body."""
    assert response.headers["content-type"].startswith("text/event-stream")
    out = []
    for frame in response.text.split("\n\n"):
        if not frame.strip():
            continue
        fields = dict(line.split(": ", 1) for line in frame.splitlines())
        out.append((fields.get("event"), fields["data"]))
    return out


def test_health(server: ScriptedModelServer) -> None:
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_openai_text_and_tool_calls(server: ScriptedModelServer) -> None:
    server.script(
        "oa-plain",
        [
            text("hi", usage=(7, 3)),
            call("get_weather", city="Paris"),
            batch(call("a", x=1), call("b", y=2), text="both"),
        ],
    )
    first = openai(server, "oa-plain").json()
    assert first["object"] == "chat.completion"
    assert first["choices"][0]["message"] == {"role": "assistant", "content": "hi"}
    assert first["choices"][0]["finish_reason"] == "stop"
    assert first["usage"] == {"prompt_tokens": 7, "completion_tokens": 3, "total_tokens": 10}

    second = openai(server, "oa-plain").json()["choices"][0]
    assert second["finish_reason"] == "tool_calls"
    assert second["message"]["content"] is None
    [tc] = second["message"]["tool_calls"]
    assert tc["id"] == "call_oa-plain_1" and tc["type"] == "function"
    assert tc["function"]["name"] == "get_weather"
    assert json.loads(tc["function"]["arguments"]) == {"city": "Paris"}

    third = openai(server, "oa-plain").json()["choices"][0]["message"]
    assert third["content"] == "both"
    assert [t["id"] for t in third["tool_calls"]] == ["call_oa-plain_2", "call_oa-plain_3"]


def test_an_alias_is_served_counted_and_listed_as_its_model(server: ScriptedModelServer) -> None:
    # A deploy that renames a run's model: the run's conversation goes on in one script.
    server.script("oa-before", [text("one"), text("two")])
    server.alias("oa-after", "oa-before")
    assert openai(server, "oa-before").json()["choices"][0]["message"]["content"] == "one"
    assert openai(server, "oa-after").json()["choices"][0]["message"]["content"] == "two"
    assert server.request_count("oa-before") == 2 and server.request_count("oa-after") == 0
    sent = [r.body["model"] for r in server.requests("oa-before")]
    assert sent == ["oa-before", "oa-after"]


def test_raw_arguments_and_given_ids_are_sent_verbatim(server: ScriptedModelServer) -> None:
    server.script("oa-raw", [call("f", raw_arguments='{"x": 1', id="mine")])
    tc = openai(server, "oa-raw").json()["choices"][0]["message"]["tool_calls"][0]
    assert tc["function"]["arguments"] == '{"x": 1' and tc["id"] == "mine"


def test_openai_stream_reassembles(server: ScriptedModelServer) -> None:
    step = batch(
        call("lookup", q="capital of France"),
        call("add", a=1, b=2),
        text="Let me check that.",
        usage=(12, 8),
    )
    server.script("oa-stream", [step, step])
    plain = openai(server, "oa-stream").json()["choices"][0]
    streamed = openai(server, "oa-stream", stream=True, stream_options={"include_usage": True})
    frames = [data for _, data in sse(streamed)]
    assert frames[-1] == "[DONE]"
    chunks = [json.loads(d) for d in frames[:-1]]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    content, finish = "", None
    calls: dict[int, dict[str, Any]] = {}
    for c in chunks:
        for choice in c["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls", []):
                slot = calls.setdefault(tc["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                slot["name"] += tc.get("function", {}).get("name") or ""
                slot["arguments"] += tc.get("function", {}).get("arguments") or ""
            finish = choice["finish_reason"] or finish
    assert sum(1 for c in chunks if c["choices"] and c["choices"][0]["delta"].get("content")) > 2
    assert content == plain["message"]["content"]
    assert finish == plain["finish_reason"] == "tool_calls"
    expected = [
        {"id": f"call_oa-stream_{n}", **t["function"]}
        for n, t in zip((3, 4), plain["message"]["tool_calls"], strict=True)
    ]
    assert [calls[i] for i in sorted(calls)] == expected
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] == 20


def test_openai_stream_without_usage_option(server: ScriptedModelServer) -> None:
    server.script("oa-stream-nousage", [text("abcdefghij")])
    chunks = [json.loads(d) for _, d in sse(openai(server, "oa-stream-nousage", stream=True))[:-1]]
    assert all("usage" not in c for c in chunks)
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks) == "abcdefghij"


def test_anthropic_non_stream(server: ScriptedModelServer) -> None:
    server.script("an-plain", [text("hi"), batch(call("get_weather", city="Paris"), text="ok")])
    first = anthropic(server, "an-plain").json()
    assert first["type"] == "message" and first["role"] == "assistant"
    assert first["content"] == [{"type": "text", "text": "hi"}]
    assert first["stop_reason"] == "end_turn"
    assert first["usage"] == {"input_tokens": 10, "output_tokens": 5}
    second = anthropic(server, "an-plain").json()
    assert second["stop_reason"] == "tool_use"
    assert second["content"][0] == {"type": "text", "text": "ok"}
    assert second["content"][1] == {
        "type": "tool_use",
        "id": "call_an-plain_1",
        "name": "get_weather",
        "input": {"city": "Paris"},
    }


def test_anthropic_stream(server: ScriptedModelServer) -> None:
    server.script("an-stream", [batch(call("f", x=[1, 2, 3]), text="thinking...", usage=(4, 9))])
    events = [
        (name, json.loads(data)) for name, data in sse(anthropic(server, "an-stream", stream=True))
    ]
    names = [n for n, _ in events]
    assert names[0] == "message_start" and names[-2:] == ["message_delta", "message_stop"]
    assert all(n == d["type"] for n, d in events)
    assert events[0][1]["message"]["usage"]["input_tokens"] == 4
    blocks: dict[int, dict[str, Any]] = {}
    for name, data in events:
        if name == "content_block_start":
            blocks[data["index"]] = {**data["content_block"], "json": ""}
        elif name == "content_block_delta":
            delta = data["delta"]
            if delta["type"] == "text_delta":
                blocks[data["index"]]["text"] += delta["text"]
            else:
                blocks[data["index"]]["json"] += delta["partial_json"]
    assert blocks[0]["text"] == "thinking..."
    assert blocks[1]["name"] == "f" and json.loads(blocks[1]["json"]) == {"x": [1, 2, 3]}
    assert names.count("content_block_stop") == 2
    delta = dict(events)["message_delta"]
    assert delta["delta"]["stop_reason"] == "tool_use" and delta["usage"]["output_tokens"] == 9


def test_error_step_with_headers(server: ScriptedModelServer) -> None:
    headers = {"retry-after": "0.1", "retry-after-ms": "100", "x-should-retry": "true"}
    server.script("err", [error(429, headers=headers), text("after")])
    server.script("err-an", [error(529, message="busy")])
    r = openai(server, "err")
    assert r.status_code == 429 and r.headers["retry-after"] == "0.1"
    assert r.headers["x-should-retry"] == "true"
    assert r.json()["error"]["type"] == "requests"
    assert r.json()["error"]["code"] == "rate_limit_exceeded"
    assert openai(server, "err").json()["choices"][0]["message"]["content"] == "after"
    a = anthropic(server, "err-an")
    assert a.status_code == 529
    assert a.json() == {"type": "error", "error": {"type": "overloaded_error", "message": "busy"}}


def test_error_with_custom_body_and_type(server: ScriptedModelServer) -> None:
    server.script(
        "err-body", [error(500, body="upstream exploded"), error(400, api_error_type="weird_error")]
    )
    assert openai(server, "err-body").text == "upstream exploded"
    assert anthropic(server, "err-body").json()["error"]["type"] == "weird_error"


def test_context_overflow_bodies(server: ScriptedModelServer) -> None:
    server.script("overflow", [context_overflow(), context_overflow(limit=200_000, tokens=210_000)])
    o = openai(server, "overflow")
    assert o.status_code == 400
    assert o.json()["error"]["code"] == "context_length_exceeded"
    assert "maximum context length is 128000 tokens" in o.json()["error"]["message"]
    a = anthropic(server, "overflow")
    assert a.status_code == 400
    assert a.json()["error"] == {
        "type": "invalid_request_error",
        "message": "prompt is too long: 210000 tokens > 200000 maximum",
    }


def test_exhausted_script_fails_loudly(server: ScriptedModelServer) -> None:
    server.script("short", [text("only one")])
    assert openai(server, "short").status_code == 200
    r = openai(server, "short")
    assert r.status_code == 400
    assert "scripted model 'short' has no step left (1 requests served)" in r.text
    never = anthropic(server, "never-scripted")
    assert never.status_code == 400 and never.json()["type"] == "error"
    assert "has no step left (0 requests served)" in never.json()["error"]["message"]
    assert server.request_count("short") == 2  # the failed request is recorded too


def test_scripts_are_keyed_by_model(server: ScriptedModelServer) -> None:
    server.script("key-a", [text("a1"), text("a2")])
    server.script("key-b", [text("b1")])
    assert openai(server, "key-a").json()["choices"][0]["message"]["content"] == "a1"
    assert openai(server, "key-b").json()["choices"][0]["message"]["content"] == "b1"
    assert openai(server, "key-a").json()["choices"][0]["message"]["content"] == "a2"
    assert server.remaining("key-a") == server.remaining("key-b") == 0


def test_respond_function_after_script(server: ScriptedModelServer) -> None:
    server.script("echoer", [text("scripted first")])
    server.respond("echoer", lambda req: text(f"echo: {req.last_user_text} ({req.api})"))
    assert openai(server, "echoer").json()["choices"][0]["message"]["content"] == "scripted first"
    assert (
        openai(server, "echoer").json()["choices"][0]["message"]["content"]
        == "echo: hello (openai)"
    )
    assert anthropic(server, "echoer").json()["content"][0]["text"] == "echo: hello (anthropic)"

    def boom(req: Any) -> Any:
        raise RuntimeError("bad responder")

    server.respond("boomer", boom)
    r = openai(server, "boomer")
    assert r.status_code == 500 and "bad responder" in r.text


def test_request_recording(server: ScriptedModelServer) -> None:
    server.script("rec", [text("x"), text("y")])
    tools = [{"type": "function", "function": {"name": "search", "parameters": {}}}]
    openai(server, "rec", tools=tools)
    anthropic(
        server,
        "rec",
        tools=[{"name": "lookup", "input_schema": {}}],
        messages=[
            {"role": "user", "content": "first"},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "t1", "name": "lookup", "input": {}}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "found"}],
            },
        ],
    )
    first, second = server.requests("rec")
    assert (first.api, first.index, first.tool_names, first.system) == (
        "openai",
        0,
        ["search"],
        "be brief",
    )
    assert first.last_user_text == "hello" and first.messages[1]["role"] == "user"
    assert first.headers["content-type"] == "application/json"
    assert (second.api, second.index, second.tool_names) == ("anthropic", 1, ["lookup"])
    assert second.system == "be brief" and second.last_user_text == "first"
    assert second.tool_results == ["found"] and second.last_message_is_tool_result
    assert [r.model for r in server.requests() if r.model == "rec"] == ["rec", "rec"]


def test_hold_blocks_until_released(server: ScriptedModelServer) -> None:
    gate = threading.Event()
    server.script("held", [text("released", hold=gate)])
    result: list[httpx.Response] = []
    worker = threading.Thread(target=lambda: result.append(openai(server, "held")))
    worker.start()
    server.wait_for_requests("held", 1, timeout=5)
    worker.join(timeout=0.3)
    assert worker.is_alive() and not result
    gate.set()
    worker.join(timeout=5)
    assert result[0].json()["choices"][0]["message"]["content"] == "released"


def test_wait_for_requests_times_out(server: ScriptedModelServer) -> None:
    with pytest.raises(TimeoutError, match="got 0 request"):
        server.wait_for_requests("nobody", 1, timeout=0.1)


def test_disconnect_step(server: ScriptedModelServer) -> None:
    server.script("crash", [disconnect(), text("back")])
    with pytest.raises(httpx.RemoteProtocolError):
        openai(server, "crash")
    assert openai(server, "crash").json()["choices"][0]["message"]["content"] == "back"


def test_stop_drops_held_requests_and_restarts_on_same_port() -> None:
    s = ScriptedModelServer().start()
    url = s.base_url
    s.script("m", [text("never", hold=threading.Event()), text("again")])
    errors: list[Exception] = []

    def send() -> None:
        try:
            openai(s, "m")
        except httpx.HTTPError as exc:
            errors.append(exc)

    worker = threading.Thread(target=send)
    worker.start()
    s.wait_for_requests("m", 1)
    s.stop()
    worker.join(timeout=5)
    assert not worker.is_alive() and errors
    s.start()
    try:
        assert s.base_url == url
        assert openai(s, "m").json()["choices"][0]["message"]["content"] == "again"
    finally:
        s.stop()


def test_echo_rule() -> None:
    with ScriptedModelServer(fallback=echo) as s:
        tools = [{"type": "function", "function": {"name": "add", "parameters": {}}}]
        r = httpx.post(
            f"{s.base_url}/v1/chat/completions",
            json={
                "model": "any",
                "tools": tools,
                "messages": [{"role": "user", "content": 'call add {"a": 1}'}],
            },
        ).json()
        assert r["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"] == '{"a": 1}'
        r = httpx.post(
            f"{s.base_url}/v1/chat/completions",
            json={"model": "any", "messages": [{"role": "user", "content": "hey"}]},
        ).json()
        assert r["choices"][0]["message"]["content"] == "echo: hey"
