"""A ``"write"`` tool's attempt records that it started in its heartbeat details, and keeps that
record there whatever the tool heartbeats itself (a worker interceptor, the SDK's public API,
sees every ``activity.heartbeat(...)``). Where the record cannot be kept or read, the call is
never run again: its outcome is unknown, or the tool is not run at all.

The crash uses real worker processes (``tests.crash_agents``, the rig of
``tests/test_crash_recovery.py``); the records a previous attempt may leave are pinned with
``ActivityEnvironment``, which runs an activity without a worker (and so without relaykit's
interceptor).
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from relaykit import start_run, tool
from relaykit.activities.attempts import START_NOT_KEPT
from relaykit.activities.tool_activities import tool_activity
from relaykit.testing.scripted_server import call, text
from relaykit.tools import ATTEMPT_CLAIM_KEY, ToolInvocation
from tests.test_crash_recovery import (  # noqa: F401 - the rig fixture
    START_AND_FINISH,
    CrashRig,
    eventually,
    forget_sticky_worker,
    kill,
    rig,
)

# --- a write tool that heartbeats itself, its worker SIGKILLed mid-call ------------------------


async def test_write_tool_heartbeating_itself_killed_mid_call_runs_once_with_an_unknown_outcome(
    client: Client, rig: CrashRig
) -> None:
    server = rig.model_server
    server.script(rig.model, [call("stepwise_charge", id="c_pay", n=7), text("done")])
    rig.start_worker()
    handle = await start_run(client, "crash_agent", "go", task_queue=rig.task_queue)

    async def beats() -> list[Any]:
        """The running attempt's heartbeat details, once the tool has reported a step."""
        description = await handle.workflow.describe()
        for pending in description.raw_description.pending_activities:
            details = pending.heartbeat_details.payloads
            decoded = [client.data_converter.payload_converter.from_payload(p) for p in details]
            if decoded and isinstance(decoded[0], dict) and "step" in decoded[0]:
                return decoded
        return []

    await eventually(beats, "the tool's own heartbeats to arrive")
    progress, record = await beats()
    assert progress["step"] >= 1  # the tool's own details, then the record they did not erase
    assert record[ATTEMPT_CLAIM_KEY]["state"] == "started"
    kill(rig.processes[0])
    await forget_sticky_worker(client, handle)
    rig.release_file.touch()  # an attempt that ran now would finish at once
    rig.start_worker()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert rig.tool_calls() == {"stepwise_charge 7": 1}
    (message,) = [m for m in result.transcript if m.role == "tool"]
    assert message.is_error and "unknown outcome" in message.content
    assert "attempt 1 started at" in message.content


# --- what a previous attempt left (ActivityEnvironment: no worker, no interceptor) ---------------

RAN: list[int] = []


@tool
def transfer(amount: int) -> str:
    """Move money (a write).

    Args:
        amount: Euros.
    """
    RAN.append(amount)
    return f"moved {amount}"


def left_by_previous_attempt(*details: Any) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, attempt=2, heartbeat_details=list(details))
    return env


async def run_transfer(env: ActivityEnvironment) -> Any:
    invocation = ToolInvocation(call_id="c1", arguments='{"amount": 5}', effect="write")
    return await env.run(tool_activity(transfer), invocation)


@pytest.mark.parametrize(
    "details",
    [
        ({"step": 3},),  # progress whose record was erased
        ({"step": 3}, {ATTEMPT_CLAIM_KEY: "started"}),  # a record that is not one
        ({ATTEMPT_CLAIM_KEY: {"attempt": 1, "state": "sent?"}},),  # a state this code lacks
    ],
    ids=["erased", "garbled", "unknown state"],
)
async def test_a_start_record_that_cannot_be_read_back_makes_the_outcome_unknown(
    details: tuple[Any, ...],
) -> None:
    RAN.clear()
    with pytest.raises(ApplicationError) as raised:
        await run_transfer(left_by_previous_attempt(*details))
    assert raised.value.type == "ToolOutcomeUnknown" and raised.value.non_retryable
    assert "may or may not have taken effect" in raised.value.message
    assert RAN == []


async def test_a_write_tool_on_a_worker_that_cannot_keep_its_start_record_is_not_run() -> None:
    # ActivityEnvironment runs activities without relaykit's interceptor: the tool's own
    # heartbeats would erase the record, so a lost call would look like one never started.
    RAN.clear()
    with pytest.raises(ApplicationError) as raised:
        await run_transfer(ActivityEnvironment())
    assert raised.value.type == START_NOT_KEPT and raised.value.non_retryable
    assert RAN == []
