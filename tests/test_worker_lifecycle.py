"""``relaykit worker`` and ``relaykit dev`` as processes: their lifecycle options work, and SIGTERM
stops them cleanly (the crash tests cover SIGTERM during a tool call)."""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, TaskQueueKind
from temporalio.client import Client

from relaykit import Agent, Worker, start_run
from relaykit.errors import ConfigurationError
from relaykit.testing.scripted_server import ScriptedModelServer, call, text

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def wait_for_text(path: Path, needle: str, proc: subprocess.Popen[bytes], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and needle in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"{needle!r} not seen; output:\n{path.read_text(errors='replace')}")


def environment(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(NO_COLOR="1", PYTHONUNBUFFERED="1", **extra)
    return env


async def _serve_one_run(
    client: Client,
    temporal_server: object,
    model_server: ScriptedModelServer,
    tmp_path: Path,
    *options: str,
) -> tuple[str, str]:
    """``relaykit worker tests.crash_agents OPTIONS`` serves one run (a ``quick`` call, then an
    answer) and stops on SIGTERM with status 0: (the run's id, the worker's output)."""
    model = f"life-{uuid.uuid4().hex[:8]}"
    queue = f"life-{uuid.uuid4().hex[:8]}"
    model_server.script(model, [call("quick", n=7), text("done")])
    out = tmp_path / "worker.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                "tests.crash_agents",
                "--task-queue",
                queue,
                *options,
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment(
                TEMPORAL_ADDRESS=temporal_server.address,  # type: ignore[attr-defined]
                CRASH_MODEL_URL=model_server.base_url,
                CRASH_MODEL_NAME=model,
                CRASH_TOOL_LOG=str(tmp_path / "tools.log"),
            ),
        )
        try:
            handle = await start_run(client, "crash_agent", "go", task_queue=queue)
            result = await asyncio.wait_for(handle.result(), timeout=60)
            assert result.output == "done"
            proc.send_signal(signal.SIGTERM)
            assert await asyncio.to_thread(proc.wait, 30) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert (tmp_path / "tools.log").read_text().splitlines() == ["quick 7"]
    output = out.read_text()
    assert "worker stopped" in output
    return handle.id, output


async def test_worker_with_lifecycle_options_serves_runs_and_stops_cleanly_on_sigterm(
    client: Client, temporal_server: object, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    run_id, output = await _serve_one_run(
        client,
        temporal_server,
        model_server,
        tmp_path,
        *("--tool-threads", "2", "--max-concurrent-activities", "4"),
        *("--sticky-timeout", "2", "--graceful-shutdown", "1"),
    )
    assert "keeps up to 1000 runs in memory between their steps" in output  # Temporal's default
    # Kept in memory, the run's later steps went to this worker's own (sticky) queue.
    kinds = await _workflow_task_queue_kinds(client, run_id)
    assert TaskQueueKind.TASK_QUEUE_KIND_STICKY in kinds[1:], kinds


async def test_a_worker_that_keeps_no_run_in_memory_replays_each_step_and_repeats_nothing(
    client: Client, temporal_server: object, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    """``--max-cached-workflows 0``: what bounds a fleet worker's memory, at its limit. Every
    step of the run is a full replay of its history on the run's own queue, and the tool still
    ran once."""
    run_id, output = await _serve_one_run(
        client, temporal_server, model_server, tmp_path, "--max-cached-workflows", "0"
    )
    assert "keeps up to 0 runs in memory between their steps" in output
    kinds = await _workflow_task_queue_kinds(client, run_id)
    assert len(kinds) >= 3 and set(kinds) == {TaskQueueKind.TASK_QUEUE_KIND_NORMAL}, kinds


async def test_a_worker_refuses_a_negative_cache_size(client: Client) -> None:
    agent = Agent(name="cached", model="openai:gpt-4.1-mini")
    with pytest.raises(ConfigurationError, match="max_cached_workflows cannot be negative, got -1"):
        Worker(client, agent, max_cached_workflows=-1)
    assert Worker(client, agent).max_cached_workflows == 1000  # Temporal's own default
    assert Worker(client, agent, max_cached_workflows=0).max_cached_workflows == 0


async def _workflow_task_queue_kinds(client: Client, run_id: str) -> list[int]:
    """The kind of task queue each of the run's workflow tasks was scheduled on."""
    history = await client.get_workflow_handle(run_id).fetch_history()
    return [
        event.workflow_task_scheduled_event_attributes.task_queue.kind
        for event in history.events
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED
    ]


def test_dev_stops_worker_and_server_cleanly_on_sigterm(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    out = tmp_path / "dev.log"
    with open(out, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "dev",
                "tests.crash_agents",
                "--port",
                str(port),
                "--ui-port",
                str(ui_port),
                "--data-dir",
                str(tmp_path / "data"),
                "--graceful-shutdown",
                "2",
                "--sticky-timeout",
                "2",
                "--tool-threads",
                "2",
            ],
            cwd=ROOT,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=environment(RELAYKIT_MODEL="scripted"),
        )
        try:
            wait_for_text(out, "ready:", proc, timeout=120)
            assert port_open(port)
            proc.send_signal(signal.SIGTERM)
            assert proc.wait(timeout=60) == 0
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert "stopping" in out.read_text()
    assert not port_open(port)  # the embedded server went with it
