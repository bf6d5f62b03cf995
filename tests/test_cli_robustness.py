"""The ``relaykit`` command line under conditions a new user meets in the first hour: answers
piped into files, Ctrl-C while waiting, a worker with another codec, a closed run served by a
worker that does not know its agents, nonsense on the command line. Each has one defined outcome
a person can read, never a traceback."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import uuid
from pathlib import Path

from pydantic import BaseModel
from temporalio.client import Client

from relaykit import Agent, start_run
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, text
from tests.support import new_namespace, scripted_model, serving
from tests.test_cli import (
    ROOT,
    SLOW_AGENTS,
    Lines,
    cli_env,
    relaykit,
    stop,
    wait_for_file,
    worker_process,
)

LONG_LINE = " ".join(f"word{i} [bold]x[/bold] :smile:" for i in range(60))
"""Far beyond 80 columns, with what rich would turn into markup and emoji."""


class Report(BaseModel):
    title: str
    body: str


async def test_result_and_run_wait_print_the_answer_byte_for_byte_through_a_pipe_and_a_file(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer, tmp_path: Path
) -> None:
    # `relaykit result ID > answer.txt` must hold the run's answer, not a copy hard-wrapped at
    # 80 columns (which also breaks JSON strings).
    writer = scripted_model(model_server)
    model_server.respond(writer.name, lambda r: text(f"{LONG_LINE}\n  second line  "))
    report = {"title": "T" * 50, "body": "a long string, " * 20 + "ü€"}
    reporter = scripted_model(model_server)
    model_server.respond(reporter.name, lambda r: text(json.dumps(report)))
    agents = [
        Agent(name="long_writer", model=writer),
        Agent(name="json_reporter", model=reporter, output_type=Report),
    ]
    env = cli_env(temporal_server)
    async with serving(client, agents) as worker:
        waited = await asyncio.to_thread(
            relaykit, "run", "long_writer", "go", "--wait", "-q", worker.task_queue, env=env
        )
        assert waited.returncode == 0, waited.stderr
        assert waited.stdout == f"{LONG_LINE}\n  second line  \n"
        handle = await start_run(client, "json_reporter", "go", task_queue=worker.task_queue)
        assert (await handle.result()).output == report
    answer = tmp_path / "answer.json"
    with answer.open("w") as out:
        done = await asyncio.to_thread(
            subprocess.run,
            [sys.executable, "-m", "relaykit.cli", "result", handle.id],
            cwd=ROOT,
            env={**os.environ, **env},
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(answer.read_text(encoding="utf-8")) == report
    assert (
        answer.read_text(encoding="utf-8")
        == json.dumps(report, indent=2, ensure_ascii=False) + "\n"
    )


def test_ctrl_c_while_run_waits_says_the_run_goes_on_with_its_id(
    temporal_server: DevServer,
) -> None:
    queue_name = f"nobody-{uuid.uuid4().hex[:8]}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "run", "triage", "hi", "-q", queue_name, "--wait"],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", **cli_env(temporal_server)},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job ignores SIGINT, and children inherit that: restore Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        lines = Lines(proc.stderr)
        run_id = lines.wait_for("run ").split()[1]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        said = lines.wait_for("goes on")
    finally:
        stop(proc)
    assert said == (
        f"stopped waiting; run {run_id} goes on (`relaykit result {run_id}` waits for it again, "
        f"`relaykit cancel {run_id}` stops it)"
    )
    assert "Traceback" not in "\n".join(lines.lines)
    assert relaykit("terminate", run_id, env=cli_env(temporal_server)).returncode == 0


def test_max_turns_below_one_is_one_line_and_starts_no_run(temporal_server: DevServer) -> None:
    queue_name = f"nobody-{uuid.uuid4().hex[:8]}"
    for value in ("0", "-3"):
        done = relaykit(
            "run",
            "triage",
            "hi",
            "-q",
            queue_name,
            "--max-turns",
            value,
            env=cli_env(temporal_server),
        )
        assert (done.returncode, done.stdout) == (1, "")
        assert done.stderr.strip().splitlines() == [
            f"error: --max-turns must be at least 1, not {value} (hint: a run needs one model turn)"
        ]
    listed = relaykit("runs", "--json", env=cli_env(temporal_server))
    assert queue_name not in listed.stdout


def test_events_and_watch_of_a_closed_run_its_queue_worker_cannot_replay_are_one_line(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # `relaykit dev examples.triage`, then `relaykit dev examples.demo` on the same queue: the
    # worker now polling cannot replay the triage run to answer the query.
    env = cli_env(temporal_server)
    queue_name = f"switch-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.triage", task_queue=queue_name, tmp_path=tmp_path
    ):
        done = relaykit("run", "triage", "I was charged twice", "-q", queue_name, "--wait", env=env)
    assert done.returncode == 0, done.stderr
    run_id = done.stderr.split()[1]
    with worker_process(temporal_server, "examples.demo", task_queue=queue_name, tmp_path=tmp_path):
        outcomes = [
            relaykit(*args, env=env) for args in (["events", run_id], ["watch", run_id, "--plain"])
        ]
    for outcome in outcomes:
        assert (outcome.returncode, outcome.stdout) == (1, ""), outcome.stderr
        [line] = outcome.stderr.strip().splitlines()
        assert line.startswith(
            f"error: run '{run_id}' is closed (completed) and the worker now serving task queue "
            f"'{queue_name}' cannot replay it to read its event log"
        )
        assert f"`relaykit result {run_id}` shows how it ended" in line
        assert f"/namespaces/default/workflows/{run_id}" in line


def test_ui_links_name_the_host_the_dev_server_prints() -> None:
    from relaykit.cli import ui_url
    from relaykit.inbox.pending import ui_url as inbox_ui_url

    server = DevServer(port=7233, ui_port=8233)
    link = relaykit("ui-url", "triage-1", env={"RELAYKIT_UI_URL": ""})
    assert link.stdout.strip() == server.ui_link("triage-1") == ui_url("triage-1")
    assert inbox_ui_url("triage-1", "default") == link.stdout.strip()
    assert link.stdout.startswith("http://127.0.0.1:8233/")


async def test_runs_without_relaykits_search_attributes_names_the_command_that_registers_them(
    client: Client, temporal_server: DevServer
) -> None:
    from relaykit.search_attributes import operator_create_args

    namespace = (await new_namespace(client, "bare")).namespace
    for _ in range(50):  # a new namespace reaches the frontend and visibility a moment later
        done = relaykit(
            "runs", "--status", "running", "--namespace", namespace, env=cli_env(temporal_server)
        )
        if "invalid search attribute" in done.stderr:
            break
        await asyncio.sleep(0.5)
    assert done.returncode == 1, done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    [line] = lines
    assert "invalid search attribute: Relay" in line, done.stderr
    register = " ".join(["temporal", *operator_create_args(namespace)])
    assert register.startswith(
        f"temporal operator search-attribute create --namespace {namespace} --name RelayAgent "
        "--type Keyword --name RelayStatus --type Keyword"
    )
    assert line.endswith(f"`{register}`)"), line


def test_readme_dev_server_recipe_registers_relaykits_search_attributes() -> None:
    from relaykit.search_attributes import start_dev_args

    readme = (ROOT / "README.md").read_text().replace("\\\n  ", "")  # continued lines
    recipes = [line for line in readme.splitlines() if line.startswith("temporal server start-dev")]
    assert recipes
    for recipe in recipes:
        assert " ".join(start_dev_args()) in recipe, recipe


def test_readme_says_how_to_get_the_relaykit_command_after_the_quick_start() -> None:
    readme = (ROOT / "README.md").read_text()
    quick_start = readme.split("## Quick start", 1)[1].split("\n## ", 1)[0]
    assert "source .venv/bin/activate" in quick_start
    assert ".venv/bin/relaykit" in quick_start


def test_a_worker_piped_into_tee_stops_on_the_first_ctrl_c_while_it_holds_a_run(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # `relaykit worker … | tee log` in a terminal: Ctrl-C reaches the whole pipeline (tee dies
    # with it, so stdout is a broken pipe) while a tool call of a run is in flight. One signal
    # is enough: calls in flight get the grace period, then the worker exits by itself.
    (tmp_path / "slow_agents.py").write_text(SLOW_AGENTS)
    queue_name = f"tee-{uuid.uuid4().hex[:8]}"

    def sigint_as_in_a_terminal() -> None:  # a test runner may start children ignoring SIGINT
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    worker = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relaykit.cli",
            "worker",
            "slow_agents",
            "--task-queue",
            queue_name,
            "--graceful-shutdown",
            "2",
        ],
        cwd=tmp_path,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        process_group=0,
        preexec_fn=sigint_as_in_a_terminal,
        env={
            **os.environ,
            "NO_COLOR": "1",
            "PYTHONPATH": str(ROOT),
            "RELAYKIT_MODEL": "scripted",
            "SLOW_DIR": str(tmp_path),
            "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "transcripts"),
            **cli_env(temporal_server),
        },
    )
    assert worker.stdout is not None
    tee = subprocess.Popen(  # in the worker's process group, as a shell's pipeline puts it
        ["tee", str(tmp_path / "worker.log")],
        stdin=worker.stdout,
        stdout=subprocess.DEVNULL,
        process_group=worker.pid,
        preexec_fn=sigint_as_in_a_terminal,
    )
    worker.stdout.close()
    try:
        lines = Lines(worker.stderr)
        lines.wait_for("worker on task queue")
        started = relaykit("run", "slowpoke", "go", "-q", queue_name, env=cli_env(temporal_server))
        assert started.returncode == 0, started.stderr
        wait_for_file(tmp_path / "holding")  # the run's tool call is in flight
        os.killpg(worker.pid, signal.SIGINT)  # what Ctrl-C does: the whole foreground group
        assert worker.wait(timeout=60) == 0, "\n".join(lines.lines)
        assert tee.wait(timeout=10) != 0  # tee died of the same Ctrl-C
        lines.wait_for("worker stopped")
    finally:
        for proc in (worker, tee):
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        (tmp_path / "release").write_text("")
    said = "\n".join(lines.lines)
    assert "stopping: no new work; calls in flight get up to 2 s to finish" in said
    assert "stopping now" not in said and "Traceback" not in said
    relaykit("terminate", started.stdout.strip(), env=cli_env(temporal_server))
