"""Research over a local document collection through an MCP server.

The ``librarian`` agent gets its tools from an MCP server (``examples/mcp_library/server.py``,
run by the worker as a stdio subprocess) that lists, searches and reads the Markdown files in
``examples/mcp_library/docs``. Every list and call is a Temporal activity
(``mcp:library:list_tools``, ``mcp:library/search``, ...), so a crashed worker or a killed server
process costs no finished call.

    relaykit dev examples.mcp_research
    relaykit run librarian "How does durable execution survive a crash?" --wait

Everything runs offline. With no model configured (no ``RELAYKIT_MODEL``, no provider key),
:func:`scripted_librarian` plays the model (search, read the best match, answer from it); with
one, the model decides.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from relaykit import Agent, MCPServer
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text

LIBRARY_SERVER = Path(__file__).resolve().parent / "mcp_library" / "server.py"

library = MCPServer.stdio("library", [sys.executable, str(LIBRARY_SERVER)], timeout=30)

librarian = Agent(
    name="librarian",
    description="Answers questions from the local document library.",
    instructions=(
        "Answer from the library only. Search it with library_search, read the best matching "
        "document with library_read_document, then answer in two sentences and name the document."
    ),
    tools=[library],
)


def scripted_librarian(request: ScriptedRequest) -> Step:
    """A deterministic stand-in for the model: search, read the first hit, answer from it."""
    results = request.tool_results
    if not results:
        words = re.findall(r"[a-z]{4,}", request.last_user_text.lower())
        return call("library_search", query=" ".join(words) or "agent")
    if len(results) == 1:
        hits = [line for line in results[0].splitlines() if line.endswith(".md")]
        if not hits:
            return text("The library has nothing on that.")
        return call("library_read_document", name=hits[0])
    body = [line for line in results[-1].splitlines() if line and not line.startswith("#")]
    title = next(
        (line.lstrip("# ") for line in results[-1].splitlines() if line.startswith("#")), ""
    )
    return text(f"{' '.join(body)[:300]} (source: {title})")
