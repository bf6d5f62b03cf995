"""Handoffs: pass the conversation to another agent inside the same run.

Each entry of ``Agent.handoffs`` becomes a tool (default name ``transfer_to_<slug>``) with one
optional, model-filled ``reason`` argument. The turn loop owns the switch itself (one place:
:meth:`relaykit.workflows.loop.TurnLoop._run_handoff`); this module only describes handoffs.

Semantics (lovia's, see the docs):
- only the first handoff of a turn executes; a second one in the same turn is rejected before its
  ``on_handoff`` runs; the switch happens after the turn's other tool results are complete;
- the target sees the whole history; only the system prompt is rebuilt for it;
- usage, budget, ``max_turns``, mailbox and approvals carry over: there is no nested run;
- a handoff whose arguments are invalid (not a JSON object, ``reason`` not a string, unknown
  keys) does not switch agents: the model gets an error result and may call it again.

``on_handoff`` may do I/O (audit logs), so it runs as an activity named after the handoff tool.
``input_filter`` runs in workflow code and must be a pure function of its input; one that raises
or returns something other than messages ends the run with ``HandoffFilterFailed``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from relaykit.agent import Agent
from relaykit.errors import ConfigurationError
from relaykit.messages import Message, ToolSpec
from relaykit.names import is_valid_tool_name, tool_name_for
from relaykit.model_output import parse_object


class HandoffArgs(BaseModel):
    """What the model passes to a handoff tool, and what ``on_handoff`` receives."""

    reason: str | None = None


class _StrictHandoffArgs(HandoffArgs):
    """The handoff tool's schema, enforced: only ``reason``, a string (or null)."""

    model_config = ConfigDict(extra="forbid", strict=True)


def parse_handoff_args(raw: str) -> tuple[HandoffArgs | None, str | None]:
    """The model's handoff arguments, or why they are invalid (a sentence for the model).

    Runs in workflow code, before anything switches: a handoff whose arguments the model got
    wrong must not hand the conversation over as if they were right.
    """
    value, problem = parse_object(raw)
    if value is None:
        return None, problem
    try:
        parsed = _StrictHandoffArgs.model_validate(value)
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        return None, details
    return HandoffArgs(reason=parsed.reason), None


class HandoffCallbackInput(BaseModel):
    """Input of the ``on_handoff`` activity (persisted: compatibility data)."""

    source: str
    target: str
    reason: str | None = None
    turn: int
    workflow_id: str


class HandoffInputData(BaseModel):
    """What an ``input_filter`` gets: the history the target would see, and who hands off."""

    source: str
    target: str
    history: list[Message]


InputFilter = Callable[[HandoffInputData], list[Message]]


@dataclass(eq=False)
class Handoff:
    """A customised handoff to ``target``."""

    target: Agent
    name: str | None = None
    """Tool name; default ``transfer_to_<slug of target name>``."""
    description: str | None = None
    """Routing hint for the model; the default names the target and its description."""
    on_handoff: Callable[[HandoffArgs, HandoffCallbackInput], Any] | None = None
    """Called (sync or async) as an activity when the handoff executes."""
    input_filter: InputFilter | None = None
    """Rewrites the history the target sees (pure function; runs in workflow code)."""

    def __post_init__(self) -> None:
        if not isinstance(self.target, Agent):
            raise ConfigurationError(f"Handoff target must be an Agent, got {self.target!r}")
        if self.name is None:
            self.name = tool_name_for("transfer_to_", self.target.name)
        elif not is_valid_tool_name(self.name):
            raise ConfigurationError(
                f"invalid handoff tool name {self.name!r}",
                hint="1-64 characters of A-Z, a-z, 0-9, _ and -",
            )

    @property
    def tool_name(self) -> str:
        assert self.name is not None
        return self.name

    @property
    def spec(self) -> ToolSpec:
        description = self.description or (
            f"Hand the conversation over to the {self.target.name} agent, which continues it"
            + (f": {self.target.description}" if self.target.description else ".")
        )
        return ToolSpec(
            name=self.tool_name,
            description=description,
            parameters={
                "type": "object",
                "properties": {
                    "reason": {
                        "type": "string",
                        "description": "Why the conversation is handed over (optional).",
                    }
                },
                "additionalProperties": False,
            },
        )


def as_handoff(entry: Agent | Handoff) -> Handoff:
    return entry if isinstance(entry, Handoff) else Handoff(target=entry)


# --- Ready-made input filters -------------------------------------------------------------------


def remove_tool_calls(data: HandoffInputData) -> list[Message]:
    """Drop tool calls and tool results; keep what people and agents said."""
    kept: list[Message] = []
    for message in data.history:
        if message.role == "tool":
            continue
        if message.role == "assistant" and message.tool_calls:
            if message.content:
                kept.append(Message.assistant(message.content))
            continue
        kept.append(message)
    return kept


def for_context_rewrite(data: HandoffInputData) -> list[Message]:
    """Eino's rewrite: what earlier agents said and did becomes user-side context
    ("For context: [billing] said …"), so the target does not mistake it for its own words.
    The target's own earlier messages (in a cycle A → B → A) stay as they are."""
    rewritten: list[Message] = []
    for message in data.history:
        speaker = message.agent or data.source
        if message.role == "user" or speaker == data.target:
            rewritten.append(message)
        elif message.role == "assistant":
            if message.content:
                rewritten.append(
                    Message.user(f"For context: [{speaker}] said: {message.content}")
                )
            for call in message.tool_calls:
                rewritten.append(
                    Message.user(
                        f"For context: [{speaker}] called tool `{call.name}` "
                        f"with arguments: {call.arguments}"
                    )
                )
        elif message.role == "tool":
            rewritten.append(
                Message.user(
                    f"For context: [{speaker}] `{message.name}` tool returned result: "
                    f"{message.content}"
                )
            )
    return rewritten
