"""Published MCP servers as a durable run's tools: npm's filesystem server (TypeScript SDK) and
PyPI's git server, each a stdio subprocess of the worker (``tests/published_mcp.py`` installs
them). What relaykit knows of them is only what they publish: their tools, schemas and
annotations, which decide each call's effect.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client

from relaykit import Agent, MCPServer, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests import published_mcp
from tests.support import history_events, scheduled_activities, scripted_model, serving

RESULT_TIMEOUT = 120


def _git(repository: Path, *args: str) -> str:
    return subprocess.run(
        ["git", "-C", str(repository), *args], check=True, capture_output=True, text=True
    ).stdout


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git repository with one commit, which both servers work in."""
    root = tmp_path_factory.mktemp("published") / "notes"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "tests@relaykit.invalid")
    _git(root, "config", "user.name", "relaykit tests")
    (root / "README.md").write_text("notes\n", encoding="utf-8")
    _git(root, "add", "README.md")
    _git(root, "commit", "-q", "-m", "start")
    return root


@pytest.fixture(scope="module")
def servers(repository: Path) -> tuple[MCPServer, MCPServer]:
    # Installing takes seconds once (npm and pip), then nothing; a failure says what it ran.
    filesystem = published_mcp.filesystem_command(repository)
    git = published_mcp.git_command(repository)
    return MCPServer.stdio("fs", filesystem), MCPServer.stdio("git", git)


def _server_pids(*markers: str) -> list[int]:
    """The running processes whose command line holds every one of ``markers``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            command = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            state = (entry / "status").read_text()
        except OSError:
            continue
        if all(m in command for m in markers) and "\nState:\tZ" not in state:
            pids.append(int(entry.name))
    return pids


async def test_a_durable_run_writes_a_file_with_the_filesystem_server_and_commits_it_with_the_git_server(  # noqa: E501
    client: Client,
    model_server: ScriptedModelServer,
    servers: tuple[MCPServer, MCPServer],
    repository: Path,
) -> None:
    # Between the file's write and its edit, the filesystem server is SIGKILLed (as a crash
    # would): the edit, a "write" by the server's annotations, goes to a new process in its
    # first attempt and is made once; the commit is made once.
    filesystem, git = servers
    notes = repository / "plan.md"

    @tool
    def kill_filesystem_server() -> str:
        """SIGKILL the filesystem server, and wait until it is gone."""
        markers = ("server-filesystem", str(repository))
        pids = _server_pids(*markers)
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 20
        while set(pids) & set(_server_pids(*markers)):
            if time.monotonic() > deadline:
                return "still alive"
            time.sleep(0.05)
        return f"killed {len(pids)}"

    agent = Agent(
        name=f"clerk-{uuid.uuid4().hex[:6]}",
        model=scripted_model(model_server),
        tools=[filesystem, git, kill_filesystem_server],
    )
    model_server.script(
        agent.model.name,  # type: ignore[union-attr]
        [
            call("fs_list_directory", id="ls", path=str(repository)),
            call("fs_write_file", id="write", path=str(notes), content="# Plan\n\ndraft\n"),
            call("kill_filesystem_server", id="kill"),
            call(
                "fs_edit_file",
                id="edit",
                path=str(notes),
                edits=[{"oldText": "draft", "newText": "final"}],
            ),
            call("git_git_add", id="add", repo_path=str(repository), files=["plan.md"]),
            call("git_git_commit", id="commit", repo_path=str(repository), message="Add the plan"),
            call("git_git_log", id="log", repo_path=str(repository), max_count=5),
            text("committed"),
        ],
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "write the plan", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)

    assert result.output == "committed"
    results: dict[str, Any] = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert not any(m.is_error for m in results.values()), {
        k: m.content for k, m in results.items() if m.is_error
    }
    assert "README.md" in results["ls"].content
    assert results["kill"].content == "killed 1"
    assert "Add the plan" in results["log"].content
    # Each change was made once: the edit found "draft" and the commit is the only new one.
    assert notes.read_text(encoding="utf-8") == "# Plan\n\nfinal\n"
    assert _git(repository, "log", "--format=%s").split("\n")[:2] == ["Add the plan", "start"]
    assert _git(repository, "status", "--porcelain") == ""

    assert await scheduled_activities(handle.workflow) == [
        "mcp:fs:list_tools",
        "mcp:git:list_tools",
        "relaykit.model_call",
        "mcp:fs/list_directory",
        "relaykit.model_call",
        "mcp:fs/write_file",
        "relaykit.model_call",
        "kill_filesystem_server",
        "relaykit.model_call",
        "mcp:fs/edit_file",
        "relaykit.model_call",
        "mcp:git/git_add",
        "relaykit.model_call",
        "mcp:git/git_commit",
        "relaykit.model_call",
        "mcp:git/git_log",
        "relaykit.model_call",
    ]
    events = await history_events(handle.workflow)
    # The effects the servers' annotations give, as recorded with each call.
    effects = {}
    for e in events:
        if e.HasField("activity_task_scheduled_event_attributes"):
            attrs = e.activity_task_scheduled_event_attributes
            if "/" in attrs.activity_type.name:
                payload = json.loads(attrs.input.payloads[0].data)
                effects[attrs.activity_type.name] = payload.get("effect")
    assert effects == {
        "mcp:fs/list_directory": "read",
        "mcp:fs/write_file": "idempotent",
        "mcp:fs/edit_file": "write",
        "mcp:git/git_add": "idempotent",
        "mcp:git/git_commit": "write",
        "mcp:git/git_log": "read",
    }
    # The edit reached a new server process in its first attempt: no attempt failed.
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) == 1
