"""A small MCP server for the tests, run as a real subprocess (never imported by them).

``python tests/mcp_docs_server.py [--http PORT] [--docs DIR]`` serves over stdio by default, or
over streamable HTTP on 127.0.0.1. Every tool call appends one line to the file named by
``MCP_TEST_LOG`` (``pid tool phase argument``, phase ``start`` or ``done``), so a test counts the
executions of each call across server processes and worker crashes.

Tools that change nothing carry ``readOnlyHint`` (relaykit runs them again after a crash);
``exit_now`` is ``idempotentHint`` (calling it again does nothing more); ``slow_write`` and the
others carry no hints, so relaykit treats them as writes.

``MCP_TEST_REQUIRE_TOKEN`` makes the HTTP server answer only requests whose ``Authorization``
header is ``Bearer <that value>``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import sys
import time
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import ToolAnnotations

logging.getLogger("mcp.shared.tool_name_validation").setLevel(logging.ERROR)
server = MCPServer("docs", log_level="WARNING")
READ_ONLY = ToolAnnotations(read_only_hint=True)
DOCS = Path(os.environ.get("MCP_TEST_DOCS", Path(__file__).parent))
_calls = 0  # per process: shows whether a session (process) was kept or restarted


def _log(tool: str, phase: str, argument: Any) -> None:
    path = os.environ.get("MCP_TEST_LOG")
    if not path:
        return
    with open(path, "a", encoding="utf-8") as fh:
        fh.write(f"{os.getpid()} {tool} {phase} {json.dumps(argument, ensure_ascii=False)}\n")
        fh.flush()
        os.fsync(fh.fileno())


@server.tool(annotations=READ_ONLY)
def read_doc(name: str) -> str:
    """Read one document of the collection.

    Args:
        name: File name, e.g. "temporal.md".
    """
    _log("read_doc", "start", name)
    path = (DOCS / name).resolve()
    if DOCS.resolve() not in path.parents or not path.is_file():
        _log("read_doc", "done", name)
        raise ToolError(f"no document named {name!r}")
    text = path.read_text(encoding="utf-8")
    _log("read_doc", "done", name)
    return text


@server.tool(annotations=READ_ONLY)
def list_docs() -> str:
    """List the documents of the collection."""
    _log("list_docs", "start", "")
    names = sorted(p.name for p in DOCS.iterdir() if p.is_file() and p.suffix in {".md", ".txt"})
    _log("list_docs", "done", "")
    return "\n".join(names)


@server.tool()
def count() -> str:
    """How many calls this server process has answered (shows whether the session was kept)."""
    global _calls
    _calls += 1
    _log("count", "done", _calls)
    return f"{_calls} calls in process {os.getpid()}"


@server.tool(annotations=READ_ONLY)
async def slow(seconds: float, ctx: Context) -> str:
    """Wait, then answer (killed mid-call by the crash tests).

    Args:
        seconds: How long to wait.
    """
    _log("slow", "start", seconds)
    release = os.environ.get("MCP_TEST_RELEASE")
    waited = 0.0
    while waited < seconds or (release and not Path(release).exists()):
        await asyncio.sleep(0.05)
        waited += 0.05
    _log("slow", "done", seconds)
    return f"waited {seconds}"


@server.tool()
def delete_doc(name: str) -> str:
    """Delete a document (a person approves first).

    Args:
        name: File name.
    """
    _log("delete_doc", "done", name)
    return f"deleted {name}"


@server.tool()
async def slow_write(seconds: float, ref: str = "") -> str:
    """Append to a ledger after a wait (a write: no hints; killed mid-call by the crash tests).

    Args:
        seconds: How long to wait.
        ref: What the write is for (logged instead of the wait when given).
    """
    _log("slow_write", "start", ref or seconds)
    release = os.environ.get("MCP_TEST_RELEASE")
    waited = 0.0
    while waited < seconds or (release and not Path(release).exists()):
        await asyncio.sleep(0.05)
        waited += 0.05
    _log("slow_write", "done", ref or seconds)
    return f"wrote after {seconds}"


@server.tool(annotations=READ_ONLY)
def big(size: int) -> str:
    """Return ``size`` characters.

    Args:
        size: How many.
    """
    _log("big", "done", size)
    return "x" * size


@server.tool(name="查找", annotations=READ_ONLY)
def find(term: str) -> str:
    """Find a term (a tool whose name is not ASCII).

    Args:
        term: What to look for.
    """
    _log("查找", "done", term)
    return f"found {term}"


@server.tool()
def report_error(message: str) -> Any:
    """Answer with an isError result of its own.

    Args:
        message: The error text.
    """
    from mcp.types import CallToolResult, TextContent

    _log("report_error", "done", message)
    return CallToolResult(content=[TextContent(type="text", text=message)], is_error=True)


@server.tool(annotations=ToolAnnotations(idempotent_hint=True))
def exit_now() -> str:
    """Kill this server process in the middle of the call."""
    _log("exit_now", "start", "")
    os._exit(3)


@server.tool(annotations=READ_ONLY)
def whoami(ctx: Context) -> str:
    """Which headers the server saw (HTTP) and its process id."""
    headers = ctx.headers or {}
    seen = {"authorization": "yes" if headers.get("authorization") else "no", "pid": os.getpid()}
    _log("whoami", "done", "")
    return json.dumps(seen)


def _hold_start() -> None:
    """``MCP_TEST_HOLD_START``: wait for that file before serving (a slow server start, which
    holds the listing of the worker that started it)."""
    hold = os.environ.get("MCP_TEST_HOLD_START")
    if not hold:
        return
    _log("server", "start", "")
    while not Path(hold).exists():
        time.sleep(0.05)


def main() -> None:
    _hold_start()
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on this port")
    args = parser.parse_args()
    if args.http is None:
        server.run()
        return
    token = os.environ.get("MCP_TEST_REQUIRE_TOKEN")
    app = server.streamable_http_app()
    if token:
        app = _require_token(app, token)
    import uvicorn

    print(f"listening on {args.http}", file=sys.stderr, flush=True)
    uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")


def _require_token(app: Any, token: str) -> Any:
    async def guarded(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "http":
            headers = dict(scope.get("headers") or [])
            if headers.get(b"authorization", b"").decode() != f"Bearer {token}":
                await send({"type": "http.response.start", "status": 401, "headers": []})
                await send({"type": "http.response.body", "body": b"unauthorized"})
                return
        await app(scope, receive, send)

    return guarded


if __name__ == "__main__":
    main()
