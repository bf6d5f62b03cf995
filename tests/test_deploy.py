"""Deploys with runs open: a worker serving one version of the agents is stopped the way an
operator stops it (SIGTERM), a worker with edited definitions takes over the task queue, and
the runs it inherits go on.

The workers are real processes serving :mod:`tests.deploy_agents`; ``DEPLOY_VERSION`` picks
the definitions each one serves.
"""

from __future__ import annotations

import asyncio
import signal
import threading

from temporalio.client import Client

from relaykit import start_run
from relaykit.testing.scripted_server import call, text
from tests.test_crash_recovery import (
    START_AND_FINISH,
    CrashRig,
    eventually,
    rig,  # noqa: F401 - the fixture
    wait_requests,
)

AGENT = "deploy_lead"


def stop(proc) -> None:
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)


async def test_a_continued_run_with_subagents_survives_a_deploy_that_edits_instructions_and_a_tool_schema(  # noqa: E501
    client: Client,
    rig: CrashRig,
) -> None:
    # v1 stores the request's unchanging part (system prompt, tool and subagent schemas) and the
    # transcript's start in the store, then continues as new. v2 computes another digest for its
    # own unchanging part while it replays; the run must still reach the model with the whole
    # transcript and v2's instructions, and no tool may run twice.
    server = rig.model_server
    hold = threading.Event()
    server.script(
        rig.model,
        [
            call("lookup", q="a"),
            call("lookup", q="b"),
            call("lookup", q="c", hold=hold),  # the first turn after the continue-as-new
            text("done"),
        ],
    )
    v1 = rig.start_worker("tests.deploy_agents", DEPLOY_VERSION="1")
    handle = await start_run(
        client, AGENT, "go", task_queue=rig.task_queue, continue_as_new_after_turns=2
    )
    await wait_requests(server, rig.model, 3)
    await handle.pause()
    hold.set()

    async def paused() -> bool:
        return (await handle.state()).status == "paused"

    await eventually(paused, "the pause after the first turn of the continued run")
    await asyncio.to_thread(stop, v1)
    rig.start_worker("tests.deploy_agents", DEPLOY_VERSION="2")
    await handle.resume()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)

    assert result.output == "done"
    assert rig.tool_calls() == {"lookup v1 a": 1, "lookup v1 b": 1, "lookup v1 c": 1}
    last = server.requests(rig.model)[-1]
    assert "instructions of v2" in last.system
    (lookup,) = [t for t in last.body["tools"] if t["function"]["name"] == "lookup"]
    assert "exact" in lookup["function"]["parameters"]["properties"]
    tool_results = [m["content"] for m in last.messages if m.get("role") == "tool"]
    assert tool_results == ["v1 found a", "v1 found b", "v1 found c"]  # the whole transcript
    assert len(server.requests(rig.model)) == 4  # no model call was lost or repeated
