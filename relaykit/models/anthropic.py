"""The Anthropic Messages wire format.

Like :mod:`relaykit.models.openai`, this module only translates between relaykit's transcript
and request/response bodies; HTTP and error classification live in
:mod:`relaykit.models.providers`. Parsing functions raise :class:`ValueError`,
``TypeError`` or ``KeyError`` on an unexpected body.

Decisions worth knowing:

- Tool results become ``tool_result`` blocks in a ``user`` message, with Anthropic's own
  ``is_error`` flag (the content is sent unchanged).
- Consecutive messages of the same role are merged into one, since the API requires roles to
  alternate; within a user message, ``tool_result`` blocks are put first, as the API requires.
- An assistant tool call whose arguments are not a JSON object (possible only in a transcript
  written by another provider's model) is sent with ``{"_raw_arguments": "<the text>"}`` as its
  input: the API needs an object, and keeping the text lets the model see what went wrong when it
  reads the error result of that call.
- Anthropic has no ``response_format``: an output schema is added to the system prompt with an
  instruction to answer with only JSON; the answer is validated by the caller as usual.
- ``request.reminder`` is added as a text block to the last user turn (or as a final user
  message when the transcript ends with the assistant).
- ``input_tokens`` counts cache writes and reads too, because budgets are about tokens spent.
"""

from __future__ import annotations

import json
from typing import Any

from relaykit.messages import Message, ModelResponse, OutputSpec, ToolCall, Usage
from relaykit.models.spec import ModelRequest

#: Anthropic requires ``max_tokens``; used when the agent's settings leave it unset.
DEFAULT_MAX_TOKENS = 4096


def build_request(request: ModelRequest) -> dict[str, Any]:
    """The JSON body of ``POST /v1/messages`` for ``request``."""
    spec = request.model
    settings = request.settings
    body: dict[str, Any] = {
        "model": spec.name,
        "max_tokens": settings.max_tokens
        if settings.max_tokens is not None
        else DEFAULT_MAX_TOKENS,
    }
    system = _system(request.system, request.output, bool(request.tools))
    if system:
        body["system"] = system
    body["messages"] = _messages(request)
    if request.tools:
        body["tools"] = [
            {"name": t.name, "description": t.description, "input_schema": t.parameters}
            for t in request.tools
        ]
        choice = _tool_choice(settings.tool_choice, settings.parallel_tool_calls)
        if choice is not None:
            body["tool_choice"] = choice
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if settings.top_p is not None:
        body["top_p"] = settings.top_p
    if spec.stream:
        body["stream"] = True
    body.update(settings.extra_body)
    return body


def _tool_choice(choice: str | None, parallel: bool | None) -> dict[str, Any] | None:
    if choice is None and parallel is None:
        return None
    kind = {"auto": "auto", "required": "any", "none": "none", None: "auto"}[choice]
    out: dict[str, Any] = {"type": kind}
    if parallel is False and kind != "none":
        out["disable_parallel_tool_use"] = True
    return out


def output_instructions(output: OutputSpec, has_tools: bool) -> str:
    """What replaces ``response_format``: the schema, and how the final answer must look."""
    when = "When you give your final answer, answer" if has_tools else "Answer"
    return (
        f"{when} with only a JSON value (no prose, no code fences) that matches this JSON "
        f"schema, named {output.name!r}:\n{json.dumps(output.json_schema, ensure_ascii=False)}"
    )


def _system(system: str, output: OutputSpec | None, has_tools: bool) -> str:
    if output is None:
        return system
    extra = output_instructions(output, has_tools)
    return f"{system}\n\n{extra}" if system else extra


def _tool_input(arguments: str) -> dict[str, Any]:
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {"_raw_arguments": arguments}
    if isinstance(value, dict):
        return value
    return {"_raw_arguments": arguments}


def _blocks(m: Message) -> tuple[str, list[dict[str, Any]]]:
    if m.role == "user":
        return "user", ([{"type": "text", "text": m.content}] if m.content else [])
    if m.role == "assistant":
        blocks: list[dict[str, Any]] = []
        if m.content:
            blocks.append({"type": "text", "text": m.content})
        for c in m.tool_calls:
            blocks.append(
                {"type": "tool_use", "id": c.id, "name": c.name, "input": _tool_input(c.arguments)}
            )
        return "assistant", blocks
    result: dict[str, Any] = {"type": "tool_result", "tool_use_id": m.tool_call_id or ""}
    if m.content:
        # The API rejects an empty text block; an absent content is an empty result.
        result["content"] = m.content
    if m.is_error:
        result["is_error"] = True
    return "user", [result]


def _messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for m in request.messages:
        role, blocks = _blocks(m)
        if not blocks:
            continue  # empty text is rejected by the API and carries nothing
        if out and out[-1]["role"] == role:
            out[-1]["content"].extend(blocks)
        else:
            out.append({"role": role, "content": blocks})
    if request.reminder:
        reminder = {"type": "text", "text": request.reminder}
        if out and out[-1]["role"] == "user":
            out[-1]["content"].append(reminder)
        else:
            out.append({"role": "user", "content": [reminder]})
    for entry in out:
        if entry["role"] == "user":
            # Stable: tool results keep their order, and so does the text after them.
            entry["content"].sort(key=lambda b: b.get("type") != "tool_result")
    return out


# --------------------------------------------------------------------------------------------
# Response parsing
# --------------------------------------------------------------------------------------------


def _usage(data: Any, into: Usage | None = None) -> Usage:
    usage = into or Usage(requests=1)
    if not isinstance(data, dict):
        return usage
    inputs = [
        data.get(k)
        for k in ("input_tokens", "cache_creation_input_tokens", "cache_read_input_tokens")
    ]
    if any(v is not None for v in inputs):
        usage = usage.model_copy(
            update={
                "input_tokens": sum(int(v or 0) for v in inputs),
                "cached_input_tokens": int(data.get("cache_read_input_tokens") or 0),
            }
        )
    if data.get("output_tokens") is not None:
        usage = usage.model_copy(update={"output_tokens": int(data["output_tokens"])})
    return usage


def _arguments(block: dict[str, Any]) -> str:
    """``input`` is an object from the real API; a compatible server that passes the model's
    text through as a string keeps it as written, so bad JSON reaches the tool path."""
    value = block.get("input")
    if isinstance(value, str):
        return value
    return json.dumps(value if value is not None else {}, ensure_ascii=False)


def parse_response(data: Any, request: ModelRequest) -> ModelResponse:
    """A non-streaming Messages body as a :class:`ModelResponse`."""
    if not isinstance(data, dict):
        raise TypeError("the body is not a JSON object")
    content = data.get("content")
    if not isinstance(content, list):
        raise TypeError("the body has no 'content' list")
    texts: list[str] = []
    calls: list[ToolCall] = []
    for block in content:
        kind = block.get("type")
        if kind == "text":
            texts.append(str(block.get("text", "")))
        elif kind == "tool_use":
            calls.append(
                ToolCall(id=str(block["id"]), name=str(block["name"]), arguments=_arguments(block))
            )
        # thinking and other block kinds are not part of the transcript
    return ModelResponse(
        message=Message.assistant("".join(texts), calls),
        usage=_usage(data.get("usage")),
        model=str(data.get("model") or request.model.name),
        finish_reason=data.get("stop_reason"),
    )


def _stream_arguments(block: dict[str, Any]) -> str:
    """The streamed input, serialised exactly as :func:`parse_response` would, so a streamed and
    a non-streamed call give the same transcript."""
    raw = "".join(block.get("partial", []))
    if not raw.strip():
        return _arguments(block)
    try:
        return json.dumps(json.loads(raw), ensure_ascii=False)
    except ValueError:
        return raw


class StreamAccumulator:
    """Reassembles a Messages SSE stream into the response a non-streaming call returns.

    Blocks are keyed by their ``index``; a tool call's input arrives as ``input_json_delta``
    fragments that only make a JSON object once concatenated.
    """

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        self._blocks: dict[int, dict[str, Any]] = {}
        self._usage = Usage(requests=1)
        self._model = ""
        self._stop_reason: str | None = None
        self._stopped = False

    @property
    def complete(self) -> bool:
        """Whether the stream reached its end rather than being cut off."""
        return self._stopped or self._stop_reason is not None

    def feed(self, event: Any) -> str | None:
        """Take one ``data:`` payload; returns the text to publish as a delta, if any."""
        if not isinstance(event, dict):
            raise TypeError("a stream event is not a JSON object")
        kind = event.get("type")
        if kind == "message_start":
            message = event.get("message") or {}
            self._model = str(message.get("model") or "")
            self._usage = _usage(message.get("usage"), self._usage)
        elif kind == "content_block_start":
            block = dict(event["content_block"])
            if block.get("type") == "tool_use":
                block["partial"] = []
            self._blocks[int(event["index"])] = block
            if block.get("type") == "text" and block.get("text"):
                return str(block["text"])
        elif kind == "content_block_delta":
            block = self._blocks.setdefault(int(event["index"]), {"type": "text", "text": ""})
            delta = event.get("delta") or {}
            if delta.get("type") == "text_delta":
                piece = str(delta.get("text", ""))
                block["text"] = block.get("text", "") + piece
                return piece or None
            if delta.get("type") == "input_json_delta":
                block.setdefault("partial", []).append(str(delta.get("partial_json", "")))
        elif kind == "message_delta":
            delta = event.get("delta") or {}
            if delta.get("stop_reason"):
                self._stop_reason = delta["stop_reason"]
            self._usage = _usage(event.get("usage"), self._usage)
        elif kind == "message_stop":
            self._stopped = True
        return None

    def final_delta(self) -> str | None:
        """Nothing is held back: every text delta was published as it came."""
        return None

    def result(self) -> ModelResponse:
        texts: list[str] = []
        calls: list[ToolCall] = []
        for i in sorted(self._blocks):
            block = self._blocks[i]
            if block.get("type") == "text":
                texts.append(str(block.get("text", "")))
            elif block.get("type") == "tool_use":
                arguments = _stream_arguments(block)
                calls.append(
                    ToolCall(id=str(block["id"]), name=str(block["name"]), arguments=arguments)
                )
        return ModelResponse(
            message=Message.assistant("".join(texts), calls),
            usage=self._usage,
            model=self._model or self.request.model.name,
            finish_reason=self._stop_reason,
        )
