"""``relaykit watch`` and ``relaykit runs`` as a person runs them: real processes against the
session's Temporal server, with the worker in the test process."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import threading
import uuid
from pathlib import Path

from temporalio.client import Client

from relaykit import Agent, start_run, tool
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import eventually, scripted_model, serving
from tests.test_events import team

ROOT = Path(__file__).resolve().parents[1]


def cli_env(server: DevServer) -> dict[str, str]:
    return {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TEMPORAL_ADDRESS": server.address}


async def relaykit(server: DevServer, *args: str, timeout: float = 60) -> tuple[int, str, str]:
    """Run the CLI without blocking the event loop (the worker answering its queries is here)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relaykit.cli",
        *args,
        cwd=ROOT,
        env=cli_env(server),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_watch_of_a_finished_run_prints_the_whole_log_with_child_runs_and_exits(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # Contract: on a finished run, watch prints every event (children indented, with their run
    # path) and terminates.
    manager = team(model_server)
    async with serving(client, manager) as worker:
        handle = await start_run(client, manager, "go", task_queue=worker.task_queue)
        await handle.result()
        code, out, err = await relaykit(temporal_server, "watch", handle.id)
        items = [item async for item in handle.stream(deltas=False)]
    assert code == 0, err
    lines = out.splitlines()
    assert len(lines) == len(items)
    assert "manager" in lines[0] and "started: go" in lines[0]
    assert any("manager/summarizer" in line and "→ note(text=draft)" in line for line in lines)
    assert any(
        "manager/researcher" in line and "final answer: research done" in line for line in lines
    )
    assert "final answer: all done" in lines[-1]
    assert "run completed · agent manager" in err


def _as_in_the_foreground() -> None:
    """Ctrl-C reaches a command run in the foreground. A suite started in the background (by a
    shell without job control) ignores SIGINT and its children inherit that, which would leave
    the watch process deaf to the Ctrl-C this test sends."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


async def test_watch_follows_a_live_run_stops_on_ctrl_c_and_resumes_from_its_cursor(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # Contract: Ctrl-C leaves the run alone and prints a cursor; watching again from it shows
    # the rest of the run exactly once and ends with the run.
    gate = threading.Event()
    model = scripted_model(model_server)

    @tool
    def step(n: int) -> str:
        """Take a step."""
        return f"step {n}"

    model_server.script(model.name, [call("step", n=1), text("done", hold=gate)])
    agent = Agent(name="walker", model=model, tools=[step])
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-m",
                "relaykit.cli",
                "watch",
                handle.id,
                cwd=ROOT,
                env=cli_env(temporal_server),
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                preexec_fn=_as_in_the_foreground,
            )
            assert proc.stdout is not None
            first: list[str] = []
            while not any("tool_result" in line for line in first):
                line = await asyncio.wait_for(proc.stdout.readline(), 20)
                first.append(line.decode().rstrip("\n"))
            proc.send_signal(signal.SIGINT)
            rest_out, err = await asyncio.wait_for(proc.communicate(), 20)
            assert proc.returncode == 130
            first += rest_out.decode().splitlines()
            hint = err.decode().strip().splitlines()[-1]
            assert hint.startswith(
                "stopped watching (the run goes on); "
                f"resume with: relaykit watch {handle.id} --from "
            )
            cursor = hint.rsplit(" ", 1)[-1]
            gate.set()
            code, out, err2 = await relaykit(temporal_server, "watch", handle.id, "--from", cursor)
            assert code == 0, err2
            assert (await handle.result()).output == "done"
    finally:
        gate.set()
    kinds = [line.split()[3] for line in first + out.splitlines()]
    assert kinds == [
        "run_started",
        "model_call",
        "tool_call",
        "tool_result",
        "model_call",
        "message",
        "final",
    ]


async def test_runs_lists_runs_with_status_agent_and_tokens_and_filters_them(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # Contract: `runs` reads visibility (RelayStatus/RelayAgent/RelayTokens); --status,
    # --agent and --roots narrow it down.
    tag = uuid.uuid4().hex[:6]
    gate = threading.Event()
    quick_model, slow_model = scripted_model(model_server), scripted_model(model_server)
    helper_model = scripted_model(model_server)
    model_server.script(quick_model.name, [call(f"ask_helper_{tag}", input="x"), text("fast")])
    model_server.script(helper_model.name, [text("helped")])

    @tool(needs_approval=True)
    def launch(target: str) -> str:
        """Launch."""
        return "launched"

    model_server.script(slow_model.name, [call("launch", target="moon"), text("ok", hold=gate)])
    helper = Agent(name=f"helper_{tag}", model=helper_model)
    quick = Agent(name=f"quick_{tag}", model=quick_model, tools=[helper.as_tool()])
    careful = Agent(name=f"careful_{tag}", model=slow_model, tools=[launch])
    try:
        async with serving(client, [quick, careful]) as worker:
            done = await start_run(client, quick, "hi", task_queue=worker.task_queue)
            await done.result()
            waiting = await start_run(client, careful, "go", task_queue=worker.task_queue)

            async def listed() -> bool:
                code, out, _ = await relaykit(temporal_server, "runs", "--json")
                rows = {r["run_id"]: r for r in json.loads(out)} if code == 0 else {}
                return (
                    rows.get(done.id, {}).get("status") == "completed"
                    and rows.get(waiting.id, {}).get("status") == "waiting_approval"
                    and any(
                        r["parent"] == done.id and r["status"] == "completed" for r in rows.values()
                    )
                )

            await eventually(listed, "the runs in visibility")
            code, out, err = await relaykit(temporal_server, "runs")
            assert code == 0, err
            line = next(line for line in out.splitlines() if line.startswith(done.id))
            # RUN STATUS AGENT AGE TOKENS COST (BUILD is empty for an unversioned worker)
            assert line.split()[1:3] == ["completed", quick.name] and line.split()[-2:] == [
                "45",
                "$0.0000",
            ]
            code, out, _ = await relaykit(
                temporal_server,
                "runs",
                "--agent",
                careful.name,
                "--status",
                "waiting_approval",
                "--json",
            )
            assert [r["run_id"] for r in json.loads(out)] == [waiting.id]
            code, out, _ = await relaykit(temporal_server, "runs", "--agent", quick.name, "--json")
            assert [(r["run_id"], r["tokens"]) for r in json.loads(out)] == [(done.id, 45)]
            code, out, _ = await relaykit(temporal_server, "runs", "--json")
            children = [r for r in json.loads(out) if r["parent"] == done.id]
            assert [(r["agent"], r["status"], r["tokens"]) for r in children] == [
                (helper.name, "completed", 15)
            ]
            code, out, _ = await relaykit(temporal_server, "runs", "--roots", "--json")
            assert done.id in {r["run_id"] for r in json.loads(out)}
            assert not [r for r in json.loads(out) if r["parent"] is not None]
            code, out, _ = await relaykit(
                temporal_server, "runs", "--agent", quick.name, "--status", "failed", "--json"
            )
            assert json.loads(out) == []
            code, _, err = await relaykit(temporal_server, "runs", "--status", "sleeping")
            assert code == 1 and "unknown status 'sleeping'" in err
            await waiting.cancel()
    finally:
        gate.set()
