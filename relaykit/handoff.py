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
- arguments are read as lovia reads them: keys other than ``reason`` are ignored and a reason
  of any JSON type is kept as text (a string as it is, anything else as its JSON); arguments
  that are not a JSON object do not switch agents: the model gets an error result and may call
  it again. (Runs started before this rule keep the strict one: ``parse_handoff_args(...,
  lenient=False)``.)
- the default tool name follows lovia's rule (:func:`relaykit.names.agent_tool_name`:
  ``Billing Team`` gives ``transfer_to_billing_team``); the earlier name stays an alias
  (``legacy_name``) that runs started before the rule keep using.

``on_handoff`` may do I/O (audit logs), so it runs as an activity named after the handoff tool.
``input_filter`` runs in workflow code and must be a pure function of its input; one that raises
or returns something other than messages ends the run with ``HandoffFilterFailed``.
"""

from __future__ import annotations

import json

from pydantic import ValidationError

from relaykit.agent import Agent, AgentTool, Handoff, as_handoff
from relaykit.messages import Message, ToolSpec
from relaykit.model_output import parse_object
from relaykit.tool_args import (
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    InputFilter,
    _StrictHandoffArgs,
)
from relaykit.tools import Tool

__all__ = [
    "Handoff",
    "HandoffArgs",
    "HandoffCallbackInput",
    "HandoffInputData",
    "InputFilter",
    "as_handoff",
    "for_context_rewrite",
    "own_tool_names",
    "own_tool_specs",
    "parse_handoff_args",
    "remove_tool_calls",
]


def parse_handoff_args(raw: str, *, lenient: bool = True) -> tuple[HandoffArgs | None, str | None]:
    """The model's handoff arguments, or why they are invalid (a sentence for the model).

    Runs in workflow code, before anything switches: a handoff whose arguments are not a JSON
    object must not hand the conversation over as if they were right. ``lenient`` (lovia's
    reading, the default) ignores other keys and keeps a reason of any JSON type as text, so a
    model that adds ``"priority": "high"`` is still handed off; ``lenient=False`` is the strict
    schema runs started before that rule were recorded with.
    """
    value, problem = parse_object(raw)
    if value is None:
        return None, problem
    if lenient:
        reason = value.get("reason")
        if reason is None or isinstance(reason, str):
            return HandoffArgs(reason=reason), None
        return HandoffArgs(reason=json.dumps(reason, ensure_ascii=False)), None
    try:
        parsed = _StrictHandoffArgs.model_validate(value)
    except ValidationError as exc:
        details = "; ".join(
            f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
            for err in exc.errors(include_url=False)
        )
        return None, details
    return HandoffArgs(reason=parsed.reason), None


# --- The names a run gives an agent's tools -----------------------------------------------------
# A run uses lovia's names or, when it started before them, the earlier ones (``lovia_names``,
# recorded once per run in ``RunSetup.lovia_tool_names``). A run on lovia's names still resolves
# a call by the earlier name (a transcript recorded before may hold it); a run on the earlier
# names resolves only those, as it did when it was recorded. Which tool a call's name means is
# decided in one place, the tool path's table (``relaykit.workflows.tool_path.ToolPath``).


def own_tool_specs(agent: Agent, lovia_names: bool) -> list[ToolSpec]:
    """The agent's function tools, agent tools and handoffs, as the model sees them."""
    specs: list[ToolSpec] = []
    for entry in agent.tools:  # MCP servers were moved to mcp_servers when the agent was made
        if isinstance(entry, AgentTool):
            specs.append(entry.spec_named(entry.run_name(lovia_names)))
        elif isinstance(entry, Tool):
            specs.append(entry.spec)
    specs.extend(
        handoff.spec_named(handoff.run_name(lovia_names))
        for handoff in map(as_handoff, agent.handoffs)
    )
    return specs


def own_tool_names(agent: Agent, lovia_names: bool) -> set[str]:
    """The names of :func:`own_tool_specs` (other tool sources avoid them)."""
    return {spec.name for spec in own_tool_specs(agent, lovia_names)}


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
                rewritten.append(Message.user(f"For context: [{speaker}] said: {message.content}"))
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
