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

from temporalio.client import Client

from relaykit import start_run
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


async def test_worker_with_lifecycle_options_serves_runs_and_stops_cleanly_on_sigterm(
    client: Client, temporal_server: object, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
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
                "--tool-threads",
                "2",
                "--max-concurrent-activities",
                "4",
                "--sticky-timeout",
                "2",
                "--graceful-shutdown",
                "1",
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
    assert "worker stopped" in out.read_text()


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
