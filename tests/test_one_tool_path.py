"""What the one tool path does for every kind of tool, seen from runs: a raising approval rule
is the call's error result (never a failed workflow task), a result longer than its cap reaches
the model cut with the marker (an agent tool's child answer too), and an ``on_handoff`` callback
lost in flight is an effect with an unknown outcome, never started again.

Against the real dev server and the scripted model; the lost callback with a real worker process
SIGKILLed while it runs (the rig of ``tests/test_crash_recovery.py``).
"""

from __future__ import annotations

import asyncio
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, ConfigurationError, Handoff, RunHandle, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from relaykit.tools import TRUNCATION_MARKER
from tests.support import history_events, scripted_model, serving
from tests.test_crash_recovery import (  # noqa: F401 - the rig fixture
    START_AND_FINISH,
    CrashRig,
    eventually,
    forget_sticky_worker,
    kill,
    rig,
)
from tests.test_mcp import ServerLog, stdio_server

RESULT_TIMEOUT = 90


def tool_results(result: Any) -> dict[str, Any]:
    return {m.tool_call_id: m for m in result.transcript if m.role == "tool"}


async def failed_workflow_tasks(handle: RunHandle) -> list[Any]:
    return [
        e
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


# --- approval rules that raise --------------------------------------------------------------------


def _broken_rule(*_: Any) -> bool:
    raise RuntimeError("rule service down")


@tool(needs_approval=_broken_rule)
def refund(amount: int) -> str:
    """Refund an amount.

    Args:
        amount: Euros.
    """
    return f"refunded {amount}"


async def test_an_approval_rule_that_raises_gives_an_mcp_and_a_function_tool_an_error_result_and_the_run_completes(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The same broken rule on an MCP server and on a function tool: each call's result names the
    # tool and the exception, neither runs, and no workflow task fails on the way.
    log = ServerLog(tmp_path / "server.log")
    server = stdio_server(log, needs_approval=_broken_rule)
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("docs_delete_doc", id="c_mcp", name="a.md"),
                call("refund", id="c_fn", amount=5),
            ),
            text("done"),
        ],
    )
    agent = Agent(name=f"rules-{uuid.uuid4().hex[:6]}", model=model, tools=[server, refund])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "clean up", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "done"
    results = tool_results(result)
    for call_id, name in (("c_mcp", "docs_delete_doc"), ("c_fn", "refund")):
        message = results[call_id]
        assert message.is_error
        assert f"tool {name!r} needs approval" in message.content
        assert "RuntimeError: rule service down" in message.content
    sent = model_server.requests(model.name)[1].tool_results
    assert len(sent) == 2 and all("RuntimeError: rule service down" in s for s in sent)
    assert log.done()['delete_doc "a.md"'] == 0
    assert await failed_workflow_tasks(handle) == []


# --- output caps ----------------------------------------------------------------------------------


async def test_an_agent_tool_child_answering_1_2_mb_reaches_the_parent_model_cut_with_the_marker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model, parent_model = scripted_model(model_server), scripted_model(model_server)
    answer = "x" * 1_200_000
    model_server.script(child_model.name, [text(answer)])
    model_server.script(
        parent_model.name, [call("ask_writer", id="c_ask", input="write a lot"), text("done")]
    )
    writer = Agent(name="writer", model=child_model)
    boss = Agent(name=f"boss-{uuid.uuid4().hex[:6]}", model=parent_model, tools=[writer.as_tool()])
    async with serving(client, [boss, writer]) as worker:
        handle = await start_run(client, boss, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    assert result.output == "done"
    marker = TRUNCATION_MARKER.format(dropped=1_200_000 - 100_000)
    (sent,) = model_server.requests(parent_model.name)[1].tool_results
    assert sent == "x" * 100_000 + marker
    assert tool_results(result)["c_ask"].content == sent
    assert await failed_workflow_tasks(handle) == []


async def test_a_small_cap_on_an_agent_tool_cuts_its_answer_with_the_same_marker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model, parent_model = scripted_model(model_server), scripted_model(model_server)
    model_server.script(child_model.name, [text("abcdefghij" * 3)])
    model_server.script(
        parent_model.name, [call("ask_writer", id="c_ask", input="write"), text("done")]
    )
    writer = Agent(name="writer", model=child_model)
    boss = Agent(
        name=f"boss-{uuid.uuid4().hex[:6]}",
        model=parent_model,
        tools=[writer.as_tool(max_output_chars=10)],
    )
    async with serving(client, [boss, writer]) as worker:
        handle = await start_run(client, boss, "go", task_queue=worker.task_queue)
        await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
    (sent,) = model_server.requests(parent_model.name)[1].tool_results
    assert sent == "abcdefghij" + TRUNCATION_MARKER.format(dropped=20)


# --- on_handoff lost in flight (a real worker process, SIGKILL) -----------------------------------


def test_an_on_handoff_that_says_nothing_is_a_write_and_an_unknown_effect_is_refused() -> None:
    target = Agent(name="billing")
    handoff = Handoff(target, on_handoff=lambda args, data: None)
    assert (handoff.effect, handoff.on_unknown) == ("write", "report")
    assert handoff.heartbeat_timeout == timedelta(seconds=10)
    assert Handoff(target, heartbeat_timeout=2).heartbeat_timeout == timedelta(seconds=2)
    for options in ({"effect": "reads"}, {"on_unknown": "retry"}, {"heartbeat_timeout": 0}):
        with pytest.raises(ConfigurationError, match=r"effect|on_unknown|heartbeat_timeout"):
            Handoff(target, **options)


async def test_an_on_handoff_lost_with_its_worker_starts_once_the_handoff_happens_and_the_run_says_its_outcome_is_unknown(  # noqa: E501
    client: Client, rig: CrashRig
) -> None:
    server = rig.model_server
    server.script(
        rig.model,
        [call("transfer_to_crash_target", id="c_hand", reason="audit"), text("taken over")],
    )
    rig.start_worker()
    handle = await start_run(client, "crash_handoff_agent", "go", task_queue=rig.task_queue)
    await eventually(lambda: rig.tool_calls()["on_handoff audit"] >= 1, "on_handoff to start")
    kill(rig.processes[0])
    await forget_sticky_worker(client, handle)
    rig.start_worker()
    rig.release_file.touch()  # a callback started now would return at once
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "taken over"
    assert result.final_agent == "crash_target"  # the handoff happened
    assert rig.tool_calls() == {"on_handoff audit": 1}  # the callback started once
    message = tool_results(result)["c_hand"]
    assert '"assistant": "crash_target"' in message.content
    assert "unknown outcome" in message.content
    assert "may or may not have taken effect" in message.content
    (sent,) = server.requests(rig.model)[1].tool_results
    assert "unknown outcome" in sent
    (event,) = [e for e in await handle.events() if e.kind == "tool_outcome_unknown"]
    assert event.data["call_id"] == "c_hand" and event.data["attempt"] == 1
    assert await failed_workflow_tasks(handle) == []
    (key,) = {
        line.split()[-1]
        for line in Path(f"{rig.tool_log}.keys").read_text().splitlines()
        if line.startswith("on_handoff ")
    }
    assert key.startswith("rk-")


async def test_an_on_handoff_asking_on_unknown_waits_for_a_person_and_runs_again_once_approved(
    client: Client, rig: CrashRig
) -> None:
    server = rig.model_server
    server.script(rig.model, [call("transfer_asking", id="c_hand", reason="ask"), text("taken")])
    rig.start_worker()
    handle = await start_run(client, "crash_handoff_asking", "go", task_queue=rig.task_queue)
    await eventually(lambda: rig.tool_calls()["on_handoff ask"] >= 1, "on_handoff to start")
    kill(rig.processes[0])
    await forget_sticky_worker(client, handle)
    rig.start_worker()

    async def asked() -> bool:
        return bool(await handle.pending_approvals())

    await eventually(asked, "the question to a person", timeout=START_AND_FINISH)
    (pending,) = await handle.pending_approvals()
    assert (pending.call_id, pending.tool) == ("c_hand.rerun", "transfer_asking")
    assert pending.reason is not None and "outcome unknown" in pending.reason
    assert rig.tool_calls() == {"on_handoff ask": 1}  # not started again before the answer
    rig.release_file.touch()
    await handle.approve("c_hand.rerun")
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "taken" and result.final_agent == "crash_target"
    assert tool_results(result)["c_hand"].content == '{"assistant": "crash_target"}'
    assert rig.tool_calls() == {"on_handoff ask": 2}  # once more, as the person approved
    first, second = [
        line.split()[-1]
        for line in Path(f"{rig.tool_log}.keys").read_text().splitlines()
        if line.startswith("on_handoff ")
    ]
    assert first == second and first.startswith("rk-")
    assert await failed_workflow_tasks(handle) == []
