"""The OpenAI chat-completions wire format (also spoken by llama.cpp, vLLM, Ollama, LM Studio).

This module only translates: a :class:`~relaykit.models.spec.ModelRequest` into a request body,
and a response body (or the events of an SSE stream) back into a
:class:`~relaykit.messages.ModelResponse`. HTTP, endpoints, keys and error classification live
in :mod:`relaykit.models.providers`, so that every provider fails the same way.

Parsing functions raise :class:`ValueError`, ``TypeError`` or ``KeyError`` on a body that is not
the expected shape; the caller turns that into a non-retryable ``ModelCallFailed``.

Decisions worth knowing:

- A tool result with ``is_error`` is sent with its content prefixed by ``"Error: "`` (unless it
  already starts with "error"), because the chat-completions ``tool`` message has no error flag
  and the model would otherwise read a failure as an ordinary result.
- ``request.reminder`` is sent as a final ``user`` message and never stored.
- In constrained tool-call mode (``ModelSpec.tool_calls == "constrained"``) the model is asked for
  one JSON object, held to a schema by the server's grammar: ``{"name": ..., "arguments": ...}``
  to call a tool or ``{"reply": ...}`` to answer. When ``request.output`` is also set, the
  ``reply`` value must match the output schema (instead of being a string), so the final answer is
  as constrained as a tool call; its text is then the JSON of that value.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

from relaykit.messages import Message, ModelResponse, OutputSpec, ToolCall, ToolSpec, Usage
from relaykit.models.spec import ModelRequest

#: Name of the json_schema sent in constrained tool-call mode.
CONSTRAINED_SCHEMA_NAME = "tool_call_or_reply"


# --------------------------------------------------------------------------------------------
# Request building
# --------------------------------------------------------------------------------------------


def build_request(request: ModelRequest, *, max_tokens_field: str = "max_tokens") -> dict[str, Any]:
    """The JSON body of ``POST /chat/completions`` for ``request``.

    ``max_tokens_field`` exists because OpenAI's own reasoning models only accept
    ``max_completion_tokens`` while most compatible servers only know ``max_tokens``; the caller
    knows which server it is talking to.
    """
    spec = request.model
    settings = request.settings
    constrained = spec.tool_calls == "constrained"
    tools = _constrained_tools(request) if constrained else request.tools

    body: dict[str, Any] = {"model": spec.name}
    if constrained:
        body["messages"] = _constrained_messages(request, tools)
    else:
        body["messages"] = _native_messages(request)

    if constrained:
        schema = constrained_schema(request)
        if schema is not None:
            name = CONSTRAINED_SCHEMA_NAME if tools else _schema_name(request.output)
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {"name": name, "schema": schema},
            }
    else:
        if tools:
            body["tools"] = [_tool_json(t) for t in tools]
            if settings.tool_choice is not None:
                body["tool_choice"] = settings.tool_choice
            if settings.parallel_tool_calls is not None:
                body["parallel_tool_calls"] = settings.parallel_tool_calls
        if request.output is not None:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": _schema_name(request.output),
                    "schema": request.output.json_schema,
                },
            }

    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if settings.top_p is not None:
        body["top_p"] = settings.top_p
    if settings.max_tokens is not None:
        body[max_tokens_field] = settings.max_tokens
    if spec.stream:
        body["stream"] = True
        body["stream_options"] = {"include_usage": True}
    body.update(settings.extra_body)
    return body


def _tool_json(tool: ToolSpec) -> dict[str, Any]:
    return {
        "type": "function",
        "function": {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.parameters,
        },
    }


def _schema_name(output: OutputSpec | None) -> str:
    """OpenAI rejects schema names outside ``[A-Za-z0-9_-]{1,64}``; a readable name is only a
    hint to the model, so it is cleaned rather than refused."""
    raw = output.name if output is not None else "final_output"
    name = re.sub(r"[^A-Za-z0-9_-]", "_", raw)[:64]
    return name or "final_output"


def error_prefixed(content: str) -> str:
    """The text of a failed tool result, marked so the model cannot mistake it for success."""
    if content.lstrip().lower().startswith("error"):
        return content
    return f"Error: {content}"


def _native_messages(request: ModelRequest) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    if request.system:
        out.append({"role": "system", "content": request.system})
    for m in request.messages:
        if m.role == "user":
            out.append({"role": "user", "content": m.content})
        elif m.role == "assistant":
            entry: dict[str, Any] = {"role": "assistant"}
            if m.tool_calls:
                entry["content"] = m.content or None
                entry["tool_calls"] = [
                    {
                        "id": c.id,
                        "type": "function",
                        "function": {"name": c.name, "arguments": c.arguments},
                    }
                    for c in m.tool_calls
                ]
            else:
                entry["content"] = m.content
            out.append(entry)
        else:  # tool
            out.append(
                {
                    "role": "tool",
                    "tool_call_id": m.tool_call_id or "",
                    "content": error_prefixed(m.content) if m.is_error else m.content,
                }
            )
    if request.reminder:
        out.append({"role": "user", "content": request.reminder})
    return out


# --------------------------------------------------------------------------------------------
# Constrained tool calls
# --------------------------------------------------------------------------------------------


def _constrained_tools(request: ModelRequest) -> list[ToolSpec]:
    """The tools the model may call this turn: none when ``tool_choice == "none"``, so the
    grammar itself forbids a call."""
    if request.settings.tool_choice == "none":
        return []
    return list(request.tools)


_REPLY_ONLY: dict[str, Any] = {
    "type": "object",
    "properties": {"reply": {"type": "string"}},
    "required": ["reply"],
}


def constrained_schema(request: ModelRequest) -> dict[str, Any] | None:
    """The JSON schema the server's grammar must hold the answer to, or ``None`` when the answer
    is free text (no tools and no output schema)."""
    tools = _constrained_tools(request)
    if not tools:
        if request.output is not None:
            return request.output.json_schema
        if request.tools:  # tools withheld this turn: keep the reply envelope the model knows
            return _REPLY_ONLY
        return None
    options: list[dict[str, Any]] = [
        {
            "type": "object",
            "properties": {"name": {"const": t.name}, "arguments": t.parameters},
            "required": ["name", "arguments"],
        }
        for t in tools
    ]
    if request.settings.tool_choice != "required":
        reply: dict[str, Any] = (
            request.output.json_schema if request.output is not None else {"type": "string"}
        )
        options.append({"type": "object", "properties": {"reply": reply}, "required": ["reply"]})
    return {"anyOf": options}


def _constrained_instructions(request: ModelRequest, tools: list[ToolSpec]) -> str:
    lines = ["You can use these tools:"]
    for t in tools:
        lines.append(f"- {t.name}: {t.description}" if t.description else f"- {t.name}")
    lines.append("")
    lines.append(
        'To use a tool, answer with only a JSON object {"name": "<tool name>", '
        '"arguments": {<the tool\'s arguments>}}; you will then be told what it returned. '
        "Use one tool at a time."
    )
    if request.settings.tool_choice == "required":
        lines.append("You must use a tool in this answer.")
    elif request.output is not None:
        lines.append(
            'When you have the final answer, answer with only {"reply": <the final answer as a '
            "JSON value matching the required schema>}."
        )
    else:
        lines.append('To answer without a tool, answer with only {"reply": "<your answer>"}.')
    return "\n".join(lines)


def _render_call(call: ToolCall) -> str:
    try:
        args: Any = json.loads(call.arguments)
    except ValueError:
        args = call.arguments
    return json.dumps({"name": call.name, "arguments": args}, ensure_ascii=False)


def _constrained_messages(request: ModelRequest, tools: list[ToolSpec]) -> list[dict[str, Any]]:
    """The transcript in plain user/assistant turns, since the server has no tool format.

    Consecutive turns of the same role are merged because many chat templates of local models
    refuse a conversation whose roles do not alternate.
    """
    system = request.system
    if tools:
        instructions = _constrained_instructions(request, tools)
        system = f"{system}\n\n{instructions}" if system else instructions
    elif request.tools and request.output is None:
        instructions = 'Give your final answer now, without tools, as {"reply": "<your answer>"}.'
        system = f"{system}\n\n{instructions}" if system else instructions

    turns: list[tuple[str, str]] = []
    for m in request.messages:
        if m.role == "user":
            turns.append(("user", m.content))
        elif m.role == "assistant":
            parts = [m.content] if m.content else []
            parts.extend(_render_call(c) for c in m.tool_calls)
            turns.append(("assistant", "\n".join(parts)))
        else:
            name = m.name or "tool"
            if m.is_error:
                turns.append(("user", f"Tool {name} failed: {m.content}"))
            else:
                turns.append(("user", f"Tool {name} returned: {m.content}"))
    if request.reminder:
        turns.append(("user", request.reminder))

    merged: list[dict[str, Any]] = []
    if system:
        merged.append({"role": "system", "content": system})
    for role, text in turns:
        if merged and merged[-1]["role"] == role and role != "system":
            merged[-1]["content"] = f"{merged[-1]['content']}\n\n{text}"
        else:
            merged.append({"role": role, "content": text})
    return merged


def constrained_call_id(content: str, message_count: int) -> str:
    """A tool-call id for an answer that carried none. It must be the same on every attempt that
    gets the same answer, so it is derived from the answer and the transcript position."""
    digest = hashlib.sha256(f"{message_count}\x00{content}".encode()).hexdigest()
    return f"call_{digest[:8]}"


_FENCE = re.compile(r"^\s*```(?:json)?\s*(.*?)\s*```\s*$", re.DOTALL)


def parse_constrained(text: str, request: ModelRequest) -> Message:
    """Turn a constrained answer into a tool call or a reply.

    Anything that is not one of the expected objects is kept as plain text, so a server that
    ignored the grammar degrades to an ordinary reply instead of a failed call.
    """
    if not _constrained_tools(request):
        if request.tools and request.output is None:  # tools withheld: the reply envelope
            try:
                data = json.loads(text)
            except ValueError:
                data = None
            if isinstance(data, dict) and isinstance(data.get("reply"), str):
                return Message.assistant(data["reply"])
        return Message.assistant(text)
    candidate = text
    fenced = _FENCE.match(text)
    if fenced:
        candidate = fenced.group(1)
    try:
        data = json.loads(candidate)
    except ValueError:
        return Message.assistant(text)
    if not isinstance(data, dict):
        return Message.assistant(text)
    name = data.get("name")
    if isinstance(name, str) and name and "arguments" in data:
        args = data["arguments"]
        arguments = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
        call = ToolCall(
            id=constrained_call_id(text, len(request.messages)),
            name=name,
            arguments=arguments,
        )
        return Message.assistant("", [call])
    if "reply" in data:
        reply = data["reply"]
        return Message.assistant(
            reply if isinstance(reply, str) else json.dumps(reply, ensure_ascii=False)
        )
    return Message.assistant(text)


# --------------------------------------------------------------------------------------------
# Response parsing
# --------------------------------------------------------------------------------------------


def _text_of(content: Any) -> str:
    """Message content is a string for OpenAI, but some compatible servers send content parts."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            p.get("text", "") for p in content if isinstance(p, dict) and p.get("type") == "text"
        )
    raise TypeError(f"unexpected message content {type(content).__name__}")


def _usage(data: Any) -> Usage:
    if not isinstance(data, dict):
        return Usage(requests=1)
    details = data.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return Usage(
        requests=1,
        input_tokens=int(data.get("prompt_tokens") or 0),
        output_tokens=int(data.get("completion_tokens") or 0),
        cached_input_tokens=int(cached or 0),
    )


def close_truncated_json(text: str) -> str | None:
    """Complete a JSON value that a token limit cut short, or ``None`` if that is not possible.

    A constrained answer is valid JSON up to where ``max_tokens`` stopped it, so closing the
    open string, dropping a dangling key or separator, and closing the open objects and arrays
    turns it into the call or reply the model was writing (with a shortened last value), instead
    of raw JSON reaching the user as the answer.
    """
    scanned = _scan(text)
    if scanned is None:
        return None
    stack, in_string, escaped = scanned
    if not stack and not in_string:
        return None  # complete (or not JSON at all): nothing to close
    body = text
    if in_string:
        if escaped:
            body = body[:-1]
        body += '"'
    candidates = [body]
    # A dangling key, colon or comma: drop back to the last complete member.
    for cut in (body.rfind(","), body.rfind("{"), body.rfind("[")):
        if cut > 0:
            candidates.append(body[: cut + (1 if body[cut] in "{[" else 0)])
    for candidate in candidates:
        closing = _closers(candidate)
        if closing is None:
            continue
        try:
            json.loads(candidate + closing)
        except ValueError:
            continue
        return candidate + closing
    return None


def _scan(text: str) -> tuple[list[str], bool, bool] | None:
    """The closers still owed after ``text`` (innermost last), whether it ends inside a string
    and right after a backslash there; ``None`` if it closes more than it opened."""
    stack: list[str] = []
    in_string = escaped = False
    for ch in text:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]":
            if not stack:
                return None
            stack.pop()
    return stack, in_string, escaped


def _closers(text: str) -> str | None:
    scanned = _scan(text)
    if scanned is None or scanned[1]:
        return None
    return "".join(reversed(scanned[0]))


def _finish(
    request: ModelRequest,
    text: str,
    calls: list[ToolCall],
    usage: Usage,
    model: str,
    finish_reason: str | None,
) -> ModelResponse:
    if request.model.tool_calls == "constrained":
        if finish_reason == "length" and constrained_schema(request) is not None:
            text = close_truncated_json(text) or text  # cut short by max_tokens
        message = parse_constrained(text, request)
        if message.tool_calls and finish_reason == "stop":
            finish_reason = "tool_calls"
    else:
        message = Message.assistant(text, calls)
    return ModelResponse(
        message=message,
        usage=usage,
        model=model or request.model.name,
        finish_reason=finish_reason,
    )


def _call_id(raw: Any, index: int, request: ModelRequest, name: str, arguments: str) -> str:
    """Some compatible servers leave the id empty; the transcript needs one to pair results."""
    if isinstance(raw, str) and raw:
        return raw
    return constrained_call_id(f"{index}\x00{name}\x00{arguments}", len(request.messages))


def parse_response(data: Any, request: ModelRequest) -> ModelResponse:
    """A non-streaming chat-completions body as a :class:`ModelResponse`."""
    if not isinstance(data, dict):
        raise TypeError("the body is not a JSON object")
    choices = data.get("choices")
    if not isinstance(choices, list) or not choices:
        raise ValueError("the body has no 'choices'")
    choice = choices[0]
    message = choice["message"]
    text = _text_of(message.get("content"))
    if not text and isinstance(message.get("refusal"), str):
        text = message["refusal"]
    calls: list[ToolCall] = []
    for i, raw in enumerate(message.get("tool_calls") or []):
        fn = raw["function"]
        name = str(fn["name"])
        args = fn.get("arguments")
        arguments = args if isinstance(args, str) else json.dumps(args if args is not None else {})
        calls.append(
            ToolCall(
                id=_call_id(raw.get("id"), i, request, name, arguments),
                name=name,
                arguments=arguments or "{}",
            )
        )
    return _finish(
        request,
        text,
        calls,
        _usage(data.get("usage")),
        str(data.get("model") or ""),
        choice.get("finish_reason"),
    )


class StreamAccumulator:
    """Reassembles a chat-completions SSE stream into the response a non-streaming call returns.

    Tool calls arrive in fragments keyed by ``index`` (the id and name in the first fragment, the
    arguments spread over many); they are concatenated per index.
    """

    def __init__(self, request: ModelRequest) -> None:
        self.request = request
        # Only JSON answers are held back; free text (no tools, no output schema) streams live.
        self.constrained = (
            request.model.tool_calls == "constrained" and constrained_schema(request) is not None
        )
        self._text: list[str] = []
        self._calls: dict[int, dict[str, Any]] = {}
        self._usage = Usage(requests=1)
        self._model = ""
        self._finish_reason: str | None = None

    @property
    def complete(self) -> bool:
        """Whether the stream reached its end rather than being cut off."""
        return self._finish_reason is not None

    def feed(self, event: Any) -> str | None:
        """Take one ``data:`` payload; returns the text to publish as a delta, if any.

        In constrained mode nothing is published while streaming, because the text is JSON that
        may turn out to be a tool call; the reply is published once, when the stream ends (see
        :meth:`final_delta`).
        """
        if not isinstance(event, dict):
            raise TypeError("a stream event is not a JSON object")
        if event.get("model"):
            self._model = str(event["model"])
        if isinstance(event.get("usage"), dict):
            self._usage = _usage(event["usage"])
        choices = event.get("choices") or []
        if not choices:
            return None
        choice = choices[0]
        if choice.get("finish_reason"):
            self._finish_reason = choice["finish_reason"]
        delta = choice.get("delta") or {}
        for position, frag in enumerate(delta.get("tool_calls") or []):
            self._add_call_fragment(position, frag)
        piece = _text_of(delta.get("content"))
        if not piece:
            return None
        self._text.append(piece)
        return None if self.constrained else piece

    def _add_call_fragment(self, position: int, frag: dict[str, Any]) -> None:
        index = frag.get("index")
        if not isinstance(index, int):
            # Servers that omit the index send each call whole, or continue the last one.
            frag_id = frag.get("id")
            known = [i for i, c in self._calls.items() if frag_id and c["id"] == frag_id]
            if known:
                index = known[0]
            elif frag_id or not self._calls:
                index = len(self._calls)
            else:
                index = max(self._calls)
        slot = self._calls.setdefault(index, {"id": "", "name": "", "arguments": []})
        if frag.get("id"):
            slot["id"] = str(frag["id"])
        fn = frag.get("function") or {}
        if fn.get("name") and not slot["name"]:
            slot["name"] = str(fn["name"])
        args = fn.get("arguments")
        if isinstance(args, str):
            slot["arguments"].append(args)
        elif args is not None:
            slot["arguments"].append(json.dumps(args))

    def final_delta(self) -> str | None:
        """The text to publish at the end of a constrained stream (the reply, if it was one)."""
        if not self.constrained:
            return None
        response = self.result()
        if response.message.tool_calls or not response.message.content:
            return None
        return response.message.content

    def result(self) -> ModelResponse:
        calls: list[ToolCall] = []
        for i in sorted(self._calls):
            slot = self._calls[i]
            arguments = "".join(slot["arguments"]) or "{}"
            calls.append(
                ToolCall(
                    id=_call_id(slot["id"], i, self.request, slot["name"], arguments),
                    name=slot["name"],
                    arguments=arguments,
                )
            )
        return _finish(
            self.request,
            "".join(self._text),
            calls,
            self._usage,
            self._model,
            self._finish_reason,
        )
