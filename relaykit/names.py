"""Tool names that every provider accepts.

Providers accept tool names matching ``^[a-zA-Z0-9_-]{1,64}$``. Agent names are free text (``账单专家``,
``Billing Team``), so the names relaykit derives from them (``transfer_to_…``, ``ask_…``) are
normalised here. When normalisation had to change the name, a short digest of the original is
appended, so two different agents never share a tool name and the same agent always maps to the
same one (tool names are recorded in history: they must be stable across processes).
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
