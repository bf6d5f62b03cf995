"""MCP servers as durable tools, against real MCP servers: ``tests/mcp_docs_server.py`` run by the
worker as a stdio subprocess, or by the test over streamable HTTP on 127.0.0.1, and the scripted
model. The server appends every tool execution to a log file (``pid tool phase argument``), which
is how these tests count executions across server processes and worker processes.

Starting a server process costs seconds on a loaded machine, so the stdio tests share one worker
(and so one server session) where they can; timeouts are generous.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.common import RawValue, RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit import Agent, ConfigurationError, MCPServer, RunFailed, start_run, tool
from relaykit.activities.mcp_activities import MCPSessions
from relaykit.devserver import DevServer
from relaykit.mcp import MCPCallRequest
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import (
    activity_summaries,
    history_events,
    scheduled_activities,
    scripted_model,
    serving,
)

REPO_ROOT = Path(__file__).resolve().parent.parent
SERVER_SCRIPT = REPO_ROOT / "tests" / "mcp_docs_server.py"
DOCS = REPO_ROOT / "tests" / "mcp_docs"
RESULT_TIMEOUT = 90


@dataclass
class ServerLog:
    """The MCP server's execution log."""

    path: Path

    def lines(self) -> list[tuple[int, str, str, str]]:
        if not self.path.exists():
            return []
        out = []
        for line in self.path.read_text(encoding="utf-8").splitlines():
            pid, tool_name, phase, argument = line.split(" ", 3)
            out.append((int(pid), tool_name, phase, argument))  # argument: as JSON text
        return out

    def done(self) -> collections.Counter[str]:
        return collections.Counter(f"{t} {a}" for _, t, p, a in self.lines() if p == "done")

    def started(self) -> collections.Counter[str]:
        return collections.Counter(f"{t} {a}" for _, t, p, a in self.lines() if p == "start")

    def pids(self, tool_name: str) -> list[int]:
        return [pid for pid, t, p, _ in self.lines() if t == tool_name and p == "done"]


def stdio_server(log: ServerLog, name: str = "docs", **options: Any) -> MCPServer:
    env = {"MCP_TEST_LOG": str(log.path), "MCP_TEST_DOCS": str(DOCS)}
    env.update(options.pop("env", {}))
    return MCPServer.stdio(name, [sys.executable, str(SERVER_SCRIPT)], env=env, **options)


# --- configuration (no server needed) -----------------------------------------------------------


def test_mcp_servers_in_tools_become_the_agents_tool_sources() -> None:
    server = MCPServer.stdio("docs", ["true"])
    agent = Agent(name="reader", tools=[server])
    assert agent.tools == [] and agent.mcp_servers == [server]
    assert server.list_activity == "mcp:docs:list_tools"
    assert server.call_activity("read_doc") == "mcp:docs/read_doc"


def test_tool_names_the_model_sees_are_prefixed_and_normalised_like_handoff_names() -> None:
    server = MCPServer.stdio("docs", ["true"])
    assert server.exposed_name("read_doc") == "docs_read_doc"
    assert server.exposed_name("getIssue") == "docs_getIssue"  # valid names are kept as they are
    chinese = server.exposed_name("查找")
    assert chinese.startswith("docs_tool_") and len(chinese) == len("docs_tool_") + 8
    assert server.exposed_name("查找") == chinese  # stable across processes (recorded in history)
    assert server.exposed_name("search files") != server.exposed_name("search.files")
    assert MCPServer.stdio("文档", ["true"]).tool_prefix.startswith("mcp_")
    assert MCPServer.stdio("docs", ["true"], prefix="").exposed_name("read") == "read"


def test_two_different_servers_with_one_name_are_refused_at_worker_start() -> None:
    from relaykit.graph import AgentGraph

    first = Agent(name="a", model="openai:x", tools=[MCPServer.stdio("docs", ["one"])])
    second = Agent(name="b", model="openai:x", tools=[MCPServer.stdio("docs", ["two"])])
    with pytest.raises(ConfigurationError, match="two different MCP servers"):
        AgentGraph.build([first, second])
    with pytest.raises(ConfigurationError, match="invalid MCP server name"):
        MCPServer.stdio("docs/v2", ["x"])
    with pytest.raises(ConfigurationError, match="both put 'docs_'"):
        AgentGraph.build(
            [
                Agent(
                    name="c",
                    model="openai:x",
                    tools=[MCPServer.stdio("docs", ["x"]), MCPServer.http("Docs", "http://h")],
                )
            ]
        )


def test_mcp_tool_names_that_collide_get_a_stable_digest_and_function_tools_keep_theirs() -> None:
    from relaykit.mcp import MCPListing, MCPToolInfo
    from relaykit.workflows.mcp_tools import MCPTools

    @tool
    def docs_read_doc(name: str) -> str:
        """A function tool that happens to have the name an MCP tool would get."""
        return name

    docs = MCPServer.stdio("docs", ["x"])
    bare_a = MCPServer.stdio("a", ["x"], prefix="")
    bare_b = MCPServer.stdio("b", ["x"], prefix="")
    agent = Agent(name="collider", tools=[docs_read_doc, docs, bare_a, bare_b])
    listings = MCPTools(loop=None)  # type: ignore[arg-type]
    for server, names in ((docs, ["read_doc"]), (bare_a, ["search"]), (bare_b, ["search"])):
        listings._listings[server.name] = MCPListing(
            server=server.name, tools=[MCPToolInfo(name=n) for n in names]
        )
    names = list(listings.entries(agent))
    assert names[0].startswith("docs_read_doc_") and len(names[0]) == len("docs_read_doc_") + 8
    assert names[1] == "search"
    assert names[2].startswith("search_") and names[2] != names[0]
    again = MCPTools(loop=None)  # type: ignore[arg-type]
    again._listings = listings._listings
    assert list(again.entries(agent)) == names  # the same on every replay


def test_results_with_media_and_resources_reach_the_model_as_text_markers() -> None:
    from mcp.types import (
        CallToolResult,
        EmbeddedResource,
        ImageContent,
        TextContent,
        TextResourceContents,
    )

    from relaykit.activities.mcp_activities import render_result

    result = CallToolResult(
        content=[
            TextContent(type="text", text="see the chart"),
            ImageContent(type="image", data="aGVsbG8h", mime_type="image/png"),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(
                    uri="file:///notes.md", text="the notes", mime_type="text/markdown"
                ),
            ),
        ]
    )
    assert render_result(result) == "see the chart\n[image image/png, 6 bytes]\nthe notes"
    structured = CallToolResult(content=[], structured_content={"total": 3})
    assert render_result(structured) == '{"total": 3}'


async def test_worker_refuses_to_start_when_its_dynamic_activity_is_taken_and_mcp_needs_it(
    client: Client,
) -> None:
    from temporalio import activity

    from relaykit import Worker

    @activity.defn(dynamic=True)
    async def mine(args: Sequence[RawValue]) -> None:
        return None

    agent = Agent(name="taken", model="openai:x", tools=[MCPServer.stdio("docs", ["x"])])
    worker = Worker(client, agent, task_queue=f"tq-{uuid.uuid4().hex[:8]}", activities=[mine])
    with pytest.raises(ConfigurationError, match="dynamic activity"):
        async with worker:
            pass


# --- one shared stdio worker ---------------------------------------------------------------------


@dataclass
class DocsRig:
    worker: Any
    log: ServerLog
    model_server: ScriptedModelServer
    agents: dict[str, Agent] = field(default_factory=dict)

    def model(self, agent: str) -> str:
        model = self.agents[agent].model
        assert model is not None and not isinstance(model, str)
        return model.name


@pytest.fixture(scope="module")
async def docs(
    client: Client, model_server: ScriptedModelServer, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[DocsRig]:
    log = ServerLog(tmp_path_factory.mktemp("mcp") / "server.log")
    server = stdio_server(log, needs_approval={"delete_doc"}, max_output_chars=200)
    agents = {
        name: Agent(
            name=f"{name}-{uuid.uuid4().hex[:6]}",
            model=scripted_model(model_server),
            tools=[server],
        )
        for name in ("reader", "errors", "approver", "session", "killer")
    }

    @tool
    def kill_docs_server() -> str:
        """Kill the docs server process (SIGKILL), as a crash would."""
        pid = log.pids("count")[-1]
        os.kill(pid, signal.SIGKILL)
        for _ in range(400):
            if not process_alive(pid):
                return f"killed {pid}"
            time.sleep(0.05)
        return "still alive"

    agents["killer"].tools.append(kill_docs_server)
    async with serving(client, list(agents.values())) as worker:
        yield DocsRig(worker=worker, log=log, model_server=model_server, agents=agents)


async def test_agent_lists_and_calls_stdio_server_tools_each_call_an_activity_named_after_server_and_tool(  # noqa: E501
    client: Client, docs: DocsRig
) -> None:
    agent = docs.agents["reader"]
    docs.model_server.script(
        docs.model("reader"),
        [call("docs_read_doc", name="temporal.md"), text("Temporal replays history.")],
    )
    handle = await start_run(
        client, agent, "What does Temporal do?", task_queue=docs.worker.task_queue
    )
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "Temporal replays history."
    (tool_message,) = [m for m in result.transcript if m.role == "tool"]
    assert "history is replayed after a crash" in tool_message.content
    assert not tool_message.is_error
    # The model saw the server's tools with their schemas, under prefixed, valid names.
    first = docs.model_server.requests(docs.model("reader"))[0]
    assert {"docs_read_doc", "docs_list_docs", "docs_delete_doc"} <= set(first.tool_names)
    schema = next(
        t["function"]["parameters"]
        for t in first.body["tools"]
        if t["function"]["name"] == "docs_read_doc"
    )
    assert schema["properties"]["name"]["type"] == "string" and schema["required"] == ["name"]
    assert all(n.isascii() for n in first.tool_names)
    # Listing and the call are activities; the UI shows server and tool.
    assert await scheduled_activities(handle.workflow) == [
        "mcp:docs:list_tools",
        "relaykit.model_call",
        "mcp:docs/read_doc",
        "relaykit.model_call",
    ]
    summaries = await activity_summaries(handle.workflow, client)
    assert "list tools of docs" in summaries
    assert "docs.read_doc(name=temporal.md)" in summaries
    assert docs.log.done()['read_doc "temporal.md"'] == 1


async def test_server_errors_bad_arguments_and_non_ascii_tools_reach_the_model_as_results(
    client: Client, docs: DocsRig
) -> None:
    agent = docs.agents["errors"]
    listing = docs.model_server
    model = docs.model("errors")
    chinese = MCPServer.stdio("docs", ["x"]).exposed_name("查找")
    listing.script(
        model,
        [
            batch(
                call("docs_read_doc", id="c_missing", name="nope.md"),
                call("docs_report_error", id="c_is_error", message="quota exceeded"),
                call("docs_read_doc", id="c_bad_args", raw_arguments='{"title": 3}'),
                call("docs_read_doc", id="c_not_json", raw_arguments="{oops"),
                call(chinese, id="c_chinese", term="durable"),
                call("docs_big", id="c_big", size=5000),
            ),
            text("done"),
        ],
    )
    handle = await start_run(client, agent, "try things", task_queue=docs.worker.task_queue)
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    results = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert (
        results["c_missing"].is_error
        and "no document named 'nope.md'" in results["c_missing"].content
    )
    assert results["c_is_error"].is_error and results["c_is_error"].content == "quota exceeded"
    assert results["c_bad_args"].is_error and "name" in results["c_bad_args"].content
    assert results["c_not_json"].is_error and "not valid JSON" in results["c_not_json"].content
    assert not results["c_chinese"].is_error and results["c_chinese"].content == "found durable"
    big = results["c_big"]
    assert not big.is_error and big.content.startswith("x" * 200)
    assert "4800 characters dropped" in big.content  # the server's output cap
    types = await scheduled_activities(handle.workflow)
    assert "mcp:docs/查找" in types
    assert "mcp:docs/read_doc" in types
    # Each call ran once: errors are results, not retries.
    assert docs.log.done()['report_error "quota exceeded"'] == 1


async def test_tool_named_in_needs_approval_waits_for_a_person_and_a_rejected_call_never_runs(
    client: Client, docs: DocsRig
) -> None:
    agent = docs.agents["approver"]
    docs.model_server.script(
        docs.model("approver"),
        [
            batch(
                call("docs_delete_doc", id="c_del_a", name="a.md"),
                call("docs_delete_doc", id="c_del_b", name="b.md"),
                call("docs_list_docs", id="c_list"),
            ),
            text("done"),
        ],
    )
    handle = await start_run(client, agent, "clean up", task_queue=docs.worker.task_queue)

    async def pending_ids() -> list[str]:
        deadline = time.monotonic() + RESULT_TIMEOUT
        while not (pending := await handle.pending_approvals()):
            assert time.monotonic() < deadline, "approval never requested"
            await asyncio.sleep(0.05)
        return [p.call_id for p in pending]

    # Request order (the default): the second delete is asked for once the first is decided.
    assert await pending_ids() == ["c_del_a"]
    assert (await handle.pending_approvals())[0].tool == "docs_delete_doc"
    await handle.approve("c_del_a")
    while (ids := await pending_ids()) == ["c_del_a"]:
        await asyncio.sleep(0.05)
    assert ids == ["c_del_b"]
    await handle.approve("c_del_b", approved=False, reason="keep it")
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    results = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert results["c_del_a"].content == "deleted a.md"
    assert results["c_del_b"].is_error and "keep it" in results["c_del_b"].content
    assert not results["c_list"].is_error and "temporal.md" in results["c_list"].content
    assert docs.log.done()['delete_doc "a.md"'] == 1
    assert docs.log.done()['delete_doc "b.md"'] == 0


async def test_killed_server_process_is_restarted_and_completed_calls_are_not_repeated(
    client: Client, docs: DocsRig
) -> None:
    # The session is kept between calls (one process counts up), a SIGKILLed server process is
    # noticed and restarted for the next call, and nothing that completed runs again.
    agent = docs.agents["killer"]
    docs.model_server.script(
        docs.model("killer"),
        [
            call("docs_count", id="c1"),
            call("docs_count", id="c2"),
            call("kill_docs_server", id="c_kill"),
            call("docs_count", id="c3"),
            text("done"),
        ],
    )
    handle = await start_run(client, agent, "count", task_queue=docs.worker.task_queue)
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    results = {m.tool_call_id: m.content for m in result.transcript if m.role == "tool"}
    assert results["c_kill"].startswith("killed")
    pids = docs.log.pids("count")
    assert len(pids) == 3  # three calls, three executions: none repeated
    assert pids[-3] == pids[-2] != pids[-1]  # one session for the first two; a new process after
    assert (
        results["c2"].startswith("2 calls")
        or int(results["c2"].split()[0]) == int(results["c1"].split()[0]) + 1
    )
    assert results["c3"].startswith("1 calls")  # the restarted server starts counting again
    # The restart happened inside the call's first attempt: the call was never sent to the dead
    # process, so no attempt failed.
    events = await history_events(handle.workflow)
    attempts = [
        e.activity_task_started_event_attributes.attempt
        for e in events
        if e.HasField("activity_task_started_event_attributes")
    ]
    assert max(attempts) == 1


async def test_write_to_a_server_killed_a_moment_ago_is_sent_once_to_a_new_process(
    tmp_path: Path,
) -> None:
    # A session notices its stdio server's death a few event-loop steps after the pipe ends. The
    # loop is held here until the process is gone, so the next "write" finds a session that still
    # looks alive: it must go to a new process in the same attempt, not to the dead one.
    log = ServerLog(tmp_path / "server.log")
    server = stdio_server(log)
    sessions = MCPSessions({server.name: server})

    def count() -> MCPCallRequest:
        return MCPCallRequest(server="docs", tool="count", call_id="c", effect="write")

    try:
        first = await sessions.call_tool(server, count())
        assert first.content.startswith("1 calls")
        [pid] = log.pids("count")
        os.kill(pid, signal.SIGKILL)
        for _ in range(400):  # blocking on purpose: the session's reader must not run meanwhile
            if not process_alive(pid):
                break
            time.sleep(0.05)
        second = await sessions.call_tool(server, count())
    finally:
        await sessions.aclose()
    assert not second.is_error, second.content
    assert second.content.startswith("1 calls")  # a new process counts from one
    pids = log.pids("count")
    assert len(pids) == 2 and pids[0] == pid != pids[1]
    assert sessions.opened == 2


async def test_tools_are_listed_again_after_continue_as_new_while_the_worker_keeps_its_session(
    client: Client, docs: DocsRig
) -> None:
    agent = docs.agents["session"]
    docs.model_server.script(
        docs.model("session"),
        [call("docs_count", id="c1"), call("docs_count", id="c2"), text("done")],
    )
    handle = await start_run(
        client,
        agent,
        "count twice",
        task_queue=docs.worker.task_queue,
        continue_as_new_after_turns=1,
    )
    result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "done"
    # The last workflow run listed the tools itself: its history never depends on an earlier
    # run's listing, and a changed server shows up after a continue-as-new.
    assert await scheduled_activities(handle.workflow) == [
        "mcp:docs:list_tools",
        "relaykit.model_call",
    ]
    events = [e.kind for e in await handle.events()]
    assert events.count("continued_as_new") >= 1
    counts = [line for line in docs.log.lines() if line[1] == "count"][-2:]
    assert counts[0][0] == counts[1][0]  # one server process (the worker's session) for both runs
    assert int(counts[1][3]) == int(counts[0][3]) + 1


def test_needs_approval_takes_tool_names_or_a_predicate_on_name_and_arguments() -> None:
    by_name = MCPServer.stdio("s", ["x"], needs_approval={"delete_doc"})
    assert by_name.requires_approval("delete_doc", {}) and not by_name.requires_approval(
        "read_doc", {}
    )
    by_rule = MCPServer.stdio(
        "s",
        ["x"],
        needs_approval=lambda tool, args: tool.startswith("write") and args.get("path") != "/tmp",
    )
    assert by_rule.requires_approval("write_file", {"path": "/etc"})
    assert not by_rule.requires_approval("write_file", {"path": "/tmp"})
    assert MCPServer.stdio("s", ["x"], needs_approval=True).requires_approval("anything", {})


async def test_server_with_its_own_task_queue_runs_only_on_workers_of_that_queue(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    log = ServerLog(tmp_path / "server.log")
    server = stdio_server(log, name="remote", task_queue=f"mcp-only-{uuid.uuid4().hex[:8]}")
    model = scripted_model(model_server)
    model_server.script(model.name, [call("remote_count", id="c1"), text("done")])
    agent = Agent(name=f"queued-{uuid.uuid4().hex[:6]}", model=model, tools=[server])
    async with (
        serving(client, agent) as main,
        serving(client, agent, task_queue=server.task_queue) as remote,
    ):
        handle = await start_run(client, agent, "count", task_queue=main.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        assert (main.mcp_sessions.opened, remote.mcp_sessions.opened) == (0, 1)
        (server_pid,) = log.pids("count")
        assert process_alive(server_pid)
    assert result.output == "done"
    assert not process_alive(server_pid)  # stopped with the worker that started it
    queues = {
        attrs.activity_type.name: attrs.task_queue.name
        for e in await history_events(handle.workflow)
        for attrs in [e.activity_task_scheduled_event_attributes]
        if e.HasField("activity_task_scheduled_event_attributes")
    }
    assert queues["mcp:remote:list_tools"] == queues["mcp:remote/count"] == server.task_queue
    from relaykit.models.queues import model_queue

    # the model call on its provider's queue of the run's queue (docs/fleet.md)
    assert queues["relaykit.model_call"] == model_queue(model, main.task_queue)


async def test_call_slower_than_the_server_timeout_ends_in_an_error_result_and_include_limits_the_tools(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    log = ServerLog(tmp_path / "server.log")
    server = stdio_server(
        log, name="sleepy", timeout=1, retry=RetryPolicy(maximum_attempts=1), include={"slow"}
    )
    model = scripted_model(model_server)
    model_server.script(
        model.name, [call("sleepy_slow", id="c_slow", seconds=30), text("moved on")]
    )
    agent = Agent(name=f"sleepy-{uuid.uuid4().hex[:6]}", model=model, tools=[server])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "wait", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "moved on"
    (message,) = [m for m in result.transcript if m.role == "tool"]
    assert message.is_error and "did not answer within 1s" in message.content
    assert model_server.requests(model.name)[0].tool_names == [
        "sleepy_slow"
    ]  # only what `include` offers
    assert log.done()["slow 30"] + log.done()["slow 30.0"] == 0


# --- a server dying in the middle of calls, and the retry cap ------------------------------------


async def test_server_dying_during_every_attempt_ends_in_an_error_result_after_the_retry_cap(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    log = ServerLog(tmp_path / "server.log")
    server = stdio_server(
        log,
        name="fragile",
        retry=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=2),
    )
    model = scripted_model(model_server)
    model_server.script(model.name, [call("fragile_exit_now", id="c_exit"), text("gave up")])
    agent = Agent(name=f"fragile-{uuid.uuid4().hex[:6]}", model=model, tools=[server])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "gave up"
    (message,) = [m for m in result.transcript if m.role == "tool"]
    assert message.is_error and "not retried further" in message.content
    assert "connection" in message.content
    assert log.started()['exit_now ""'] == 2  # each attempt reached a fresh process: the cap held
    assert len({pid for pid, t, _, _ in log.lines() if t == "exit_now"}) == 2


async def test_stdio_server_that_cannot_start_fails_the_run_with_a_typed_error_after_its_retries(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    server = MCPServer.stdio(
        "missing",
        [str(tmp_path / "no-such-server")],
        retry=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=2),
    )
    model = scripted_model(model_server)
    agent = Agent(name=f"missing-{uuid.uuid4().hex[:6]}", model=model, tools=[server])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failed:
            await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert failed.value.type == "MCPServerUnavailable"
    assert "'missing'" in failed.value.message and "no-such-server" in failed.value.message
    assert await scheduled_activities(handle.workflow) == ["mcp:missing:list_tools"]
    assert model_server.request_count(model.name) == 0


# --- streamable HTTP, and both transports in one run ---------------------------------------------


def process_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie waiting for a parent to reap it has exited)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False
    return "\nState:\tZ" not in status


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class HTTPServerProcess:
    """The docs server over streamable HTTP on 127.0.0.1, demanding a bearer token."""

    log: ServerLog
    port: int = field(default_factory=free_port)
    token: str = field(default_factory=lambda: f"tok-{uuid.uuid4().hex}")
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/mcp"

    def start(self) -> None:
        env = dict(
            os.environ,
            MCP_TEST_LOG=str(self.log.path),
            MCP_TEST_DOCS=str(DOCS),
            MCP_TEST_REQUIRE_TOKEN=self.token,
        )
        self.proc = subprocess.Popen(
            [sys.executable, str(SERVER_SCRIPT), "--http", str(self.port)],
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=1).close()
                return
            except OSError:
                assert self.proc.poll() is None, "the HTTP MCP server exited"
                assert time.monotonic() < deadline, "the HTTP MCP server did not start"
                time.sleep(0.1)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)


@pytest.fixture
async def http_process(tmp_path: Path) -> AsyncIterator[HTTPServerProcess]:
    server = HTTPServerProcess(ServerLog(tmp_path / "http.log"))
    await asyncio.to_thread(server.start)
    try:
        yield server
    finally:
        await asyncio.to_thread(server.stop)


@pytest.fixture
async def http_server(http_process: HTTPServerProcess) -> AsyncIterator[tuple[str, str, ServerLog]]:
    yield http_process.url, http_process.token, http_process.log


async def test_one_durable_run_uses_a_stdio_server_and_an_http_server_whose_token_never_enters_history(  # noqa: E501
    client: Client,
    model_server: ScriptedModelServer,
    tmp_path: Path,
    http_server: tuple[str, str, ServerLog],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, token, http_log = http_server
    monkeypatch.setenv("RELAYKIT_TEST_TRACKER_TOKEN", token)
    stdio_log = ServerLog(tmp_path / "stdio.log")
    tracker = MCPServer.http(
        "tracker", url, headers_from_env={"Authorization": "Bearer $RELAYKIT_TEST_TRACKER_TOKEN"}
    )
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("docs_read_doc", id="c_doc", name="mcp.md"), call("tracker_whoami", id="c_who")
            ),
            call("tracker_read_doc", id="c_remote", name="temporal.md"),
            text("both servers answered"),
        ],
    )
    agent = Agent(
        name=f"both-{uuid.uuid4().hex[:6]}", model=model, tools=[stdio_server(stdio_log), tracker]
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "use both", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "both servers answered"
    results = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert "list and call the tools" in results["c_doc"].content
    assert json.loads(results["c_who"].content)["authorization"] == "yes"
    assert "replayed after a crash" in results["c_remote"].content
    assert stdio_log.done() == {'read_doc "mcp.md"': 1}
    assert http_log.done() == {'whoami ""': 1, 'read_doc "temporal.md"': 1}
    types = await scheduled_activities(handle.workflow)
    assert sorted(t for t in types if t.endswith(":list_tools")) == [
        "mcp:docs:list_tools",
        "mcp:tracker:list_tools",
    ]
    history = b"".join(e.SerializeToString() for e in await history_events(handle.workflow))
    assert token.encode() not in history
    # Replay needs no server: the listing and every result come from history.
    before = (stdio_log.lines(), http_log.lines())
    replayed = await replay(worker.graph, await handle.workflow.fetch_history())
    assert replayed.replay_failure is None
    assert (stdio_log.lines(), http_log.lines()) == before


async def replay(graph: Any, history: Any) -> Any:
    """Replay ``history`` through today's workflow code with ``graph`` (no worker, no server)."""
    from temporalio.contrib.pydantic import pydantic_data_converter
    from temporalio.worker import Replayer

    from relaykit import registry
    from relaykit.sandbox import sandbox_runner
    from relaykit.workflows.agent_run import AgentRun

    build_id = f"mcp-{uuid.uuid4().hex[:8]}"
    registry.register(f"replay-{build_id}", graph)  # where a Replayer's workflows look agents up
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            data_converter=pydantic_data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build_id,
        )
        return await replayer.replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(f"replay-{build_id}", graph)


async def test_missing_header_variable_fails_the_run_with_a_typed_error_naming_only_the_variable(
    client: Client,
    model_server: ScriptedModelServer,
    http_server: tuple[str, str, ServerLog],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    url, _, _ = http_server
    monkeypatch.delenv("RELAYKIT_TEST_MISSING_TOKEN", raising=False)
    tracker = MCPServer.http(
        "tracker2", url, headers_from_env={"Authorization": "RELAYKIT_TEST_MISSING_TOKEN"}
    )
    model = scripted_model(model_server)
    agent = Agent(name=f"nokey-{uuid.uuid4().hex[:6]}", model=model, tools=[tracker])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failed:
            await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert failed.value.type == "MCPServerUnavailable"
    assert "RELAYKIT_TEST_MISSING_TOKEN" in failed.value.message
    assert model_server.request_count(model.name) == 0  # no model call without the tool list


async def test_http_server_restarted_between_calls_gets_a_new_session_and_no_call_repeats(
    client: Client,
    model_server: ScriptedModelServer,
    http_process: HTTPServerProcess,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELAYKIT_TEST_TRACKER_TOKEN", http_process.token)

    @tool
    def restart_tracker() -> str:
        """Restart the tracker server (a new process: every session it knew is gone)."""
        http_process.stop()
        http_process.start()
        return "restarted"

    tracker = MCPServer.http(
        "tracker3",
        http_process.url,
        headers_from_env={"Authorization": "Bearer $RELAYKIT_TEST_TRACKER_TOKEN"},
    )
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("tracker3_whoami", id="c1"),
            call("restart_tracker", id="c_restart"),
            call("tracker3_whoami", id="c2"),
            text("done"),
        ],
    )
    agent = Agent(
        name=f"restart-{uuid.uuid4().hex[:6]}", model=model, tools=[tracker, restart_tracker]
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    results = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert not results["c2"].is_error, results["c2"].content
    first, second = json.loads(results["c1"].content), json.loads(results["c2"].content)
    assert first["pid"] != second["pid"]
    assert http_process.log.done() == {'whoami ""': 2}


async def test_write_to_a_stopped_http_server_fails_unsent_and_is_made_once_it_is_back(
    http_process: HTTPServerProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A "write" to an HTTP server that is down fails as not sent (MCPServerUnavailable: a retry
    # may send it), not as a connection lost during the request (an unknown outcome for a
    # claimed write); once the server is back, the call is made once, on a new session.
    monkeypatch.setenv("RELAYKIT_TEST_TRACKER_TOKEN", http_process.token)
    tracker = MCPServer.http(
        "tracker4",
        http_process.url,
        headers_from_env={"Authorization": "Bearer $RELAYKIT_TEST_TRACKER_TOKEN"},
    )
    sessions = MCPSessions({tracker.name: tracker})

    def count() -> MCPCallRequest:
        return MCPCallRequest(server=tracker.name, tool="count", call_id="c", effect="write")

    try:
        first = await sessions.call_tool(tracker, count())
        await asyncio.to_thread(http_process.stop)
        with pytest.raises(ApplicationError) as down:
            await sessions.call_tool(tracker, count())
        await asyncio.to_thread(http_process.start)
        third = await sessions.call_tool(tracker, count())
    finally:
        await sessions.aclose()
    assert first.content.startswith("1 calls") and third.content.startswith("1 calls")
    assert down.value.type == "MCPServerUnavailable", down.value
    assert len(http_process.log.pids("count")) == 2


# --- a killed worker process ----------------------------------------------------------------------


@dataclass
class WorkerProcesses:
    """Workers serving ``tests.mcp_crash_agents`` in processes of their own, so they can die."""

    temporal: DevServer
    model_server: ScriptedModelServer
    tmp: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    model: str = field(default_factory=lambda: f"mcp-crash-{uuid.uuid4().hex[:8]}")
    task_queue: str = field(default_factory=lambda: f"mcp-crash-{uuid.uuid4().hex[:8]}")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def start(self) -> subprocess.Popen[bytes]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
        env.update(
            TEMPORAL_ADDRESS=self.temporal.address,
            TEMPORAL_NAMESPACE="default",
            CRASH_MODEL_URL=self.model_server.base_url,
            CRASH_MODEL_NAME=self.model,
            MCP_TEST_DOCS=str(DOCS),
            PYTHONUNBUFFERED="1",
            **self.extra_env,
        )
        out = open(self.tmp / f"worker-{len(self.processes)}.log", "wb")  # noqa: SIM115
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                "tests.mcp_crash_agents",
                "--task-queue",
                self.task_queue,
            ],
            cwd=REPO_ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
        )
        out.close()
        self.processes.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)


async def wait_for_log(log: ServerLog, tool_name: str, what: str) -> None:
    deadline = time.monotonic() + RESULT_TIMEOUT
    while not any(t == tool_name for _, t, _, _ in log.lines()):
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.05)


async def test_one_run_uses_stdio_and_http_servers_and_survives_a_server_kill_and_a_worker_kill(
    client: Client,
    temporal_server: DevServer,
    model_server: ScriptedModelServer,
    tmp_path: Path,
    http_process: HTTPServerProcess,
) -> None:
    # The "done when", in one durable run: tools of a stdio and of an HTTP server, the
    # stdio server process SIGKILLed between calls, then the worker SIGKILLed during a call.
    # Every call that completed ran exactly once; the one in flight at the worker kill ran again.
    from tests.test_crash_recovery import forget_sticky_worker, kill

    log = ServerLog(tmp_path / "stdio.log")
    release = tmp_path / "release"
    workers = WorkerProcesses(
        temporal_server,
        model_server,
        tmp_path,
        extra_env={
            "MCP_TEST_LOG": str(log.path),
            "MCP_TEST_RELEASE": str(release),
            "MCP_TEST_HTTP_URL": http_process.url,
            "MCP_TEST_TOKEN": http_process.token,
        },
    )
    model_server.script(
        workers.model,
        [
            batch(
                call("docs_read_doc", id="c_read", name="temporal.md"),
                call("tracker_whoami", id="c_who"),
            ),
            call("kill_docs_server", id="c_kill"),
            call("docs_count", id="c_count"),
            call("docs_slow", id="c_slow", seconds=0),
            call("tracker_read_doc", id="c_remote", name="mcp.md"),
            text("survived"),
        ],
    )
    try:
        first = workers.start()
        handle = await start_run(client, "mcp_crash_agent", "go", task_queue=workers.task_queue)
        await wait_for_log(log, "slow", "the slow call never started")
        old_server = log.lines()[-1][0]
        kill(first)
        await forget_sticky_worker(client, handle)
        release.touch()
        workers.start()
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    finally:
        workers.close()
    assert result.output == "survived"
    results = {m.tool_call_id: m for m in result.transcript if m.role == "tool"}
    assert not any(m.is_error for m in results.values()), results
    assert results["c_count"].content.startswith("1 calls")  # a fresh process after the kill
    assert json.loads(results["c_who"].content)["authorization"] == "yes"
    assert "list and call the tools" in results["c_remote"].content
    done = log.done()
    assert done['read_doc "temporal.md"'] == 1 and done["count 1"] == 1
    assert log.started()["slow 0.0"] + log.started()["slow 0"] == 2  # in flight at the worker kill
    assert len({pid for pid, _, _, _ in log.lines()}) == 3  # killed server, restart, new worker's
    assert http_process.log.done() == {'whoami ""': 1, 'read_doc "mcp.md"': 1}
    assert log.pids("slow")[-1] != old_server
    assert results["c_slow"].content.startswith("waited 0")
    deadline = time.monotonic() + 20
    while process_alive(old_server):  # the killed worker's server saw its stdin close and exited
        assert time.monotonic() < deadline, "the dead worker's MCP server process lives on"
        await asyncio.sleep(0.1)


async def kill_once_the_next_worker_polls(
    client: Client, workers: WorkerProcesses, first: Any, handle: Any, tmp_path: Path
) -> float:
    """SIGKILL ``first`` once a second worker polls (so the wait that follows is Temporal's,
    not a start-up), and make the run forget its sticky worker; returns the moment of the kill."""
    from tests.test_crash_recovery import forget_sticky_worker, kill

    workers.start()
    ready = tmp_path / "worker-1.log"
    deadline = time.monotonic() + RESULT_TIMEOUT
    while b"worker on task queue" not in ready.read_bytes():
        assert time.monotonic() < deadline, "the second worker never started"
        await asyncio.sleep(0.1)
    kill(first)
    killed = time.monotonic()
    await forget_sticky_worker(client, handle)
    return killed


async def test_mcp_call_on_a_killed_worker_is_retried_after_the_default_heartbeat_timeout(
    client: Client, temporal_server: DevServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # No heartbeat_timeout given: MCP calls heartbeat by default like Python tools (10 s), so
    # the call in flight on a SIGKILLed worker is retried after seconds, not after its
    # start-to-close timeout (timeout + list_timeout: 3 minutes).
    log = ServerLog(tmp_path / "stdio.log")
    release = tmp_path / "release"
    workers = WorkerProcesses(
        temporal_server,
        model_server,
        tmp_path,
        extra_env={
            "MCP_TEST_LOG": str(log.path),
            "MCP_TEST_RELEASE": str(release),
            "MCP_TEST_DEFAULT_HEARTBEAT": "1",
        },
    )
    model_server.script(workers.model, [call("docs_slow", id="c_slow", seconds=0), text("back")])
    try:
        first = workers.start()
        handle = await start_run(client, "mcp_crash_agent", "go", task_queue=workers.task_queue)
        await wait_for_log(log, "slow", "the slow call never started")
        killed = await kill_once_the_next_worker_polls(client, workers, first, handle, tmp_path)
        release.touch()
        while log.started()["slow 0"] + log.started()["slow 0.0"] < 2:
            assert time.monotonic() - killed < 30, "the call was not retried within 30 s"
            await asyncio.sleep(0.1)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    finally:
        workers.close()
    assert result.output == "back"
    (message,) = [m for m in result.transcript if m.role == "tool"]
    assert message.content.startswith("waited 0") and not message.is_error


async def test_mcp_listing_on_a_killed_worker_is_retried_after_the_default_heartbeat_timeout(
    client: Client, temporal_server: DevServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The listing of a server's tools heartbeats like its calls: a worker SIGKILLed while its
    # server starts (slowly) is noticed within seconds, not after list_timeout (60 s), and the
    # next worker lists the tools and the run goes on.
    log = ServerLog(tmp_path / "stdio.log")
    release = tmp_path / "release"
    workers = WorkerProcesses(
        temporal_server,
        model_server,
        tmp_path,
        extra_env={
            "MCP_TEST_LOG": str(log.path),
            "MCP_TEST_HOLD_START": str(release),
            "MCP_TEST_RELEASE": str(release),  # the docs server's environment names it
            "MCP_TEST_DEFAULT_HEARTBEAT": "1",
        },
    )
    model_server.script(workers.model, [text("listed")])
    try:
        first = workers.start()
        handle = await start_run(client, "mcp_crash_agent", "go", task_queue=workers.task_queue)
        await wait_for_log(log, "server", "the docs server never started")
        killed = await kill_once_the_next_worker_polls(client, workers, first, handle, tmp_path)
        release.touch()
        while log.started()['server ""'] < 2:
            assert time.monotonic() - killed < 30, "the listing was not retried within 30 s"
            await asyncio.sleep(0.1)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    finally:
        workers.close()
    assert result.output == "listed"


# --- the example ----------------------------------------------------------------------------------


async def test_mcp_research_example_answers_from_the_local_library_with_its_scripted_stand_in(
    client: Client, model_server: ScriptedModelServer
) -> None:
    from examples.mcp_research import librarian, scripted_librarian

    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_librarian)  # type: ignore[arg-type]
    async with serving(client, librarian, default_model=model) as worker:
        handle = await start_run(
            client,
            librarian,
            "How does durable execution survive a crash?",
            task_queue=worker.task_queue,
        )
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert "replays the history" in result.output
    assert "(source: Durable execution)" in result.output
    assert await scheduled_activities(handle.workflow) == [
        "mcp:library:list_tools",
        "relaykit.model_call",
        "mcp:library/search",
        "relaykit.model_call",
        "mcp:library/read_document",
        "relaykit.model_call",
    ]
