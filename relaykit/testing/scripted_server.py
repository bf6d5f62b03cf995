"""A scripted LLM server that speaks the real OpenAI and Anthropic wire formats.

Tests, the offline demo and the benchmarks must exercise the same HTTP code paths a real
provider does (status codes, error bodies, SSE framing, retry headers), yet be deterministic and
free. Mocking the client library would skip exactly the parts that break in production, so
instead this module runs a tiny HTTP server on 127.0.0.1 that answers from a script. It uses only
the standard library and runs in a daemon thread, so a pytest process can host it while workers
in other processes call it over HTTP.

Scripts are keyed by the request's ``model`` field: concurrent tests that use different model names
never see each other's steps. Every request is recorded (even those answered with an error) so a
test can assert on what the model was sent.
"""

from __future__ import annotations

import argparse
import json
import re
import socket
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal, Self

Api = Literal["openai", "anthropic"]
StepKind = Literal["reply", "error", "overflow", "disconnect", "raw"]

DEFAULT_USAGE: tuple[int, int] = (10, 5)
_CHUNK = 4  # characters per streamed piece: small, so clients must really reassemble


@dataclass(frozen=True)
class ToolCall:
    """One tool call a step makes; ``raw_arguments`` wins over ``arguments`` so that a test can
    send JSON no real model should write."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw_arguments: str | None = None
    id: str | None = None

    def arguments_json(self) -> str:
        return self.raw_arguments if self.raw_arguments is not None else json.dumps(self.arguments)


@dataclass(frozen=True)
class Step:
    """One scripted answer. Build it with :func:`text`, :func:`call`, :func:`batch`,
    :func:`error`, :func:`context_overflow` or :func:`disconnect`; ``dataclasses.replace`` works
    to tweak one."""

    kind: StepKind = "reply"
    text: str = ""
    calls: tuple[ToolCall, ...] = ()
    usage: tuple[int, int] = DEFAULT_USAGE
    """(input tokens, output tokens) the response reports."""
    cached: int = 0
    """Of the input tokens, how many the response reports as read from the prompt cache (OpenAI
    ``prompt_tokens_details.cached_tokens``, Anthropic ``cache_read_input_tokens``)."""
    truncated: bool = False
    status: int = 200
    body: dict[str, Any] | str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    error_type: str | None = None
    message: str | None = None
    context: tuple[int | None, int | None] = (None, None)
    """(prompt tokens, context limit) reported by a :func:`context_overflow` step."""
    delay: float = 0.0
    hold: threading.Event | None = None


def text(
    content: str,
    *,
    usage: tuple[int, int] = DEFAULT_USAGE,
    cached: int = 0,
    truncated: bool = False,
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> Step:
    """A plain answer. ``truncated`` reports the output limit as the stop reason (OpenAI
    ``length``, Anthropic ``max_tokens``); ``cached`` of the ``usage`` input tokens come from
    the prompt cache."""
    return Step(
        text=content, usage=usage, cached=cached, truncated=truncated, delay=delay, hold=hold
    )


def call(
    name: str,
    /,
    raw_arguments: str | None = None,
    id: str | None = None,
    *,
    delay: float = 0.0,
    hold: threading.Event | None = None,
    **arguments: Any,
) -> Step:
    """A single tool call. Tool arguments named ``id``, ``delay``, ``hold`` or ``raw_arguments``
    collide with the options: pass those through ``raw_arguments`` as JSON text (and set the
    usage with ``dataclasses.replace``)."""
    tc = ToolCall(name=name, arguments=arguments, raw_arguments=raw_arguments, id=id)
    return Step(calls=(tc,), delay=delay, hold=hold)


def batch(
    *calls: Step,
    text: str = "",
    usage: tuple[int, int] = DEFAULT_USAGE,
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> Step:
    """Several tool calls (and optional text) in one response, as parallel tool calling does."""
    merged = tuple(tc for step in calls for tc in step.calls)
    return Step(text=text, calls=merged, usage=usage, delay=delay, hold=hold)


def error(
    status: int,
    body: dict[str, Any] | str | None = None,
    headers: dict[str, str] | None = None,
    api_error_type: str | None = None,
    *,
    message: str | None = None,
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> Step:
    """An HTTP error in the provider's own body shape, unless ``body`` is given (sent verbatim),
    so that the client's real error classification and retry headers get exercised."""
    return Step(
        kind="error",
        status=status,
        body=body,
        headers=dict(headers or {}),
        error_type=api_error_type,
        message=message,
        delay=delay,
        hold=hold,
    )


def context_overflow(
    *,
    limit: int | None = None,
    tokens: int | None = None,
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> Step:
    """The 400 each provider returns when the prompt exceeds the context window, so that
    context-window handling is tested against the real bodies. ``limit`` defaults to 128000
    (OpenAI) or 200000 (Anthropic), ``tokens`` to a little more than the limit."""
    return Step(kind="overflow", status=400, context=(tokens, limit), delay=delay, hold=hold)


def raw(
    body: str,
    *,
    status: int = 200,
    content_type: str = "text/html",
    delay: float = 0.0,
    hold: threading.Event | None = None,
) -> Step:
    """A response sent verbatim with any status and content type: the HTML page of a proxy, a
    body that is not JSON, or (with ``content_type="text/event-stream"``) a stream whose events
    are not JSON. Built in a responder, it can echo what the client sent."""
    return Step(
        kind="raw",
        status=status,
        body=body,
        headers={"content-type": content_type},
        delay=delay,
        hold=hold,
    )


def disconnect(*, delay: float = 0.0, hold: threading.Event | None = None) -> Step:
    """Close the connection without any answer, as a crashed model server would."""
    return Step(kind="disconnect", delay=delay, hold=hold)


def _text_of(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    return ""


@dataclass(frozen=True)
class ScriptedRequest:
    """A request as the server received it, with helpers that read both wire formats alike."""

    api: Api
    model: str
    body: dict[str, Any]
    headers: dict[str, str]
    index: int
    """0-based position among the requests for this model."""
    at: float = 0.0
    """When it arrived (``time.monotonic()``)."""

    @property
    def messages(self) -> list[dict[str, Any]]:
        return list(self.body.get("messages") or [])

    @property
    def stream(self) -> bool:
        return bool(self.body.get("stream"))

    @property
    def system(self) -> str:
        if self.api == "anthropic":
            return _text_of(self.body.get("system"))
        return "\n".join(
            _text_of(m.get("content"))
            for m in self.messages
            if m.get("role") in ("system", "developer")
        )

    @property
    def last_user_text(self) -> str:
        """Text of the latest user message that has text (Anthropic tool results travel in user
        messages, and those are skipped)."""
        for m in reversed(self.messages):
            if m.get("role") == "user" and (t := _text_of(m.get("content"))):
                return t
        return ""

    @property
    def tool_names(self) -> list[str]:
        tools = self.body.get("tools") or []
        if self.api == "anthropic":
            return [t.get("name", "") for t in tools]
        return [t.get("function", {}).get("name", "") for t in tools]

    @property
    def tool_results(self) -> list[str]:
        """Contents of every tool result in the transcript, oldest first."""
        out: list[str] = []
        for m in self.messages:
            if self.api == "openai" and m.get("role") == "tool":
                out.append(_text_of(m.get("content")))
            elif self.api == "anthropic" and isinstance(m.get("content"), list):
                out += [
                    _text_of(b.get("content"))
                    for b in m["content"]
                    if isinstance(b, dict) and b.get("type") == "tool_result"
                ]
        return out

    @property
    def last_message_is_tool_result(self) -> bool:
        if not self.messages:
            return False
        last = self.messages[-1]
        if self.api == "openai":
            return last.get("role") == "tool"
        content = last.get("content")
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_result" for b in content
        )


Responder = Callable[[ScriptedRequest], Step]

_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    529: "overloaded_error",
}
_OPENAI_TYPES: dict[int, tuple[str, str | None]] = {
    400: ("invalid_request_error", None),
    401: ("invalid_request_error", "invalid_api_key"),
    403: ("permission_error", None),
    404: ("invalid_request_error", "model_not_found"),
    429: ("requests", "rate_limit_exceeded"),
    500: ("server_error", None),
    503: ("server_error", None),
}


def _error_body(api: Api, step: Step) -> dict[str, Any] | str:
    if step.body is not None:
        return step.body
    if step.kind == "overflow":
        limit = step.context[1] or (200_000 if api == "anthropic" else 128_000)
        tokens = step.context[0] or limit + 3_072
        if api == "anthropic":
            msg = f"prompt is too long: {tokens} tokens > {limit} maximum"
            return {"type": "error", "error": {"type": "invalid_request_error", "message": msg}}
        msg = (
            f"This model's maximum context length is {limit} tokens. However, your messages "
            f"resulted in {tokens} tokens. Please reduce the length of the messages."
        )
        return {
            "error": {
                "message": msg,
                "type": "invalid_request_error",
                "param": "messages",
                "code": "context_length_exceeded",
            }
        }
    msg = step.message or f"scripted error {step.status}"
    if api == "anthropic":
        etype = step.error_type or _ANTHROPIC_TYPES.get(step.status, "api_error")
        return {"type": "error", "error": {"type": etype, "message": msg}}
    etype, code = _OPENAI_TYPES.get(step.status, ("server_error", None))
    return {
        "error": {"message": msg, "type": step.error_type or etype, "param": None, "code": code}
    }


def _pieces(s: str, size: int = _CHUNK) -> Iterator[str]:
    for i in range(0, len(s), size):
        yield s[i : i + size]


class ScriptedModelServer:
    """The scripted server; see the module docstring for why it exists.

    ``fallback`` answers for any model that has neither steps left nor a responder (the CLI's
    echo mode uses it); without one such requests get a loud 400.
    """

    def __init__(self, port: int = 0, *, fallback: Responder | None = None) -> None:
        self._port = port
        self._fallback = fallback
        self._cond = threading.Condition()
        self._steps: dict[str, deque[Step]] = {}
        self._responders: dict[str, Responder] = {}
        self._aliases: dict[str, str] = {}
        self._served: dict[str, int] = {}
        self._counts: dict[str, int] = {}
        self._call_ids: dict[str, int] = {}
        self._requests: list[ScriptedRequest] = []
        self._stopping = threading.Event()
        self._httpd: _HTTPServer | None = None
        self._thread: threading.Thread | None = None
        self._connections: set[socket.socket] = set()
        self._in_flight: dict[str, int] = {}
        self._peak_in_flight: dict[str, int] = {}

    # -- lifecycle ------------------------------------------------------------------------------

    def start(self) -> Self:
        if self._httpd is not None:
            return self
        self._stopping.clear()
        self._httpd = _HTTPServer(("127.0.0.1", self._port), _Handler)
        self._httpd.owner = self
        self._thread = threading.Thread(
            target=self._httpd.serve_forever,
            kwargs={"poll_interval": 0.05},
            name="scripted-model-server",
            daemon=True,
        )
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and cut every open connection, the way a crashed server would: held or
        delayed responses are dropped, and pooled keep-alive connections see the socket close.
        A later :meth:`start` listens on the same port again, so ``base_url`` stays valid."""
        if self._httpd is None:
            return
        self._port = self.port
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        with self._cond:
            connections, self._connections = list(self._connections), set()
        for conn in connections:
            try:
                conn.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._httpd = self._thread = None

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def port(self) -> int:
        if self._httpd is None:
            raise RuntimeError("ScriptedModelServer is not started")
        return int(self._httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    # -- scripting ------------------------------------------------------------------------------

    def script(self, model: str, steps: list[Step]) -> None:
        """Append ``steps`` to the model's queue (steps are consumed first in, first out)."""
        with self._cond:
            self._steps.setdefault(model, deque()).extend(steps)

    def respond(self, model: str, responder: Responder) -> None:
        """Answer the model's requests with ``responder(request)`` once its queued steps are
        used up, for conversations whose length a test does not know in advance."""
        with self._cond:
            self._responders[model] = responder

    def alias(self, name: str, model: str) -> None:
        """Serve, count and list requests naming ``name`` as ``model``'s (the request's body
        keeps the name it was sent with): a deploy that gave an agent another model, whose
        runs a test follows as one conversation."""
        with self._cond:
            self._aliases[name] = model

    def remaining(self, model: str) -> int:
        with self._cond:
            return len(self._steps.get(model, ()))

    def requests(self, model: str | None = None) -> list[ScriptedRequest]:
        with self._cond:
            return [r for r in self._requests if model is None or r.model == model]

    def request_count(self, model: str | None = None) -> int:
        with self._cond:
            return len(self._requests) if model is None else self._counts.get(model, 0)

    def peak_in_flight(self, model: str) -> int:
        """The most requests for ``model`` the server was answering at one time (a request is
        in flight from its arrival until its answer is written)."""
        with self._cond:
            return self._peak_in_flight.get(model, 0)

    def _enter(self, model: str) -> None:
        with self._cond:
            n = self._in_flight[model] = self._in_flight.get(model, 0) + 1
            self._peak_in_flight[model] = max(self._peak_in_flight.get(model, 0), n)

    def _leave(self, model: str) -> None:
        with self._cond:
            self._in_flight[model] -= 1

    def wait_for_requests(self, model: str, n: int, timeout: float = 10.0) -> list[ScriptedRequest]:
        """Block until ``n`` requests for ``model`` arrived, so a test can act (kill a worker,
        set a hold event) at a known point of a run."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while (count := self._counts.get(model, 0)) < n:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(
                        f"scripted model {model!r} got {count} request(s), expected {n}"
                    )
                self._cond.wait(left)
            return [r for r in self._requests if r.model == model]

    # -- serving --------------------------------------------------------------------------------

    def _record_and_pick(
        self, api: Api, body: dict[str, Any], headers: dict[str, str]
    ) -> tuple[ScriptedRequest, Step]:
        with self._cond:
            model = str(body.get("model", ""))
            model = self._aliases.get(model, model)
            index = self._counts.get(model, 0)
            self._counts[model] = index + 1
            req = ScriptedRequest(api, model, body, headers, index, time.monotonic())
            self._requests.append(req)
            self._cond.notify_all()
            queue = self._steps.get(model)
            step = queue.popleft() if queue else None
            responder = None if step else self._responders.get(model, self._fallback)
            served = self._served.get(model, 0)
            if step is not None or responder is not None:
                self._served[model] = served + 1
        if step is None and responder is not None:
            try:
                step = responder(req)
            except Exception as exc:  # noqa: BLE001 - the test must see it, not a hang
                return req, error(500, message=f"scripted responder for {model!r} raised {exc!r}")
        if step is None:
            msg = f"scripted model {model!r} has no step left ({served} requests served)"
            return req, error(400, message=msg)
        return req, step

    def _call_id(self, model: str) -> str:
        with self._cond:
            n = self._call_ids[model] = self._call_ids.get(model, 0) + 1
        return f"call_{re.sub(r'[^A-Za-z0-9_-]', '_', model)}_{n}"

    def _wait(self, step: Step) -> bool:
        """Apply the step's delay and hold; False when the server stopped meanwhile."""
        if step.delay and self._stopping.wait(step.delay):
            return False
        while step.hold is not None and not step.hold.wait(0.05):
            if self._stopping.is_set():
                return False
        return not self._stopping.is_set()


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256  # many concurrent runs (benchmarks) connect at once
    owner: ScriptedModelServer

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A caller that went away (a killed worker, a cancelled activity) is part of the script's
        # world, not a server fault: no traceback for it.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes; with Nagle's algorithm the second waits for
    # the client's delayed ACK (~40 ms a call).
    disable_nagle_algorithm = True
    server: _HTTPServer

    def setup(self) -> None:
        super().setup()
        with self.server.owner._cond:
            self.server.owner._connections.add(self.connection)

    def finish(self) -> None:
        with self.server.owner._cond:
            self.server.owner._connections.discard(self.connection)
        super().finish()

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per request would drown the test output

    def do_GET(self) -> None:
        if self.path.rstrip("/") == "/health":
            self._send_json(200, {"status": "ok"})
        else:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})

    def do_POST(self) -> None:
        path = self.path.split("?")[0].rstrip("/")
        routes: dict[str, Api] = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}
        api = routes.get(path)
        raw = self.rfile.read(int(self.headers.get("content-length") or 0))
        if api is None:
            self._send_json(404, {"error": {"message": f"no route {self.path}"}})
            return
        try:
            body = json.loads(raw or b"{}")
            assert isinstance(body, dict)
        except (ValueError, AssertionError):
            self._send_json(400, _error_body(api, error(400, message="body is not a JSON object")))
            return
        owner = self.server.owner
        if owner._stopping.is_set():
            self.close_connection = True
            return
        headers = {k.lower(): v for k, v in self.headers.items()}
        model = str(body.get("model", ""))
        owner._enter(model)
        try:
            self._answer(owner, api, body, headers)
        finally:
            owner._leave(model)

    def _answer(
        self, owner: ScriptedModelServer, api: Api, body: dict[str, Any], headers: dict[str, str]
    ) -> None:
        req, step = owner._record_and_pick(api, body, headers)
        if not owner._wait(step) or step.kind == "disconnect":
            self.close_connection = True
            return
        if step.kind == "raw":
            self._send_raw(step)
            return
        if step.kind in ("error", "overflow"):
            self._send_json(step.status, _error_body(api, step), step.headers)
            return
        ids = [tc.id if tc.id is not None else owner._call_id(req.model) for tc in step.calls]
        rid = f"{req.model}-{req.index + 1}"
        if api == "openai":
            if req.stream:
                self._stream_openai(req, step, ids, f"chatcmpl-{rid}")
            else:
                self._send_json(200, _openai_body(req, step, ids, f"chatcmpl-{rid}"))
        elif req.stream:
            self._stream_anthropic(req, step, ids, f"msg_{rid}")
        else:
            self._send_json(200, _anthropic_body(req, step, ids, f"msg_{rid}"))

    def _send_json(
        self, status: int, payload: dict[str, Any] | str, headers: dict[str, str] | None = None
    ) -> None:
        data = (payload if isinstance(payload, str) else json.dumps(payload)).encode()
        self.send_response(status)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _send_raw(self, step: Step) -> None:
        data = str(step.body or "").encode()
        self.send_response(step.status)
        for k, v in step.headers.items():
            self.send_header(k, v)
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _start_sse(self) -> None:
        self.send_response(200)
        self.send_header("content-type", "text/event-stream")
        self.send_header("cache-control", "no-cache")
        self.send_header("transfer-encoding", "chunked")
        self.end_headers()

    def _chunk(self, data: str) -> None:
        raw = data.encode()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def _stream_openai(self, req: ScriptedRequest, step: Step, ids: list[str], rid: str) -> None:
        include_usage = bool((req.body.get("stream_options") or {}).get("include_usage"))
        base = {
            "id": rid,
            "object": "chat.completion.chunk",
            "created": int(time.time()),
            "model": req.model,
        }

        def emit(delta: dict[str, Any], finish: str | None = None) -> None:
            chunk = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            if include_usage:
                chunk["usage"] = None
            self._chunk(f"data: {json.dumps(chunk)}\n\n")

        self._start_sse()
        emit({"role": "assistant", "content": ""})
        for piece in _pieces(step.text):
            emit({"content": piece})
        for i, (tc, cid) in enumerate(zip(step.calls, ids, strict=True)):
            emit(
                {
                    "tool_calls": [
                        {
                            "index": i,
                            "id": cid,
                            "type": "function",
                            "function": {"name": tc.name, "arguments": ""},
                        }
                    ]
                }
            )
            for piece in _pieces(tc.arguments_json()):
                emit({"tool_calls": [{"index": i, "function": {"arguments": piece}}]})
        emit({}, _openai_finish(step))
        if include_usage:
            usage = _openai_usage(step)
            self._chunk(f"data: {json.dumps({**base, 'choices': [], 'usage': usage})}\n\n")
        self._chunk("data: [DONE]\n\n")
        self._chunk("")

    def _stream_anthropic(self, req: ScriptedRequest, step: Step, ids: list[str], rid: str) -> None:
        def emit(name: str, payload: dict[str, Any]) -> None:
            self._chunk(f"event: {name}\ndata: {json.dumps({'type': name, **payload})}\n\n")

        self._start_sse()
        message = {**_anthropic_body(req, step, ids, rid), "content": [], "stop_reason": None}
        message["usage"] = {**_anthropic_usage(step), "output_tokens": 1}
        emit("message_start", {"message": message})
        emit("ping", {})
        index = 0
        if step.text:
            emit("content_block_start", {"index": 0, "content_block": {"type": "text", "text": ""}})
            for piece in _pieces(step.text):
                emit(
                    "content_block_delta",
                    {"index": 0, "delta": {"type": "text_delta", "text": piece}},
                )
            emit("content_block_stop", {"index": 0})
            index = 1
        for tc, cid in zip(step.calls, ids, strict=True):
            block = {"type": "tool_use", "id": cid, "name": tc.name, "input": {}}
            emit("content_block_start", {"index": index, "content_block": block})
            for piece in _pieces(tc.arguments_json()):
                emit(
                    "content_block_delta",
                    {"index": index, "delta": {"type": "input_json_delta", "partial_json": piece}},
                )
            emit("content_block_stop", {"index": index})
            index += 1
        emit(
            "message_delta",
            {
                "delta": {"stop_reason": _anthropic_stop(step), "stop_sequence": None},
                "usage": {"output_tokens": step.usage[1]},
            },
        )
        emit("message_stop", {})
        self._chunk("")


def _openai_finish(step: Step) -> str:
    return "tool_calls" if step.calls else ("length" if step.truncated else "stop")


def _anthropic_stop(step: Step) -> str:
    return "tool_use" if step.calls else ("max_tokens" if step.truncated else "end_turn")


def _openai_usage(step: Step) -> dict[str, Any]:
    i, o = step.usage
    usage: dict[str, Any] = {"prompt_tokens": i, "completion_tokens": o, "total_tokens": i + o}
    if step.cached:
        usage["prompt_tokens_details"] = {"cached_tokens": step.cached}
    return usage


def _anthropic_usage(step: Step) -> dict[str, int]:
    """Anthropic reports cache reads beside the uncached input, not inside it."""
    i, o = step.usage
    usage = {"input_tokens": i - step.cached, "output_tokens": o}
    if step.cached:
        usage["cache_read_input_tokens"] = step.cached
    return usage


def _openai_body(req: ScriptedRequest, step: Step, ids: list[str], rid: str) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": step.text or None}
    if step.calls:
        message["tool_calls"] = [
            {
                "id": cid,
                "type": "function",
                "function": {"name": tc.name, "arguments": tc.arguments_json()},
            }
            for tc, cid in zip(step.calls, ids, strict=True)
        ]
    return {
        "id": rid,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": req.model,
        "usage": _openai_usage(step),
        "choices": [{"index": 0, "message": message, "finish_reason": _openai_finish(step)}],
    }


def _anthropic_input(tc: ToolCall) -> Any:
    """The non-streaming format carries ``input`` as an object, so malformed ``raw_arguments``
    cannot be sent faithfully; they go out as a JSON string for the client to reject."""
    try:
        return json.loads(tc.arguments_json())
    except ValueError:
        return tc.arguments_json()


def _anthropic_body(req: ScriptedRequest, step: Step, ids: list[str], rid: str) -> dict[str, Any]:
    content: list[dict[str, Any]] = [{"type": "text", "text": step.text}] if step.text else []
    content += [
        {"type": "tool_use", "id": cid, "name": tc.name, "input": _anthropic_input(tc)}
        for tc, cid in zip(step.calls, ids, strict=True)
    ]
    return {
        "id": rid,
        "type": "message",
        "role": "assistant",
        "model": req.model,
        "content": content,
        "stop_reason": _anthropic_stop(step),
        "stop_sequence": None,
        "usage": _anthropic_usage(step),
    }


_CALL_RE = re.compile(r"^\s*call\s+([A-Za-z0-9_.-]+)\s*(\{.*\})?\s*$", re.DOTALL)


def echo(req: ScriptedRequest) -> Step:
    """The demo rule: after a tool result, report it; ``call NAME {json}`` calls an offered tool;
    anything else is echoed back."""
    if req.last_message_is_tool_result:
        return text("tool said: " + (req.tool_results[-1] if req.tool_results else ""))
    said = req.last_user_text
    match = _CALL_RE.match(said)
    if match and match.group(1) in req.tool_names:
        return call(match.group(1), raw_arguments=match.group(2) or "{}")
    return text("echo: " + said)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Serve scripted OpenAI/Anthropic responses.")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--echo", action="store_true", help="answer every model with the echo rule")
    args = parser.parse_args(argv)
    server = ScriptedModelServer(args.port, fallback=echo if args.echo else None).start()
    print(f"scripted model server on {server.base_url} (OpenAI: {server.base_url}/v1)", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
