"""Which model serves an agent, as serialisable data.

A :class:`ModelSpec` is part of every model activity's input, so it must never hold a secret:
API keys are read from the environment of the worker that runs the model activity (see
:mod:`relaykit.models.providers`). ``base_url`` may be left ``None`` so that the worker's own
environment (``OPENAI_BASE_URL``, ``ANTHROPIC_BASE_URL``) decides where requests go.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, ValidationInfo, field_validator

from relaykit.errors import ConfigurationError
from relaykit.messages import CompactModel, Message, OutputSpec, ToolSpec
from relaykit.schedule_options import duration, task_queue_name

Provider = Literal["openai", "anthropic", "local"]

#: Short aliases for OpenAI-compatible servers that people run on their own machine.
_COMPATIBLE_SERVERS: dict[str, str] = {
    "ollama": "http://127.0.0.1:11434/v1",
    "lmstudio": "http://127.0.0.1:1234/v1",
    "vllm": "http://127.0.0.1:8000/v1",
}


DEFAULT_LOCAL_MODEL = "smollm2"
"""What ``"local"`` names: the model the quick start installs."""
LOCAL_CONTEXT_WINDOW = 4096
"""Context window (tokens) of the bundled local model's server: SmolLM2 was trained for 8k,
but on a small CPU prompt processing dominates, and half of that keeps each turn quick."""


class ModelSettings(CompactModel):
    """Sampling and tool-use settings sent with every request of an agent (all optional)."""

    temperature: float | None = None
    top_p: float | None = None
    max_tokens: int | None = None
    tool_choice: Literal["auto", "required", "none"] | None = None
    first_turn_tool_choice: Literal["auto", "required", "none"] | None = None
    """``tool_choice`` for the agent's first model call of a run only: ``"required"`` makes a
    weak model start by calling a tool instead of guessing an answer."""
    parallel_tool_calls: bool | None = None
    extra_body: dict[str, Any] = Field(default_factory=dict)
    """Provider-specific fields merged into the request body as they are."""


class Price(CompactModel):
    """What a model costs, in USD per million tokens: for self-hosted or contracted prices,
    or models the bundled price table does not know (``ModelSpec(price=...)``).
    ``cached_input`` (input read from the provider's prompt cache) defaults to ``input``."""

    input: float = Field(ge=0)
    output: float = Field(ge=0)
    cached_input: float | None = Field(None, ge=0)

    def cost(self, input_tokens: int, output_tokens: int, cached_input_tokens: int = 0) -> float:
        cached = min(cached_input_tokens, input_tokens)
        cached_price = self.input if self.cached_input is None else self.cached_input
        return (
            (input_tokens - cached) * self.input
            + cached * cached_price
            + output_tokens * self.output
        ) / 1_000_000


class ModelSpec(CompactModel):
    """A model and how to reach it.

    ``tool_calls="constrained"`` is for OpenAI-compatible servers whose model has no native
    tool-call format (llama.cpp, some vLLM/Ollama models): relaykit then asks for JSON constrained
    by a schema and turns the answer into tool calls.
    """

    provider: Provider = "openai"
    name: str
    base_url: str | None = None
    api_key_env: str | None = None
    """Name of the environment variable holding the key (never the key itself)."""
    timeout_seconds: float = 120.0
    """How long one attempt waits for the model's answer. Checked here, as a tool's timeouts
    are (:mod:`relaykit.schedule_options`): the run schedules its model calls with it, and a
    value no timeout can hold would fail every workflow task of the run instead of one
    definition."""
    heartbeat_timeout_seconds: float = 30.0
    """A model call whose worker stops heartbeating this long is retried elsewhere (how fast a
    crashed worker's call is noticed); ``0``: no heartbeat timeout."""
    tool_calls: Literal["native", "constrained"] = "native"
    stream: bool = False
    """Read the provider's SSE stream (token deltas are published while the model writes)."""
    context_window: int | None = None
    """The model's context window in tokens, when known. Agents without a ``context_policy``
    get a default one for small windows (:func:`relaykit.context_policy.default_context_policy`)."""
    task_queue: str | None = None
    """The task queue this model's calls run on (default ``<run queue>.model.<provider>``; see
    :mod:`relaykit.models.queues`). Models sharing a queue share its limits."""
    concurrent: int | None = Field(None, ge=1)
    """At most this many calls at once per worker on the model's queue (unless the worker or
    ``RELAYKIT_MODEL_LIMITS`` says otherwise)."""
    per_second: float | None = Field(None, gt=0)
    """At most this many calls a second on the model's queue across the cluster (enforced by
    the Temporal server; unless the worker or ``RELAYKIT_MODEL_LIMITS`` says otherwise)."""
    price: Price | None = None
    """The model's price, overriding the bundled price table (:mod:`relaykit.pricing`)."""

    @field_validator("timeout_seconds", "heartbeat_timeout_seconds")
    @classmethod
    def _a_timeout_an_activity_takes(cls, seconds: float, info: ValidationInfo) -> float:
        zero = "no heartbeat timeout" if info.field_name == "heartbeat_timeout_seconds" else None
        duration(seconds, f"{info.field_name} of the model", zero=zero)
        return seconds

    @field_validator("task_queue")
    @classmethod
    def _a_queue_the_server_takes(cls, name: str | None) -> str | None:
        return task_queue_name(name, "task_queue of the model")

    @property
    def label(self) -> str:
        return self.name if self.provider == "openai" else f"{self.provider}:{self.name}"


def parse_model(model: str | ModelSpec) -> ModelSpec:
    """``"openai:gpt-4.1-mini"``, ``"anthropic:claude-sonnet-4-5"``, ``"ollama:llama3.2"``,
    ``"local:smollm2"`` (or just ``"local"``), or a bare name (taken as OpenAI-compatible)."""
    if isinstance(model, ModelSpec):
        return model
    if not isinstance(model, str) or not model.strip():
        raise ConfigurationError(
            f"model must be a non-empty string or a ModelSpec, got {model!r}",
            hint='use e.g. "openai:gpt-4.1-mini" or "anthropic:claude-sonnet-4-5"',
        )
    if model.strip() in ("local", "local:"):  # the bundled model, as `relaykit demo --model local`
        model = f"local:{DEFAULT_LOCAL_MODEL}"
    prefix, sep, name = model.partition(":")
    if not sep:
        return ModelSpec(provider="openai", name=model)
    if prefix in ("openai", "anthropic"):
        return ModelSpec(provider=prefix, name=name)
    if prefix == "local":
        return ModelSpec(
            provider="local",
            name=name,
            tool_calls="constrained",
            context_window=LOCAL_CONTEXT_WINDOW,
        )
    if prefix in _COMPATIBLE_SERVERS:
        return ModelSpec(provider="openai", name=name, base_url=_COMPATIBLE_SERVERS[prefix])
    raise ConfigurationError(
        f"unknown model provider {prefix!r} in {model!r}",
        hint="known prefixes: openai, anthropic, local, " + ", ".join(_COMPATIBLE_SERVERS),
    )


class ModelRequest(CompactModel):
    """The input of the model activity: everything one model call needs, and nothing secret."""

    model: ModelSpec
    system: str = ""
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolSpec] = Field(default_factory=list)
    output: OutputSpec | None = None
    settings: ModelSettings = Field(default_factory=ModelSettings)
    reminder: str | None = None
    """Transient text appended to the request (e.g. background task status); never saved in the
    transcript."""
    base_ref: str | None = None
    """Digest of a transcript prefix in the model workers' transcript store; ``messages`` then
    holds only what came after it (see :mod:`relaykit.transcripts`)."""
    base_count: int = 0
    """How many messages the prefix ``base_ref`` holds (checked when it is loaded)."""
    store_transcript: bool = False
    """Store the prefix this call ends with and return its digest (``transcript_ref``)."""
    static_ref: str | None = None
    """Digest of this request's unchanging part (system, tools, output, settings). With
    ``store_static`` the part is sent and stored under it; without, it is left out and the model
    worker reads it from its transcript store (a turn then does not resend tool schemas)."""
    store_static: bool = False
    output_cap: int | None = None
    """At most this many output tokens, whatever the settings say: what a run's dollar budget
    leaves for the call (kept out of the settings, which may travel as a stored part)."""
    final_call: bool = False
    """The last call of a run at its dollar limit: sent without tools, so the model answers."""

    def static_part(self) -> dict[str, Any]:
        """The fields :attr:`static_ref` stands for, in JSON form."""
        return self.model_dump(mode="json", include={"system", "tools", "output", "settings"})
