"""The ``relaykit`` command line, as a person runs it: real processes, real server."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from relaykit.devserver import DevServer
from relaykit.errors import RelaykitError

ROOT = Path(__file__).resolve().parents[1]


def relaykit(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "relaykit.cli", *args],
        cwd=ROOT,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
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
        "demo",
        "--exit",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--data-dir",
        str(tmp_path),
        env={"RELAYKIT_MODEL": "scripted"},
    )
    assert done.returncode == 0, done.stderr
    assert "scripted stand-in model" in done.stderr
    assert "ran get_weather" in done.stderr and "ran convert_currency" in done.stderr
    assert "500.00 EUR = 81967.21 JPY" in done.stdout
    assert (
        f"http://127.0.0.1:{ui_port}/namespaces/default/workflows/travel_assistant-" in done.stdout
    )
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
    assert len(lines) == 1 and lines[0].startswith(
        "error: cannot reach the Temporal server at 127.0.0.1:"
    )
    assert "relaykit dev" in lines[0]


def test_run_of_an_agent_no_worker_serves_fails_with_the_known_agents(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # A worker serving examples.demo, then `relaykit run` of an agent it does not serve.
    env = {"TEMPORAL_ADDRESS": temporal_server.address, "RELAYKIT_MODEL": "openai:unused"}
    worker = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "worker", "examples.demo", "--task-queue", "cli-tq"],
        cwd=ROOT,
        env={**os.environ, **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
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


# --- helpers for long-running commands ----------------------------------------------------------


class Lines:
    """A process's output lines, read in the background so a test can wait for one."""

    def __init__(self, stream: Any) -> None:
        self.lines: list[str] = []
        self._queue: queue.Queue[str | None] = queue.Queue()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream: Any) -> None:
        for line in iter(stream.readline, ""):
            self._queue.put(line.rstrip("\n"))
        self._queue.put(None)

    def wait_for(self, text: str, timeout: float = 60) -> str:
        deadline = time.monotonic() + timeout
        for line in self.lines:
            if text in line:
                return line
        while time.monotonic() < deadline:
            try:
                line = self._queue.get(timeout=max(0.01, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.lines.append(line)
            if text in line:
                return line
        raise AssertionError(f"{text!r} not seen; output so far:\n" + "\n".join(self.lines))


def popen(*args: str, env: dict[str, str] | None = None, cwd: Path = ROOT) -> subprocess.Popen[str]:
    full_env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **(env or {})}
    return subprocess.Popen(
        [sys.executable, *args],
        cwd=cwd,
        env=full_env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def stop(proc: subprocess.Popen[str]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def worker_process(
    temporal_server: DevServer,
    *targets: str,
    task_queue: str,
    tmp_path: Path,
    env: dict[str, str] | None = None,
    cwd: Path = ROOT,
) -> Iterator[Lines]:
    """`relaykit worker TARGETS` with the scripted stand-in model, until the block ends."""
    proc = popen(
        "-m",
        "relaykit.cli",
        "worker",
        *targets,
        "--task-queue",
        task_queue,
        env={
            "TEMPORAL_ADDRESS": temporal_server.address,
            "RELAYKIT_MODEL": "scripted",
            "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "transcripts"),
            **(env or {}),
        },
        cwd=cwd,
    )
    lines = Lines(proc.stderr)
    try:
        lines.wait_for("worker on task queue")
        yield lines
    finally:
        stop(proc)


def cli_env(temporal_server: DevServer) -> dict[str, str]:
    return {"TEMPORAL_ADDRESS": temporal_server.address}


SLOW_AGENTS = '''
import asyncio
import os
from pathlib import Path

from relaykit import Agent, tool
from relaykit.testing.scripted_server import call, text


@tool
async def hold() -> str:
    """Hold until the test releases the call."""
    folder = Path(os.environ["SLOW_DIR"])
    (folder / "holding").write_text("")
    while not (folder / "release").exists():
        await asyncio.sleep(0.05)
    return "released"


slowpoke = Agent(name="slowpoke", instructions="Hold, then answer.", tools=[hold])


def scripted_responder(request):
    return text("done") if request.last_message_is_tool_result else call("hold")
'''
"""An agent whose one tool call runs until the test writes the ``release`` file."""


def wait_for_file(path: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared"
        time.sleep(0.05)


# --- worker.py, model resolution ---------------------------------------------------------------


def test_worker_py_serves_every_example_with_the_models_scripted_stand_ins(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    queue_name = f"wpy-{uuid.uuid4().hex[:8]}"
    proc = popen(
        "worker.py",
        env={
            "TEMPORAL_ADDRESS": temporal_server.address,
            "RELAYKIT_MODEL": "scripted",
            "RELAYKIT_TASK_QUEUE": queue_name,
            "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "transcripts"),
        },
    )
    lines = Lines(proc.stderr)
    try:
        serving = lines.wait_for("serving:")
        triage = relaykit(
            "run",
            "triage",
            "I was charged twice",
            "-q",
            queue_name,
            "--wait",
            env=cli_env(temporal_server),
        )
        demo = relaykit(
            "run",
            "travel_assistant",
            "I fly from Paris to Tokyo tomorrow with 500 EUR. Weather in both, and in yen?",
            "-q",
            queue_name,
            "--wait",
            env=cli_env(temporal_server),
        )
    finally:
        stop(proc)
    assert "scripted stand-in model" in "\n".join(lines.lines)
    for agent in (
        "triage",
        "billing",
        "travel_assistant",
        "research_lead",
        "deep_research",
        "refund_agent",
    ):
        assert agent in serving
    assert triage.returncode == 0, triage.stderr
    assert "You were charged twice" in triage.stdout
    assert demo.returncode == 0, demo.stderr
    assert "JPY" in demo.stdout


def test_worker_py_serves_only_the_agents_named_by_relaykit_agents(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    proc = popen(
        "worker.py",
        env={
            "TEMPORAL_ADDRESS": temporal_server.address,
            "RELAYKIT_MODEL": "scripted",
            "RELAYKIT_AGENTS": "examples.demo:travel_assistant",
            "RELAYKIT_TASK_QUEUE": f"wpy-{uuid.uuid4().hex[:8]}",
            "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "transcripts"),
        },
    )
    lines = Lines(proc.stderr)
    try:
        serving = lines.wait_for("serving:")
    finally:
        stop(proc)
    assert serving.endswith("serving: travel_assistant")


def test_worker_with_relaykit_model_scripted_uses_the_stand_in_not_an_openai_model(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    queue_name = f"w-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server,
        "examples.triage",
        task_queue=queue_name,
        tmp_path=tmp_path,
        env={"OPENAI_API_KEY": ""},
    ) as lines:
        done = relaykit(
            "run",
            "triage",
            "my invoice is wrong",
            "-q",
            queue_name,
            "--wait",
            env=cli_env(temporal_server),
        )
    assert "model: scripted stand-in model (RELAYKIT_MODEL=scripted" in "\n".join(lines.lines)
    assert done.returncode == 0, done.stderr
    assert "agent billing" in done.stderr


# --- the CLI says what is happening -------------------------------------------------------------


def test_version_prints_the_package_version() -> None:
    done = relaykit("--version")
    assert done.returncode == 0
    assert done.stdout.startswith("relaykit ")


def test_help_shows_boolean_options_as_flags() -> None:
    done = relaykit("run", "--help")
    assert done.returncode == 0
    assert "<bool>" not in done.stdout
    assert "-w, --wait " in done.stdout and "--if-exists" in done.stdout


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        (
            "from relaykit import Agent\nagent = Agent(name='a'\n",
            "error: cannot import 'broken_agents': broken_agents.py, line 2: ",
        ),
        (
            "from relaykit import Agent\n\nratio = 1 / 0\n",
            "error: cannot import 'broken_agents': broken_agents.py, line 3: ZeroDivisionError: "
            "division by zero",
        ),
        (
            "import no_such_dependency_here\n",
            "error: cannot import 'broken_agents': broken_agents.py, line 1: ModuleNotFoundError: "
            "No module named 'no_such_dependency_here'",
        ),
    ],
    ids=["syntax-error", "exception-at-import", "missing-dependency"],
)
def test_an_agent_module_that_fails_to_import_gives_its_file_and_line_only(
    tmp_path: Path, source: str, expected: str
) -> None:
    (tmp_path / "broken_agents.py").write_text(source)
    for args in (["worker", "broken_agents"], ["dev", "broken_agents", "--port", str(free_port())]):
        proc = popen("-m", "relaykit.cli", *args, cwd=tmp_path)
        _out, err = proc.communicate(timeout=60)
        assert proc.returncode == 1
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(expected), err


def test_a_prompt_that_is_not_utf8_gives_one_clear_line() -> None:
    prompt = os.fsdecode(b"caf\xe9 au lait")
    done = relaykit("run", "triage", prompt, env={"TEMPORAL_ADDRESS": f"127.0.0.1:{free_port()}"})
    assert done.returncode == 1
    assert done.stderr.strip().splitlines() == [
        "error: the prompt is not valid UTF-8 (byte 0xe9 at character 3) (hint: pass text in UTF-8)"
    ]


def test_run_wait_prints_the_run_id_and_says_when_no_worker_polls_the_queue(
    temporal_server: DevServer,
) -> None:
    queue_name = f"nobody-{uuid.uuid4().hex[:8]}"
    waiting = popen(
        "-m",
        "relaykit.cli",
        "run",
        "triage",
        "hi",
        "-q",
        queue_name,
        "--wait",
        env=cli_env(temporal_server),
    )
    lines = Lines(waiting.stderr)
    try:
        first = lines.wait_for("run ")
        run_id = first.split()[1]
        assert run_id.startswith("triage-")
        warning = lines.wait_for("no worker polls")
        assert warning == (
            f"warning: no worker polls task queue '{queue_name}': the run waits until one does; "
            f"start one with `relaykit worker MODULE --task-queue {queue_name}`"
        )
        assert waiting.poll() is None  # still waiting, as it should
        ended = relaykit("terminate", run_id, env=cli_env(temporal_server))
        assert ended.returncode == 0, ended.stderr
        assert ended.stdout.strip() == f"run {run_id} terminated"
        waiting.wait(timeout=30)
    finally:
        stop(waiting)
    assert waiting.returncode == 1
    assert "run failed" in lines.wait_for("error:")


def test_commands_on_a_closed_run_say_it_is_closed_and_fail(temporal_server: DevServer) -> None:
    env = cli_env(temporal_server)
    queue_name = f"nobody-{uuid.uuid4().hex[:8]}"
    started = relaykit("run", "triage", "hi", "-q", queue_name, env=env)
    assert started.returncode == 0, started.stderr
    run_id = started.stdout.strip()

    # Approvals and messages are updates a worker must accept: with none, say so, not hang.
    for args, doing in (
        (["approve", run_id, "call_1"], "answer approvals"),
        (["send", run_id, "more"], "take messages"),
    ):
        done = relaykit(*args, env=env, timeout=20)
        assert done.returncode == 1, args
        assert done.stderr.strip().splitlines() == [
            f"error: no worker polls task queue '{queue_name}', so run '{run_id}' cannot {doing} "
            f"until one does (hint: start one with `relaykit worker MODULE --task-queue "
            f"{queue_name}`)"
        ], args
    cancel = relaykit("cancel", run_id, env=env)  # nobody serves the run: no false success
    assert cancel.returncode == 1
    assert f"cancel requested, but no worker polls task queue '{queue_name}'" in cancel.stderr
    assert f"relaykit terminate {run_id}" in cancel.stderr

    assert relaykit("terminate", run_id, env=env).returncode == 0
    for args in (
        ["cancel", run_id],
        ["terminate", run_id],
        ["resume", run_id],
        ["pause", run_id],
        ["send", run_id, "more"],
        ["approve", run_id, "call_1"],
    ):
        done = relaykit(*args, env=env)
        assert done.returncode == 1, args
        assert f"error: run '{run_id}' is closed (terminated): cannot " in done.stderr, args
        assert "Traceback" not in done.stderr
    pending = relaykit("pending", run_id, env=env)
    assert pending.returncode == 0
    assert pending.stdout == ""
    assert f"run {run_id} is closed (terminated): nothing waits for approval" in pending.stderr
    # Reading the log of a closed run needs a worker to replay it: say so at once, not after
    # the query's 30 s timeout.
    for args in (["events", run_id], ["watch", run_id, "--plain"]):
        done = relaykit(*args, env=env, timeout=20)
        assert done.returncode == 1, args
        assert done.stderr.strip().splitlines() == [
            f"error: run '{run_id}' is closed (terminated) and no worker polls task queue "
            f"'{queue_name}': a run's event log is read by a worker replaying it (hint: start one "
            f"with `relaykit worker MODULE --task-queue {queue_name}`; `relaykit result {run_id}` "
            "shows how it ended without one)"
        ], args


def test_unknown_run_hint_points_to_relaykit_runs(temporal_server: DevServer) -> None:
    done = relaykit("cancel", "no-such-run", env=cli_env(temporal_server))
    assert done.returncode == 1
    assert "`relaykit runs` lists the runs that exist" in done.stderr


def test_cancel_of_a_served_run_reports_that_it_ended(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"w-{uuid.uuid4().hex[:8]}"
    (tmp_path / "slow_agents.py").write_text(SLOW_AGENTS)
    release = tmp_path / "release"
    with worker_process(
        temporal_server,
        "slow_agents",
        task_queue=queue_name,
        tmp_path=tmp_path,
        env={"SLOW_DIR": str(tmp_path)},
        cwd=tmp_path,
    ):
        started = relaykit("run", "slowpoke", "go", "-q", queue_name, env=env)
        run_id = started.stdout.strip()
        wait_for_file(tmp_path / "holding")
        cancel = relaykit("cancel", run_id, env=env)
        release.write_text("")
    assert cancel.returncode == 0, cancel.stderr
    assert cancel.stdout.strip() == f"run {run_id} cancelled"


def test_runs_prints_whole_ids_and_live_tokens_of_a_running_run(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # While its tool runs, the run's RelayTokens search attribute still holds the value of its
    # start; `runs` shows the tokens the run has used so far.
    env = cli_env(temporal_server)
    queue_name = f"w-{uuid.uuid4().hex[:8]}"
    run_id = "slowpoke-" + "a-long-id-that-a-narrow-table-would-cut-" + uuid.uuid4().hex
    (tmp_path / "slow_agents.py").write_text(SLOW_AGENTS)
    with worker_process(
        temporal_server,
        "slow_agents",
        task_queue=queue_name,
        tmp_path=tmp_path,
        env={"SLOW_DIR": str(tmp_path)},
        cwd=tmp_path,
    ):
        started = relaykit("run", "slowpoke", "go", "-q", queue_name, "--id", run_id, env=env)
        assert started.returncode == 0, started.stderr
        wait_for_file(tmp_path / "holding")
        listed = relaykit("runs", "--agent", "slowpoke", "--json", env=env)
        table = relaykit("runs", "--agent", "slowpoke", env={**env, "COLUMNS": "60"})
        (tmp_path / "release").write_text("")
        finished = relaykit("result", run_id, env=env)
    assert listed.returncode == 0, listed.stderr
    [row] = [r for r in json.loads(listed.stdout) if r["run_id"] == run_id]
    assert row["status"] == "running"
    assert row["tokens"] == 15  # one scripted model call: 10 in, 5 out
    assert table.returncode == 0, table.stderr
    assert run_id in table.stdout
    assert finished.stdout.strip() == "done"


def test_run_with_an_existing_closed_id_attaches_by_default_fails_or_restarts(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"w-{uuid.uuid4().hex[:8]}"
    run_id = f"ticket-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.triage", task_queue=queue_name, tmp_path=tmp_path
    ):
        first = relaykit(
            "run",
            "triage",
            "I was charged twice",
            "--id",
            run_id,
            "-q",
            queue_name,
            "--wait",
            env=env,
        )
        again = relaykit(
            "run", "triage", "My login fails", "--id", run_id, "-q", queue_name, env=env
        )
        refused = relaykit(
            "run",
            "triage",
            "My login fails",
            "--id",
            run_id,
            "-q",
            queue_name,
            "--if-exists",
            "fail",
            env=env,
        )
        restarted = relaykit(
            "run",
            "triage",
            "My login fails",
            "--id",
            run_id,
            "-q",
            queue_name,
            "--if-exists",
            "restart",
            "--wait",
            env=env,
        )
    assert first.returncode == 0, first.stderr
    assert "You were charged twice" in first.stdout
    # attach: the closed run's result, no second run
    assert again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert f"run {run_id} already exists and is closed (completed); its result:" in again.stderr
    assert refused.returncode == 1
    assert f"error: a run with id '{run_id}' already exists (completed)" in refused.stderr
    assert restarted.returncode == 0, restarted.stderr
    assert "Sign-in is" in restarted.stdout and "agent support" in restarted.stderr


async def test_run_with_the_id_of_a_running_run_attaches_fails_or_restarts_it(
    temporal_server: DevServer, client: Any
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"nobody-{uuid.uuid4().hex[:8]}"
    run_id = f"ticket-{uuid.uuid4().hex[:8]}"
    first = relaykit("run", "triage", "hi", "--id", run_id, "-q", queue_name, env=env)
    handle = client.get_workflow_handle(run_id)
    first_run = (await handle.describe()).run_id
    attached = relaykit("run", "triage", "hi again", "--id", run_id, "-q", queue_name, env=env)
    refused = relaykit(
        "run",
        "triage",
        "hi again",
        "--id",
        run_id,
        "-q",
        queue_name,
        "--if-exists",
        "fail",
        env=env,
    )
    assert (await handle.describe()).run_id == first_run
    restarted = relaykit(
        "run",
        "triage",
        "hi again",
        "--id",
        run_id,
        "-q",
        queue_name,
        "--if-exists",
        "restart",
        env=env,
    )
    now = await handle.describe()
    old = await client.get_workflow_handle(run_id, run_id=first_run).describe()
    await handle.terminate()
    assert first.returncode == 0 and first.stdout.strip() == run_id
    assert attached.returncode == 0, attached.stderr
    assert attached.stdout.strip() == run_id
    assert f"run {run_id} is already running: attached to it" in attached.stderr
    assert refused.returncode == 1
    assert f"error: a run with id '{run_id}' already exists (running)" in refused.stderr
    assert restarted.returncode == 0, restarted.stderr
    assert now.run_id != first_run
    assert old.status is not None and old.status.name == "TERMINATED"


def test_dev_stopped_with_sigterm_stops_its_temporal_server(tmp_path: Path) -> None:
    port, ui_port = free_port(), free_port()
    args = (
        "-m",
        "relaykit.cli",
        "dev",
        "examples.triage",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--data-dir",
        str(tmp_path / "data"),
    )
    env = {"RELAYKIT_MODEL": "scripted", "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "t")}
    for attempt in range(2):  # the second start needs the ports the first one held
        dev = popen(*args, env=env)
        lines = Lines(dev.stderr)
        try:
            lines.wait_for("ready:", timeout=90)
            dev.send_signal(signal.SIGTERM)
            dev.wait(timeout=30)
        finally:
            stop(dev)
        assert dev.returncode == 0, "\n".join(lines.lines)
        with socket.socket() as sock:  # nothing listens on the frontend port any more
            assert sock.connect_ex(("127.0.0.1", port)) != 0, f"attempt {attempt}"


def test_model_resolution_reads_relaykit_model_keys_and_base_url_the_same_for_every_command(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import relaykit.dev
    from relaykit.dev import choose_model

    monkeypatch.setattr(relaykit.dev, "local_model_available", lambda: True)  # named: chosen

    assert choose_model({"RELAYKIT_MODEL": "scripted"}).spec is None
    local = choose_model({"RELAYKIT_MODEL": "local:smollm2"}).spec
    assert local is not None and (local.provider, local.name) == ("local", "smollm2")
    served = choose_model({"RELAYKIT_MODEL": "llama3.2", "OPENAI_BASE_URL": "http://h:1/v1"}).spec
    assert served is not None and (served.provider, served.name) == ("openai", "llama3.2")
    keyed = choose_model({"OPENAI_API_KEY": "k", "ANTHROPIC_API_KEY": ""}).spec
    assert keyed is not None and keyed.name == "gpt-4.1-mini"
    anthropic = choose_model({"ANTHROPIC_API_KEY": "k", "OPENAI_API_KEY": ""}).spec
    assert anthropic is not None and anthropic.provider == "anthropic"
    with pytest.raises(RelaykitError, match="OPENAI_BASE_URL is set but no model name is"):
        choose_model({"OPENAI_BASE_URL": "http://h:1/v1"})


async def test_a_worker_whose_agents_all_name_their_model_resolves_no_default(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # An OPENAI_BASE_URL without RELAYKIT_MODEL would be an error for agents without a model;
    # it must not stop a worker whose agents all name theirs.
    from contextlib import AsyncExitStack

    from relaykit.dev import serve_default_model

    monkeypatch.setenv("OPENAI_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.delenv("RELAYKIT_MODEL", raising=False)
    async with AsyncExitStack() as stack:
        spec, choice = await serve_default_model(stack, ["tests.crash_agents"])
    assert spec is None
    assert "every agent names its model" in choice.label


async def test_task_queue_has_worker_tells_a_served_queue_from_one_nobody_polls(
    client: Any, model_server: Any
) -> None:
    from relaykit import Agent, task_queue_has_worker
    from tests.support import scripted_model, serving

    agent = Agent(name="polled", model=scripted_model(model_server))
    assert not await task_queue_has_worker(client, f"nobody-{uuid.uuid4().hex[:8]}")
    async with serving(client, agent) as worker:
        deadline = time.monotonic() + 30
        while not await task_queue_has_worker(client, worker.task_queue):
            assert time.monotonic() < deadline, "the worker's poller never showed"
            await asyncio.sleep(0.1)
