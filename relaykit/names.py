"""Tool names that every provider accepts.

Providers accept tool names matching ``^[a-zA-Z0-9_-]{1,64}$``. Agent names are free text
(``账单专家``, ``Billing Team``), so the names relaykit derives from them
(``transfer_to_…``, ``ask_…``) are normalised here. Tool names are recorded in history and
written into prompts, evals and approval rules, so every rule here is stable across processes
and versions.

Two rules live here:

- :func:`agent_tool_name`, lovia's rule, for handoff and agent-as-tool names: lower-case ASCII
  letters, digits and ``_`` are kept, each space or ``-`` becomes ``_`` (``a - b`` gives
  ``a___b``), everything else is dropped (``Équipe`` gives ``quipe``). A digest of the agent's
  name is added only when it must be: the slug came out empty (``agent_<digest>``) or too long
  for 64 characters (cut, then ``_<digest>``), or two tools of one agent would otherwise share
  a name (:func:`disambiguated`). ``Billing Team`` gives ``transfer_to_billing_team``.
- :func:`tool_name_for`, the earlier rule (a digest whenever the slug differs from the name),
  still used for MCP tool names and kept as the alias of handoff and agent-tool names for runs
  started before lovia's rule (``Handoff.legacy_name``, ``AgentTool.legacy_name``).
"""

from __future__ import annotations

import hashlib
import re
import unicodedata

MAX_TOOL_NAME = 64
_VALID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def is_valid_tool_name(name: str) -> bool:
    return bool(_VALID.match(name))


def slug(text: str) -> str:
    """ASCII, lower-case, ``_``-separated form of ``text`` (may be empty for non-Latin text)."""
    ascii_text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode()
    return re.sub(r"[^a-z0-9]+", "_", ascii_text.lower()).strip("_")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def tool_name_for(prefix: str, agent_name: str, *, fallback: str = "agent") -> str:
    """``prefix + slug(agent_name)``, with a stable digest suffix when the slug lost information
    (``fallback`` stands in for a slug that came out empty, e.g. for non-Latin names)."""
    base = slug(agent_name)
    name = f"{prefix}{base}"
    if base == agent_name and len(name) <= MAX_TOOL_NAME:
        return name
    suffix = _digest(agent_name)
    head = f"{prefix}{base or fallback}"
    head = head[: MAX_TOOL_NAME - len(suffix) - 1].rstrip("_")
    return f"{head}_{suffix}"


def _lovia_slug(text: str, max_len: int) -> str:
    kept = []
    for ch in text.lower():
        if ch.isascii() and (ch.isalnum() or ch == "_"):
            kept.append(ch)
        elif ch in (" ", "-"):
            kept.append("_")
    base = "".join(kept)
    if not base:
        return f"agent_{_digest(text)}" if text else "agent"
    if len(base) > max_len:
        # the digest is of the whole name: two long names sharing a cut prefix stay distinct
        base = f"{base[: max_len - 9]}_{_digest(text)}"
    return base


def agent_tool_name(prefix: str, agent_name: str) -> str:
    """``prefix`` + lovia's slug of ``agent_name``, within 64 characters (see the module)."""
    return prefix + _lovia_slug(agent_name, MAX_TOOL_NAME - len(prefix))


def disambiguated(name: str, agent_name: str) -> str:
    """``name`` with a stable digest of ``agent_name`` appended (cut to fit 64 characters): for a
    default name that another tool of the same agent already uses."""
    suffix = _digest(agent_name)
    if name.endswith(f"_{suffix}"):
        return name
    return f"{name[: MAX_TOOL_NAME - len(suffix) - 1]}_{suffix}"
