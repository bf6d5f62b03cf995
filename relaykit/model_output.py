"""What the model wrote, checked before workflow code acts on it.

A model (or the provider in front of it) can send anything: two calls with one id, an empty id,
arguments that are not JSON, JSON that is not an object, ``NaN``. Workflow code that trips over
such input fails its workflow task, and Temporal retries that task forever: the run is wedged.
So every call of an assistant message passes through here first, and two things come out:

- the calls to *run*, with ids made unique within the turn (and safe to send to any provider),
  but with the arguments exactly as written, so the tool's own validation can tell the model
  what was wrong;
- the message to *record* in the transcript, with the same ids, with arguments that are always a
  well-formed JSON object and tool names a provider accepts: the transcript goes back to the
  provider on every later turn, and a provider that receives its own malformed output back may
  refuse the whole request.

Pure functions only (this runs in workflow code, :mod:`relaykit.workflows.loop`).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass
from typing import Any

from relaykit.messages import Message, ToolCall
from relaykit.names import is_valid_tool_name

MAX_CALL_ID = 64
"""Longest call id kept as the provider sent it (longer ones are replaced)."""
_SAFE_ID = re.compile(r"[A-Za-z0-9_-]+")

INVALID_ARGUMENTS_KEY = "invalid_arguments"
"""Key under which arguments that were not a JSON object are kept in the recorded transcript."""


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not valid JSON")


_STRICT_JSON = json.JSONDecoder(parse_constant=_refuse_constant)
"""One decoder for every call (building one per call costs more than the parsing)."""


def parse_object(raw: str) -> tuple[dict[str, Any] | None, str | None]:
    """The arguments as a JSON object, or why they are not one (a sentence for the model).

    Strict JSON: ``NaN`` and ``Infinity`` (which Python's parser accepts) are refused, because
    providers do not accept them back.
    """
    text = raw if raw.strip() else "{}"
    try:
        value = _STRICT_JSON.decode(text)
    except (ValueError, RecursionError) as exc:
        detail = str(exc) if isinstance(exc, ValueError) else "nested too deeply"
        return None, f"the arguments are not valid JSON ({_head(detail, 200)})"
    if not isinstance(value, dict):
        return None, f"the arguments must be a JSON object, not {_json_kind(value)}"
    return value, None


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def _head(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def recordable_arguments(raw: str, problem: str | None) -> str:
    """``raw`` if it is a JSON object (``problem`` is what :func:`parse_object` said); else a
    JSON object that keeps the raw text as a string."""
    if problem is None:
        return raw if raw.strip() else "{}"
    return json.dumps({INVALID_ARGUMENTS_KEY: raw}, ensure_ascii=False)


def recordable_name(name: str) -> str:
    """``name`` if a provider accepts it as a tool name; else a stable stand-in (a model that
    calls ``工具`` or ``""`` gets "unknown tool" and must not make the next request invalid)."""
    if is_valid_tool_name(name):
        return name
    return f"invalid_tool_name_{hashlib.sha256(name.encode()).hexdigest()[:8]}"


def is_safe_call_id(call_id: str) -> bool:
    return 0 < len(call_id) <= MAX_CALL_ID and _SAFE_ID.fullmatch(call_id) is not None


@dataclass
class CheckedCalls:
    """One assistant message's calls after the checks (see the module docstring)."""

    calls: list[ToolCall]
    """What to run: unique ids, raw arguments."""
    recorded: Message
    """What to keep in the transcript: the same ids, well-formed arguments."""
    problems: dict[str, str | None]
    """For each raw argument text: why it is not a JSON object, or ``None``."""
    ids_changed: bool = False
    arguments_changed: bool = False
    """Arguments or tool names recorded differently from how they were sent."""

    @property
    def changed(self) -> bool:
        return self.ids_changed or self.arguments_changed


def check_calls(
    message: Message, turn: int, *, fix_ids: bool = True, run_key: str = ""
) -> CheckedCalls:
    """Make the call ids of one turn unique and safe, and the recorded arguments JSON objects.

    A replaced id is ``rk_<digest of run_key>_<turn>_<position>``: deterministic, so a replay
    makes the same one, and distinct between the runs of one tree (a child's approvals surface
    in its parent's pending approvals, keyed by call id). ``fix_ids=False`` keeps the ids as
    sent (runs recorded before ids were checked).
    """
    prefix = f"rk_{hashlib.sha256(run_key.encode()).hexdigest()[:6]}_" if run_key else "rk_"
    used: set[str] = set()
    run: list[ToolCall] = []
    recorded: list[ToolCall] = []
    problems: dict[str, str | None] = {}
    ids_changed = arguments_changed = False
    for position, call in enumerate(message.tool_calls):
        call_id = call.id
        if fix_ids and (not is_safe_call_id(call_id) or call_id in used):
            call_id = f"{prefix}{turn}_{position}"
            suffix = 0
            while call_id in used or any(c.id == call_id for c in message.tool_calls):
                suffix += 1
                call_id = f"{prefix}{turn}_{position}_{suffix}"
            ids_changed = True
        used.add(call_id)
        if call.arguments not in problems:
            problems[call.arguments] = parse_object(call.arguments)[1]
        arguments = recordable_arguments(call.arguments, problems[call.arguments])
        name = recordable_name(call.name)
        arguments_changed = arguments_changed or arguments != call.arguments or name != call.name
        if call_id == call.id and arguments == call.arguments and name == call.name:
            run.append(call)
            recorded.append(call)
            continue
        run.append(call if call_id == call.id else call.model_copy(update={"id": call_id}))
        recorded.append(ToolCall(id=call_id, name=name, arguments=arguments))
    if not (ids_changed or arguments_changed):
        return CheckedCalls(calls=run, recorded=message, problems=problems)
    return CheckedCalls(
        calls=run,
        recorded=message.model_copy(update={"tool_calls": recorded}),
        problems=problems,
        ids_changed=ids_changed,
        arguments_changed=arguments_changed,
    )


def check_ids_needed(message: Message) -> bool:
    """Whether any call id of the message is unsafe or repeated (so :func:`check_calls` would
    change it)."""
    seen: set[str] = set()
    for call in message.tool_calls:
        if not is_safe_call_id(call.id) or call.id in seen:
            return True
        seen.add(call.id)
    return False
