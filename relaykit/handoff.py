"""Handoffs: pass the conversation to another agent inside the same run.

Each entry of ``Agent.handoffs`` becomes a tool (default name ``transfer_to_<slug>``) with one
optional, model-filled ``reason`` argument. The turn loop owns the switch itself (one place:
:mod:`relaykit.workflows.handoffs`); the :class:`Handoff` configuration lives with the agents
(:mod:`relaykit.agent`), its data in :mod:`relaykit.tool_args`; this module holds the
behaviour that reads them.

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

from pydantic import ValidationError

from relaykit.agent import Agent, Handoff
from relaykit.messages import Message
from relaykit.model_output import parse_object
from relaykit.tool_args import (
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    InputFilter,
    _StrictHandoffArgs,
)

__all__ = [
    "Handoff",
    "HandoffArgs",
    "HandoffCallbackInput",
    "HandoffInputData",
    "InputFilter",
    "as_handoff",
    "for_context_rewrite",
    "parse_handoff_args",
    "remove_tool_calls",
]


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
