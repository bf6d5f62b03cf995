"""The ``relaykit`` command line, as a person runs it: real processes, real server."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from relaykit.devserver import DevServer

ROOT = Path(__file__).resolve().parents[1]


def relaykit(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "relaykit.cli", *args],
        cwd=ROOT, env=full_env, capture_output=True, text=True, timeout=timeout,
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_demo_runs_a_multi_step_run_on_the_embedded_server(tmp_path: Path) -> None:
    # The quick start's main job, offline with the scripted stand-in: it says which model served
    # it, shows the tool calls, the answer and the run's Temporal UI link.
    port, ui_port = free_port(), free_port()
    done = relaykit(
        "demo", "--exit", "--port", str(port), "--ui-port", str(ui_port), "--data-dir", str(tmp_path),
        env={"RELAYKIT_MODEL": "scripted"},
    )
    assert done.returncode == 0, done.stderr
    assert "scripted stand-in model" in done.stderr
    assert "→ get_weather" in done.stderr and "→ convert_currency" in done.stderr
    assert "500.00 EUR = 81967.21 JPY" in done.stdout
    assert f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/travel_assistant-" in done.stdout
    assert (tmp_path / "temporal.db").exists()


def test_unknown_module_gives_one_clear_line() -> None:
    done = relaykit("worker", "no_such_module_here")
    assert done.returncode != 0
    assert done.stderr.strip().splitlines() == [
        "error: no module named 'no_such_module_here' (hint: give a dotted module path importable "
        "from the current directory, e.g. examples.triage)"
    ]


def test_unreachable_server_gives_one_clear_line() -> None:
    done = relaykit("run", "triage", "hi", env={"TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert done.returncode != 0
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: cannot reach the Temporal server at 127.0.0.1:")
    assert "relaykit dev" in lines[0]


def test_run_of_an_agent_no_worker_serves_fails_with_the_known_agents(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # A worker serving examples.demo, then `relaykit run` of an agent it does not serve.
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "RELAYKIT_MODEL": "openai:unused"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "worker", "examples.demo", "--task-queue", "cli-tq"],
        cwd=ROOT, env={**os.environ, **env}, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        done = relaykit("run", "nobody", "hi", "--task-queue", "cli-tq", "--wait", env=env)
    finally:
        worker.terminate()
        worker.wait(timeout=10)
    assert done.returncode == 1
    assert "run failed (UnknownAgent): unknown agent 'nobody'" in done.stderr
    assert "travel_assistant" in done.stderr


def test_result_of_an_unknown_run_id_fails_clearly(temporal_server: DevServer) -> None:
    done = relaykit("result", "no-such-run", env={"TEMPORAL_ADDRESS": temporal_server.address})
    assert done.returncode == 1
    assert "no run with id 'no-such-run'" in done.stderr


def test_ui_url_prints_the_run_page() -> None:
    done = relaykit("ui-url", "triage-123", env={"RELAYKIT_UI_URL": "http://ui.example:8080/"})
    assert done.stdout.strip() == "http://ui.example:8080/namespaces/default/workflows/triage-123"


@pytest.mark.parametrize("command", [["--help"], ["run", "--help"], ["approve", "--help"]])
def test_help_works(command: list[str]) -> None:
    done = relaykit(*command)
    assert done.returncode == 0 and "Usage" in done.stdout
