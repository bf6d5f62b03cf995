"""The Temporal Python SDK's update ordering wedge (docs/deploy.md, bench/README.md): relaykit
names it and the reset that gets a run out, with what the reset makes again.

The fault is the SDK's, so the live test drives bare Temporal with ``bench.sdk_update_order``'s
workflow (no relaykit code in the run) and checks relaykit's reading of it: the reset point it
computes gets the run out, and the update is applied once.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetWorkflowExecutionRequest
from temporalio.client import Client, WorkflowHistory
from temporalio.worker import Replayer

from bench import sdk_update_order
from relaykit.devserver import DevServer
from relaykit.stuck import (
    WAY_OUT,
    latest_task_failure,
    ordering_reset,
    ordering_reset_in,
    stuck,
    way_out,
)
from tests.support import cli, eventually

HISTORIES = Path(__file__).resolve().parent / "histories"


def _history(name: str) -> WorkflowHistory:
    return WorkflowHistory.from_json("wedged", json.loads((HISTORIES / name).read_text()))


SKIPPED = (
    "[TMPRL1100] Nondeterminism error: Activity id of scheduled event '20' does not match "
    "activity id of activity command '19'"
)


@pytest.mark.parametrize(
    ("name", "cause", "event_id", "again"),
    [
        # A set_budget update accepted after the `work` tool's activity was scheduled.
        ("sdk_ordering_update.json", "", 21, {"work": 1}),
        # A steer accepted after the turn's call decisions' markers (the fault's second face).
        (
            "sdk_ordering_marker.json",
            "",
            49,
            {"charge": 2, "lookup": 2, "relaykit.model_call": 2},
        ),
        # A steer that cancelled an activity scheduled in the task's earlier activation: its
        # id (19) is missing from history, and a replay gives it to the next activity.
        ("sdk_ordering_skipped.json", SKIPPED, 160, {"relaykit.model_call": 1}),
    ],
)
def test_a_history_wedged_by_the_sdk_ordering_names_its_reset_and_what_runs_again(
    name: str, cause: str, event_id: int, again: dict[str, int]
) -> None:
    # The histories are runs the fuzzer wedged (bench.chaos seeds 1931, 1431 and 2167).
    reset = ordering_reset_in(_history(name).events, cause)
    assert reset is not None
    assert (reset.event_id, reset.again) == (event_id, again)
    line = way_out("chaos-run", "r-1", reset)
    assert f"--workflow-id chaos-run --run-id r-1 --event-id {event_id} --reason" in line
    assert "SDK's update ordering" in line and "makes again: " in line


def test_an_activity_id_mismatch_without_a_missing_id_is_not_read_as_the_sdk_ordering() -> None:
    # The third face needs the command's id to be missing from history and the activity's task
    # to have accepted an update: another code change gets the general way out.
    events = _history("sdk_ordering_skipped.json").events
    assert ordering_reset_in(events, SKIPPED.replace("'19'", "'18'")) is None
    assert ordering_reset_in(events) is None


def test_no_other_recorded_history_reads_as_the_sdk_ordering() -> None:
    # Runs with updates, approvals, budgets, handoffs, deploys: none has a task that accepts an
    # update after another command, so relaykit never offers this reset for another wedge.
    names = [p for p in HISTORIES.rglob("*.json") if not p.name.startswith("sdk_ordering_")]
    assert len(names) > 30
    for path in names:
        events = WorkflowHistory.from_json("recorded", json.loads(path.read_text())).events
        assert ordering_reset_in(events) is None, path.name
    assert way_out("w", "r", None) == WAY_OUT


@pytest.mark.wedge_expected(
    "the SDK's update ordering wedges the run on purpose, until the reset",
    cause="NON_DETERMINISTIC_ERROR",
    match="Update machine does not handle this event",
)
async def test_the_reset_relaykit_names_gets_a_wedged_run_out_and_applies_its_update_once(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    client = await Client.connect(temporal_server.address)
    processes: list[subprocess.Popen[bytes]] = []
    try:
        handle = await sdk_update_order.misorder(
            client, temporal_server.address, str(tmp_path), processes
        )
        # The worker that took the update goes away; the next one has to replay the run.
        processes[-1].kill()
        processes.append(sdk_update_order.spawn(temporal_server.address, "workflows"))
        (tmp_path / "release-1").touch()
        run_id = (await handle.describe()).run_id
        deadline = time.monotonic() + 60
        while (failure := await latest_task_failure(client, handle.id, run_id)) is None:
            assert time.monotonic() < deadline, "the run did not wedge"
            await asyncio.sleep(0.2)
        reset = await ordering_reset(client, handle.id, run_id, failure.message)
        assert reset is not None, failure.message
        assert reset.again == {"step": 1}  # the second step, scheduled before the acceptance
        # What a person sees: once the run counts as stuck, `relaykit result` does not wait
        # and names this reset, whole, with what it makes again.
        await eventually(
            lambda: stuck(client, handle.id), "the run to count as stuck", timeout=120, every=1
        )
        code, _, err = await cli("result", handle.id, address=temporal_server.address)
        assert code == 1, err
        assert f"run {handle.id} is stuck" in err
        assert f"--run-id {run_id} --event-id {reset.event_id}" in err, err
        assert "discards and makes again: step x1" in err, err
        await client.workflow_service.reset_workflow_execution(
            ResetWorkflowExecutionRequest(
                namespace=client.namespace,
                workflow_execution=WorkflowExecution(workflow_id=handle.id, run_id=run_id),
                reason="tests: the SDK's update ordering",
                workflow_task_finish_event_id=reset.event_id,
                request_id=str(uuid.uuid4()),
            )
        )
        (tmp_path / "release-2").touch()
        latest = client.get_workflow_handle(handle.id)
        assert await asyncio.wait_for(latest.result(), 60) == 3 + 5  # three steps, one bump
        history = await latest.fetch_history()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    replayed = await Replayer(workflows=[sdk_update_order.Steps]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    assert replayed.replay_failure is None
    assert ordering_reset_in(history.events) is None
