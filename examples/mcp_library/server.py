"""A tiny MCP server over a local document collection (``docs/`` next to this file).

Run by the relaykit worker as a stdio subprocess (see ``examples/mcp_research.py``); try it alone
with ``python examples/mcp_library/server.py`` and an MCP client. Offline: it reads files only.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

LIBRARY = Path(os.environ.get("MCP_LIBRARY_DIR", Path(__file__).resolve().parent / "docs"))
server = MCPServer("library", log_level="WARNING")


def _documents() -> dict[str, str]:
    return {p.name: p.read_text(encoding="utf-8") for p in sorted(LIBRARY.glob("*.md"))}


@server.tool()
def list_documents() -> str:
    """List the documents of the library, one title per line."""
    return "\n".join(
        f"{name}: {text.splitlines()[0].lstrip('# ')}" for name, text in _documents().items()
    )


@server.tool()
def search(query: str) -> str:
    """Find the documents that mention the words of a query, best match first.

    Args:
        query: A few keywords, e.g. "crash replay history".
    """
    words = {w for w in re.findall(r"\w+", query.lower()) if len(w) > 2}
    scored = []
    for name, text in _documents().items():
        lowered = text.lower()
        score = sum(lowered.count(w) for w in words)
        if score:
            scored.append((score, name))
    if not scored:
        return "no document matches"
    return "\n".join(name for _, name in sorted(scored, reverse=True))


@server.tool()
def read_document(name: str) -> str:
    """Read one document of the library.

    Args:
        name: The file name, as listed, e.g. "durable-execution.md".
    """
    text = _documents().get(name)
    if text is None:
        raise ToolError(f"no document named {name!r}; call list_documents to see them")
    return text


if __name__ == "__main__":
    server.run()
