"""Shipping agent code while runs are open, with Temporal's own tools (docs/deploy.md): Worker
Deployment Versioning pins a run to the build that started it, ``relaykit replay-check``
replays open runs against new code before it ships, and a run that new code wedged is visible
in ``relaykit runs --stuck`` and refused by ``relaykit result``.

Workers are real processes (``relaykit worker``) against the session's dev server, which serves
worker deployments as it is.
"""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import threading
import uuid

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import ConfigurationError, Worker, start_run
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import call, text
from relaykit.versioning import deployment_config
from tests.crash_agents import crash_agent
from tests.test_crash_recovery import (
    REPO_ROOT,
    START_AND_FINISH,
    CrashRig,
    eventually,
    rig,  # noqa: F401 - the fixture
    wait_requests,
)


def relaykit_cli(rig: CrashRig, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaykit.cli", *args],
        cwd=REPO_ROOT,
        env={**rig.environment(), **env},
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )


async def cli(rig: CrashRig, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    return await asyncio.to_thread(relaykit_cli, rig, *args, **env)


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


async def set_current(rig: CrashRig, deployment: str, build: str) -> None:
    # A build exists for the server once its worker has polled: retry until then.
    outcome: list[subprocess.CompletedProcess[str]] = []

    async def done() -> bool:
        outcome[:] = [await cli(rig, "deployment", "set-current", deployment, build)]
        return outcome[0].returncode == 0

    await eventually(done, f"build {build} to become current", timeout=60)
    assert f"current build is now {build}" in outcome[0].stdout


async def started_by(client: Client, run_id: str) -> set[str]:
    """Identities of the workers that started the run's activities."""
    identities = set()
    async for event in client.get_workflow_handle(run_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            identities.add(event.activity_task_started_event_attributes.identity)
    return identities


def test_a_deployment_name_with_a_dot_is_one_clear_error(client: Client) -> None:
    with pytest.raises(ConfigurationError, match=r"contains a '\.'"):
        Worker(client, [crash_agent], deployment="my.app", build_id="1")
    with pytest.raises(ConfigurationError, match="needs both"):
        deployment_config("app", None)


def test_the_worker_command_refuses_a_bad_deployment_in_one_line(rig: CrashRig) -> None:
    done = relaykit_cli(
        rig, "worker", "tests.crash_agents", "--deployment", "a.b", "--build-id", "1"
    )
    assert done.returncode == 1
    assert "contains a '.'" in done.stderr
    assert "Traceback" not in done.stderr


async def test_a_run_pinned_to_the_old_build_finishes_there_while_new_runs_start_on_the_new_one(
    client: Client,
    rig: CrashRig,
) -> None:
    deployment = f"rk-{uuid.uuid4().hex[:8]}"
    server = rig.model_server
    server.script(
        rig.model,
        [
            call("refund", id="call_pinned", amount=3),
            text("new build answered"),
            text("old build answered"),
        ],
    )
    old = rig.start_worker(RELAYKIT_DEPLOYMENT=deployment, RELAYKIT_BUILD_ID="b1")
    await set_current(rig, deployment, "b1")
    pinned = await start_run(client, "crash_agent", "refund 3", task_queue=rig.task_queue)

    async def waiting() -> bool:
        return (await pinned.state()).status == "waiting_approval"

    await eventually(waiting, "the approval request", timeout=START_AND_FINISH)
    new = rig.start_worker(RELAYKIT_DEPLOYMENT=deployment, RELAYKIT_BUILD_ID="b2")
    await set_current(rig, deployment, "b2")

    fresh = await start_run(client, "crash_agent", "hello", task_queue=rig.task_queue)
    assert (await asyncio.wait_for(fresh.result(), START_AND_FINISH)).output == "new build answered"

    status = await cli(rig, "deployment", "status", deployment, "--json")
    assert status.returncode == 0, status.stderr
    builds = {b["build_id"]: b for b in json.loads(status.stdout)["builds"]}
    assert json.loads(status.stdout)["current_build"] == "b2"
    assert builds["b1"]["open_runs"] == 1 and builds["b2"]["open_runs"] == 0
    listed = await cli(rig, "runs", "--json", "--limit", "500")
    by_id = {r["run_id"]: r for r in json.loads(listed.stdout)}
    assert by_id[pinned.id]["build_id"] == "b1"
    assert by_id[fresh.id]["build_id"] == "b2"

    await pinned.approve("call_pinned")
    assert (
        await asyncio.wait_for(pinned.result(), START_AND_FINISH)
    ).output == "old build answered"
    assert {i.split("@")[0] for i in await started_by(client, pinned.id)} == {str(old.pid)}
    assert {i.split("@")[0] for i in await started_by(client, fresh.id)} == {str(new.pid)}
    assert rig.tool_calls() == {"refund 3": 1}


@pytest.mark.wedge_expected(
    "v3 is deployed anyway: the run is wedged until the rollback",
    cause="NON_DETERMINISTIC_ERROR",
    match="Nondeterminism",
)
async def test_replay_check_flags_a_breaking_change_before_the_deploy_and_a_wedged_run_is_visible(
    client: Client,
    rig: CrashRig,
) -> None:
    # v1 serves a run that called `lookup`, paused at a turn boundary. Before the deploy,
    # replay-check passes v2 (safe edits) and flags v3 (the tool is now another kind of tool).
    # Deployed anyway, v3 wedges the run: `runs --stuck` lists it and `result` says so; rolling
    # back frees it.
    server = rig.model_server
    hold = threading.Event()
    server.script(rig.model, [call("lookup", q="x", hold=hold), text("done")])
    v1 = rig.start_worker("tests.deploy_agents", DEPLOY_VERSION="1")
    handle = await start_run(client, "deploy_lead", "go", task_queue=rig.task_queue)
    await wait_requests(server, rig.model, 1)
    await handle.pause()
    hold.set()

    async def paused() -> bool:
        return (await handle.state()).status == "paused"

    await eventually(paused, "the pause after the tool call")

    queue = ["--task-queue", rig.task_queue]
    safe = await cli(rig, "replay-check", "tests.deploy_agents", *queue, DEPLOY_VERSION="2")
    assert (safe.returncode, safe.stdout.strip()) == (0, "replayed 1, failed 0, skipped 0")
    breaking = await cli(rig, "replay-check", "tests.deploy_agents", *queue, DEPLOY_VERSION="3")
    assert breaking.returncode == 1, breaking.stderr
    failing, summary = breaking.stdout.strip().splitlines()
    assert failing.startswith(f"failed: {handle.id}")
    assert "Nondeterminism" in failing and "Failure {" not in failing
    assert summary == "replayed 1, failed 1, skipped 0"
    other = await cli(rig, "replay-check", "tests.crash_agents", *queue)
    assert other.returncode == 0 and "skipped: " in other.stdout and "skipped 1" in other.stdout

    await asyncio.to_thread(stop, v1)
    v3 = rig.start_worker("tests.deploy_agents", DEPLOY_VERSION="3")
    await handle.resume()

    listed: list[dict[str, object]] = []

    async def wedged() -> bool:
        out = await cli(rig, "runs", "--stuck", "--json")
        listed[:] = [r for r in json.loads(out.stdout) if r["run_id"] == handle.id]
        return bool(listed)

    await eventually(wedged, "the run to show as stuck", timeout=START_AND_FINISH)
    assert "Nondeterminism" in str(listed[0]["stuck"])
    assert listed[0]["way_out"] is None  # a deploy's wedge, not the SDK's update ordering
    result = await cli(rig, "result", handle.id)
    assert result.returncode == 1
    assert "is stuck" in result.stderr and "docs/deploy.md" in result.stderr
    assert "Traceback" not in result.stderr

    await asyncio.to_thread(stop, v3)  # the way out: roll back
    rig.start_worker("tests.deploy_agents", DEPLOY_VERSION="2")
    assert (await asyncio.wait_for(handle.result(), START_AND_FINISH)).output == "done"
    assert rig.tool_calls() == {"lookup v1 x": 1}


def test_replay_check_replays_the_committed_histories_and_says_when_it_cannot_run(
    temporal_server: DevServer,
    rig: CrashRig,
) -> None:
    ok = relaykit_cli(
        rig, "replay-check", "tests.histories.agents", "--histories", "tests/histories"
    )
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert ok.stdout.strip().splitlines()[-1].startswith("replayed ")
    assert "failed 0" in ok.stdout
    missing = relaykit_cli(rig, "replay-check", "tests.histories.agents", "--histories", "nowhere")
    assert missing.returncode == 2 and "could not run" in missing.stderr
    unknown = relaykit_cli(rig, "replay-check", "no_such_module_here")
    assert unknown.returncode != 0 and "Traceback" not in unknown.stderr
