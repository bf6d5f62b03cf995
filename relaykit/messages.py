"""The provider-neutral data that crosses the workflow/activity boundary.

Every model here is persisted in Temporal history (as an activity input or result, or inside a
workflow input/result), so each one is a compatibility obligation for runs in flight: add fields
with defaults, never rename or remove one.

The transcript is a list of :class:`Message` in the OpenAI chat shape (role, text, tool calls,
tool results) because that shape maps losslessly onto both wire formats relaykit speaks; the
provider adapters in :mod:`relaykit.models` translate it at the edge.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field, SerializerFunctionWrapHandler, model_serializer

Role = Literal["user", "assistant", "tool"]


class CompactModel(BaseModel):
    """A model whose serialised form leaves out fields that hold their default.

    These models travel in every turn's activity inputs and results, so defaults written out
    again and again (``"tool_calls": []``, ``"is_error": false``, every unset sampling setting)
    would be most of what a turn adds to history. Parsing fills the defaults back in, so old
    payloads with every field still parse.
    """

    @model_serializer(mode="wrap")
    def _leave_out_defaults(self, handler: SerializerFunctionWrapHandler) -> Any:
        data = handler(self)
        if isinstance(data, dict):
            for name, default in _defaults(type(self)).items():
                if name in data and getattr(self, name) == default:
                    del data[name]
        return data


_DEFAULTS: dict[type, dict[str, Any]] = {}


def _defaults(cls: type[BaseModel]) -> dict[str, Any]:
    """Each optional field's default, computed once per class (pydantic's own lookup inspects
    default factories every time, which costs more than the serialisation it shortens)."""
    known = _DEFAULTS.get(cls)
    if known is None:
        known = {
            name: field.get_default(call_default_factory=True)
            for name, field in cls.model_fields.items()
            if not field.is_required()
        }
        _DEFAULTS[cls] = known
    return known


class ToolCall(CompactModel):
    """A tool call the model asked for. ``arguments`` stays the raw JSON text the model wrote, so
    that malformed arguments reach the tool path (and become an error result) instead of failing
    the model activity."""

    id: str
    name: str
    arguments: str = "{}"


class Message(CompactModel):
    """One transcript entry.

    - ``user``: ``content`` is what the person (or a report, or an injected message) said.
    - ``assistant``: ``content`` is the text (may be empty) and ``tool_calls`` what it asked to run.
    - ``tool``: the result of the call ``tool_call_id`` to ``name``; ``is_error`` marks results
      the model should read as a failure (bad arguments, a raising tool, a rejected approval).
    """

    role: Role
    content: str = ""
    tool_calls: list[ToolCall] = Field(default_factory=list)
    tool_call_id: str | None = None
    name: str | None = None
    is_error: bool = False
    agent: str | None = None
    """For assistant and tool messages: the agent whose turn produced it (for readers and
    input filters; providers ignore it)."""

    @classmethod
    def user(cls, text: str) -> Message:
        return cls(role="user", content=text)

    @classmethod
    def assistant(cls, text: str = "", tool_calls: list[ToolCall] | None = None) -> Message:
        return cls(role="assistant", content=text, tool_calls=tool_calls or [])

    @classmethod
    def tool_result(cls, call: ToolCall, content: str, *, is_error: bool = False) -> Message:
        return cls(
            role="tool",
            content=content,
            tool_call_id=call.id,
            name=call.name,
            is_error=is_error,
        )


class Usage(CompactModel):
    """Tokens, requests and dollars spent. Added up across turns, handoffs and child runs.

    ``cost_usd`` is the cost of the requests whose price was known (each priced by the model
    activity when it ran, see :mod:`relaykit.pricing`); ``unpriced_requests`` counts the others,
    so a total that leaves some calls out says so. ``by_agent`` and ``by_model`` break the cost
    down; a parent's usage holds its children's, so the root's covers the whole tree."""

    requests: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cached_input_tokens: int = 0
    """Of ``input_tokens``, those the provider read from its prompt cache (priced lower)."""
    cost_usd: float = 0.0
    unpriced_requests: int = 0
    by_agent: dict[str, float] = Field(default_factory=dict)
    by_model: dict[str, float] = Field(default_factory=dict)

    @property
    def total_tokens(self) -> int:
        return self.input_tokens + self.output_tokens

    @property
    def cost_known(self) -> bool:
        """Whether every request counted here had a price."""
        return self.unpriced_requests == 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            requests=self.requests + other.requests,
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cached_input_tokens=self.cached_input_tokens + other.cached_input_tokens,
            cost_usd=self.cost_usd + other.cost_usd,
            unpriced_requests=self.unpriced_requests + other.unpriced_requests,
            by_agent=_merged(self.by_agent, other.by_agent),
            by_model=_merged(self.by_model, other.by_model),
        )

    def by(self, agent: str) -> Usage:
        """This usage (one model call's) attributed to ``agent`` in the breakdown."""
        if not self.cost_usd and not self.requests:
            return self
        return self.model_copy(update={"by_agent": _merged(self.by_agent, {agent: self.cost_usd})})


def _merged(a: dict[str, float], b: dict[str, float]) -> dict[str, float]:
    if not b:
        return a
    merged = dict(a)
    for key, value in b.items():
        merged[key] = merged.get(key, 0.0) + value
    return merged


class ToolSpec(CompactModel):
    """What the model is told about one tool: its name, description and JSON schema."""

    name: str
    description: str = ""
    parameters: dict[str, Any] = Field(default_factory=lambda: {"type": "object", "properties": {}})
    route: str | None = None
    """What kind of tool answers a call of it, when it is not a function tool (a handoff and its
    target, an agent tool, the subagent tools): never sent to the model. The model call echoes
    it for the calls it returns (``ModelResponse.routes``), so replay can issue the commands of
    a tool that today's code no longer defines (relaykit.workflows.call_record)."""


class OutputSpec(CompactModel):
    """The structured output the model must produce as its final answer."""

    name: str = "final_output"
    json_schema: dict[str, Any]


class ModelResponse(CompactModel):
    """What one model call returned: a message (text and/or tool calls) and its usage."""

    message: Message
    usage: Usage = Field(default_factory=Usage)
    model: str = ""
    finish_reason: str | None = None
    transcript_ref: str | None = None
    """Digest of the stored transcript ending with this response (when the request asked)."""
    routes: dict[str, str] = Field(default_factory=dict)
    """For each tool name this response calls that was offered with a route (``ToolSpec.route``):
    that route, recorded with the call (relaykit.workflows.call_record)."""
    output_checked: bool | None = None
    """Whether the request asked for a structured answer (``ModelRequest.output``), recorded with
    the call: a final answer of a response that did not is accepted as it is, on replay too,
    whatever output type today's code gives the agent (relaykit.workflows.final_answer).
    ``None``: a worker from before recorded it."""
    price_source: str | None = None
    """Where the price of this call came from (``"genai-prices 0.2.3"``, ``"override"``), or
    ``None`` when it had none: recorded with the call, so a replay never prices it again."""
    static_ref: str | None = None
    """Digest of the request's unchanging part that the model worker stored or found for this
    call. The workflow learns what is stored from this recorded value, never by re-deriving it:
    on replay, today's code may compute another digest for its own system prompt and tools."""
