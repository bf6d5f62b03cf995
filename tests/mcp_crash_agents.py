"""The agent of the MCP crash test, served by a worker in a process of its own
(``python -m relaykit.cli worker tests.mcp_crash_agents``) so that the test can SIGKILL it.

The model and the MCP server's log come from the environment (see ``tests/test_mcp.py``); the
docs server runs as the worker's stdio subprocess. A short heartbeat timeout lets the call in
flight at the kill be retried on the next worker within seconds; ``MCP_TEST_DEFAULT_HEARTBEAT``
leaves the docs server at the default one instead.
"""

from __future__ import annotations

import os
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.common import RetryPolicy

from relaykit import Agent, MCPServer, ModelSpec, tool

HERE = Path(__file__).resolve().parent

docs = MCPServer.stdio(
    "docs",
    [sys.executable, str(HERE / "mcp_docs_server.py")],
    env_from_env=[
        "MCP_TEST_LOG",
        "MCP_TEST_DOCS",
        "MCP_TEST_RELEASE",
        *(["MCP_TEST_HOLD_START"] if os.environ.get("MCP_TEST_HOLD_START") else []),
    ],
    heartbeat_timeout=None if os.environ.get("MCP_TEST_DEFAULT_HEARTBEAT") else 5,
    retry=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5),
)


@tool
def kill_docs_server() -> str:
    """SIGKILL the docs server process that answered last (as a crash would)."""
    import signal
    import time

    lines = Path(os.environ["MCP_TEST_LOG"]).read_text(encoding="utf-8").splitlines()
    pid = int(lines[-1].split()[0])
    os.kill(pid, signal.SIGKILL)
    for _ in range(400):
        try:
            state = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            break
        if "\nState:\tZ" in state:
            break
        time.sleep(0.05)
    return f"killed {pid}"


servers = [docs]
if os.environ.get("MCP_TEST_HTTP_URL"):  # the "tracker": the same server over streamable HTTP
    servers.append(
        MCPServer.http(
            "tracker",
            os.environ["MCP_TEST_HTTP_URL"],
            headers_from_env={"Authorization": "Bearer $MCP_TEST_TOKEN"},
            retry=RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5),
        )
    )

mcp_crash_agent = Agent(
    name="mcp_crash_agent",
    instructions="Use the tools, then answer.",
    model=ModelSpec(
        provider="openai",
        name=os.environ.get("CRASH_MODEL_NAME", "crash-model"),
        base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
        heartbeat_timeout_seconds=2.0,
        timeout_seconds=30,
    ),
    tools=[*servers, kill_docs_server],
)
