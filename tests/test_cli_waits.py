"""Waits a person can read: every command that waits on a run says at once what the run waits
for (a person, a worker, a codec it lacks), a run whose workflow task fails is named with its
cause, and a deploy check that found nothing to check does not pass. Real processes, a real
server: the CLI and the workers are subprocesses."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from relaykit.devserver import DevServer
from tests.test_cli import (
    ROOT,
    SLOW_AGENTS,
    Lines,
    cli_env,
    popen,
    relaykit,
    stop,
    wait_for_file,
    worker_process,
)
from tests.test_codec import CODEC_ENV

REFUND = "Refund order A-1001, the jacket leaks"


def waiting_call(env: dict[str, str], run_id: str) -> str:
    """The call id of the run's approval, once the run asks."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        listed = relaykit("pending", run_id, env=env)
        if listed.stdout.strip():
            return listed.stdout.split()[0]
        time.sleep(0.5)
    raise AssertionError(f"run {run_id} never asked for approval: {listed.stderr}")


def cli_popen(*args: str, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", *args],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "300", **env},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        # A shell's background job ignores SIGINT, and children inherit that: restore Ctrl-C.
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )


def test_result_of_a_run_waiting_for_approval_says_which_call_and_how_to_answer_and_waits(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"ask-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.approvals", task_queue=queue_name, tmp_path=tmp_path
    ):
        started = relaykit("run", "refund_agent", REFUND, "-q", queue_name, env=env)
        run_id = started.stdout.strip()
        call_id = waiting_call(env, run_id)
        says = f"run {run_id} waits for approval: issue_refund("
        answer = f"answer with `relaykit approve {run_id} {call_id}` (or --reject)"

        once = relaykit("result", run_id, "--no-wait", env=env)
        assert (once.returncode, once.stdout) == (3, "")
        [line] = once.stderr.strip().splitlines()
        assert line.startswith(says) and f"[call {call_id}]" in line and line.endswith(answer)

        waiting = cli_popen("result", run_id, env=env)
        try:
            lines = Lines(waiting.stderr)
            assert lines.wait_for("waits for approval", timeout=30) == line
            assert waiting.poll() is None  # asked to wait, it waits
            waiting.send_signal(signal.SIGINT)
            assert waiting.wait(timeout=30) == 130
            said = lines.wait_for("goes on")
        finally:
            stop(waiting)
        assert said == (
            f"stopped waiting; run {run_id} goes on (`relaykit result {run_id}` waits for it "
            f"again, `relaykit cancel {run_id}` stops it)"
        )
        assert "Traceback" not in "\n".join(lines.lines)

        waiting = cli_popen("result", run_id, env=env)
        try:
            lines = Lines(waiting.stderr)
            lines.wait_for("waits for approval", timeout=30)
            assert relaykit("approve", run_id, call_id, env=env).returncode == 0
            out, _ = waiting.communicate(timeout=60)
        finally:
            stop(waiting)
        assert waiting.returncode == 0
        assert "refund" in out.lower()


def test_a_paused_run_says_so_and_how_to_resume_it(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"pause-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.approvals", task_queue=queue_name, tmp_path=tmp_path
    ):
        run_id = relaykit("run", "refund_agent", REFUND, "-q", queue_name, env=env).stdout.strip()
        call_id = waiting_call(env, run_id)
        assert relaykit("pause", run_id, env=env).returncode == 0  # at the next turn boundary
        assert relaykit("approve", run_id, call_id, env=env).returncode == 0
        deadline = time.monotonic() + 30
        while True:
            once = relaykit("result", run_id, "--no-wait", env=env)
            if "paused" in once.stderr or time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert once.returncode == 3
        assert once.stderr.strip() == (
            f"run {run_id} is paused: `relaykit resume {run_id}` continues it"
        )
        relaykit("terminate", run_id, env=env)


def test_run_wait_without_the_workers_codec_says_the_run_waits_and_that_it_cannot_read_it(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    queue_name = f"codec-{uuid.uuid4().hex[:8]}"
    bare = dict.fromkeys(CODEC_ENV, "")
    with worker_process(
        temporal_server,
        "examples.approvals",
        task_queue=queue_name,
        tmp_path=tmp_path,
        env=CODEC_ENV,
    ):
        waiting = cli_popen(
            "run", "refund_agent", REFUND, "-q", queue_name, "--wait", env={**env, **bare}
        )
        try:
            lines = Lines(waiting.stderr)
            run_id = lines.wait_for("run ").split()[1]
            said = lines.wait_for("cannot read which calls", timeout=30)
            assert waiting.poll() is None
        finally:
            stop(waiting)
        assert said.startswith(
            f"run {run_id} waits for approval, and this command cannot read which calls: cannot "
            "read the run's payloads: they are encoded as 'binary/encrypted'"
        ), said
        relaykit("terminate", run_id, env=env)


def test_run_wait_says_no_worker_polls_within_seconds_of_the_worker_being_killed(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    (tmp_path / "slow_agents.py").write_text(SLOW_AGENTS)
    env = cli_env(temporal_server)
    queue_name = f"killed-{uuid.uuid4().hex[:8]}"
    worker = popen(
        "-m",
        "relaykit.cli",
        "worker",
        "slow_agents",
        "--task-queue",
        queue_name,
        env={
            **env,
            "PYTHONPATH": str(ROOT),
            "RELAYKIT_MODEL": "scripted",
            "SLOW_DIR": str(tmp_path),
            "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "transcripts"),
        },
        cwd=tmp_path,
    )
    waiting = None
    try:
        Lines(worker.stderr).wait_for("worker on task queue")
        waiting = cli_popen("run", "slowpoke", "go", "-q", queue_name, "--wait", env=env)
        lines = Lines(waiting.stderr)
        run_id = lines.wait_for("run ").split()[1]
        wait_for_file(tmp_path / "holding")  # the run's tool call is in flight
        worker.kill()  # SIGKILL: the worker says nothing, the server keeps listing its pollers
        worker.wait()
        killed = time.monotonic()
        said = lines.wait_for("no worker polls", timeout=60)
        noticed = time.monotonic() - killed
        assert waiting.poll() is None
    finally:
        stop(worker)
        if waiting is not None:
            stop(waiting)
        (tmp_path / "release").write_text("")
    assert said.startswith(f"warning: no worker polls task queue '{queue_name}' (a worker polled")
    assert said.endswith(
        f"the run waits until one does; start one with `relaykit worker MODULE --task-queue "
        f"{queue_name}`"
    )
    # the tool's heartbeat timeout (10 s), then the retry nobody takes (3 s): within seconds,
    # where the pollers a killed worker leaves behind stay listed for minutes
    assert noticed < 60, noticed
    relaykit("terminate", run_id, env=env)


@contextmanager
def stuck_run(temporal_server: DevServer, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """A run waiting for approval whose queue is now served by a worker of other agents: its
    next workflow task fails on every attempt. Yields the run id and its call id."""
    env = cli_env(temporal_server)
    queue_name = f"other-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.approvals", task_queue=queue_name, tmp_path=tmp_path
    ):
        run_id = relaykit("run", "refund_agent", REFUND, "-q", queue_name, env=env).stdout.strip()
        call_id = waiting_call(env, run_id)
    with worker_process(temporal_server, "examples.demo", task_queue=queue_name, tmp_path=tmp_path):
        yield run_id, call_id
    relaykit("terminate", run_id, env=env)


@pytest.mark.wedge_expected(
    "a worker of another module takes the run's workflow task and fails it on every attempt",
    cause="WORKFLOW_WORKER_UNHANDLED_FAILURE",
    match="serves none of the agents of run",
)
def test_approve_send_and_pending_on_a_run_whose_workflow_task_fails_say_why_in_one_line(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    env = cli_env(temporal_server)
    with stuck_run(temporal_server, tmp_path) as (run_id, call_id):
        outcomes = [
            relaykit(*args, env=env)
            for args in (
                ["approve", run_id, call_id],  # the update that makes the worker fail the task
                ["send", run_id, "one more thing"],
                ["pending", run_id],
                ["steer", run_id, "about Tokyo"],
            )
        ]
        listed = relaykit("runs", "--stuck", env=env)
    cause = (
        f"RuntimeError: this worker serves none of the agents of run {run_id} (refund_agent); "
        "it serves: travel_assistant"
    )
    assert listed.stdout.strip() == f"{run_id}: {cause}"
    for outcome in outcomes:
        assert (outcome.returncode, outcome.stdout) == (1, ""), outcome.stderr
        [line] = outcome.stderr.strip().splitlines()
        assert line.startswith(f"error: run {run_id} is stuck: the worker on task queue "), line
        assert "fails it on every attempt" in line and cause in line, line
        assert "docs/deploy.md" in line
        assert "Workflow Task in failed state" not in line


def test_replay_check_that_finds_no_run_on_the_queue_says_so_and_does_not_pass(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # The workers poll another queue than the default: nothing to replay is no clean pass.
    env = cli_env(temporal_server)
    queue_name = f"elsewhere-{uuid.uuid4().hex[:8]}"
    with worker_process(
        temporal_server, "examples.approvals", task_queue=queue_name, tmp_path=tmp_path
    ):
        run_id = relaykit("run", "refund_agent", REFUND, "-q", queue_name, env=env).stdout.strip()
        waiting_call(env, run_id)
    empty = f"empty-{uuid.uuid4().hex[:8]}"
    nothing = relaykit("replay-check", "examples.approvals", "--task-queue", empty, env=env)
    found = relaykit("replay-check", "examples.approvals", "--task-queue", queue_name, env=env)
    relaykit("terminate", run_id, env=env)
    assert (nothing.returncode, nothing.stdout) == (3, ""), nothing.stderr
    [line] = nothing.stderr.strip().splitlines()
    assert line.startswith(
        f"error: replay check found no open run on task queue '{empty}' to replay"
    ), line
    assert "--task-queue" in line and f"'{queue_name}'" in line  # where the open runs are
    assert (found.returncode, found.stdout.strip()) == (0, "replayed 1, failed 0, skipped 0")
