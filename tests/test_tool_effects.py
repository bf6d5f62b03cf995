"""Tools declare their effect; a side effect is never repeated silently.

A call's outcome is unknown when an attempt started the tool and then neither returned nor raised
(its worker was SIGKILLed, or it timed out). A ``"write"`` tool is then not run again: the model
reads an unknown outcome (``on_unknown="report"``), or a person decides (``on_unknown="ask"``).
``"read"`` and ``"idempotent"`` tools run again, with the same idempotency key. Worker crashes use
real worker processes (``tests.crash_agents``, the rig of ``tests/test_crash_recovery.py``);
timeouts and keys use an in-process worker.
"""

from __future__ import annotations

import asyncio
import time
import uuid
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.common import RetryPolicy

from relaykit import Agent, ConfigurationError, MCPServer, RunHandle, ToolContext, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import activity_summaries, scheduled_activities, scripted_model, serving
from tests.test_crash_recovery import (  # noqa: F401 - the rig fixture
    START_AND_FINISH,
    CrashRig,
    eventually,
    forget_sticky_worker,
    kill,
    rig,
)


def tool_results(result: Any) -> dict[str, Any]:
    return {m.tool_call_id: m for m in result.transcript if m.role == "tool"}


def keys(rig: CrashRig, tool_name: str) -> list[str]:
    path = Path(f"{rig.tool_log}.keys")
    lines = path.read_text().splitlines() if path.exists() else []
    return [line.split()[-1] for line in lines if line.startswith(f"{tool_name} ")]


async def unknown_events(handle: RunHandle) -> list[Any]:
    return [e for e in await handle.events() if e.kind == "tool_outcome_unknown"]


async def kill_while_running(
    client: Client, rig: CrashRig, handle: RunHandle, *started: str
) -> None:
    """SIGKILL the first worker once every named tool call has started, then start another."""
    await eventually(
        lambda: all(rig.tool_calls()[name] >= 1 for name in started), f"{started} to start"
    )
    kill(rig.processes[0])
    await forget_sticky_worker(client, handle)
    rig.start_worker()


# --- definitions ----------------------------------------------------------------------------------


def test_a_tool_says_nothing_is_a_write_and_its_declared_effect_is_readable() -> None:
    # The default is the careful one: a tool that says nothing changes the world.
    @tool
    def refund(amount: int) -> str:
        """Refund."""
        return "ok"

    @tool(effect="read")
    def lookup(q: str) -> str:
        """Look up."""
        return q

    assert (refund.effect, refund.on_unknown) == ("write", "report")
    assert lookup.effect == "read"
    from relaykit.web import fetch_url

    assert fetch_url.effect == "read"


@pytest.mark.parametrize(
    "options", [{"effect": "reads"}, {"effect": None}, {"on_unknown": "retry"}]
)
def test_an_effect_or_unknown_choice_that_does_not_exist_is_refused_when_the_tool_is_defined(
    options: dict[str, Any],
) -> None:
    with pytest.raises(ConfigurationError, match=r"effect|on_unknown"):

        @tool(**options)
        def t() -> str:
            """T."""
            return ""

    with pytest.raises(ConfigurationError, match=r"effect|on_unknown"):
        MCPServer.stdio(
            "docs",
            ["server"],
            **({"effects": {"t": options["effect"]}} if "effect" in options else options),
        )


# --- worker crashes (real worker processes, SIGKILL) ---------------------------------------------


async def test_write_tool_in_flight_at_a_worker_kill_runs_once_and_the_model_reads_an_unknown_outcome(  # noqa: E501
    client: Client, rig: CrashRig
) -> None:
    # The charge had started when its worker died: the next attempt does not charge again; the
    # model reads that the outcome is unknown and when the attempt was lost.
    server = rig.model_server
    server.script(rig.model, [call("slow_charge", id="c_charge", n=5), text("done")])
    rig.start_worker()
    handle = await start_run(client, "crash_agent", "go", task_queue=rig.task_queue)
    await kill_while_running(client, rig, handle, "slow_charge 5")
    rig.release_file.touch()  # an attempt that ran now would finish at once
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert rig.tool_calls() == {"slow_charge 5": 1}
    message = tool_results(result)["c_charge"]
    assert message.is_error
    assert "unknown outcome" in message.content
    assert "attempt 1 started at" in message.content
    assert "may or may not have taken effect" in message.content
    (sent,) = server.requests(rig.model)[1].tool_results
    assert "unknown outcome" in sent
    (event,) = await unknown_events(handle)
    assert event.data["call_id"] == "c_charge" and event.data["attempt"] == 1
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "slow_charge",
        "relaykit.model_call",
    ]


async def test_write_tool_asking_on_unknown_waits_for_a_person_and_runs_again_once_approved(
    client: Client, rig: CrashRig
) -> None:
    # on_unknown="ask": relaykit pending lists the call with the reason; the approval runs it
    # again (a new activity), with the same idempotency key.
    server = rig.model_server
    server.script(rig.model, [call("slow_charge_asked", id="c_ask", n=7), text("done")])
    rig.start_worker()
    handle = await start_run(client, "crash_agent", "go", task_queue=rig.task_queue)
    await kill_while_running(client, rig, handle, "slow_charge_asked 7")

    async def asked() -> bool:
        return bool(await handle.pending_approvals())

    await eventually(asked, "the question to a person", timeout=START_AND_FINISH)
    (pending,) = await handle.pending_approvals()
    assert (pending.call_id, pending.tool) == ("c_ask.rerun", "slow_charge_asked")
    assert pending.reason is not None and "outcome unknown" in pending.reason
    assert rig.tool_calls() == {"slow_charge_asked 7": 1}  # not run again before the answer
    rig.release_file.touch()
    await handle.approve("c_ask.rerun")
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert tool_results(result)["c_ask"].content == "charged 7"
    assert rig.tool_calls() == {"slow_charge_asked 7": 2}
    first, second = keys(rig, "slow_charge_asked")
    assert first == second and first.startswith("rk-")
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "slow_charge_asked",
        "slow_charge_asked",
        "relaykit.model_call",
    ]
    summaries = [s for s in await activity_summaries(handle.workflow, client) if "charge" in s]
    assert summaries == [
        "slow_charge_asked(n=7)",
        "slow_charge_asked(n=7) · run again: approved after an unknown outcome",
    ]


async def test_read_and_idempotent_tools_in_flight_at_a_kill_run_again_with_the_same_key(
    client: Client, rig: CrashRig
) -> None:
    # Both run again on the new worker and the model reads their real results; each call's
    # idempotency key is the same in both attempts, and differs between the two calls.
    server = rig.model_server
    server.script(
        rig.model,
        [
            batch(call("slow_step", id="c_read", n=1), call("slow_put", id="c_put", n=2)),
            text("done"),
        ],
    )
    rig.start_worker()
    handle = await start_run(client, "crash_agent", "go", task_queue=rig.task_queue)
    await kill_while_running(client, rig, handle, "slow_step 1", "slow_put 2")
    rig.release_file.touch()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    results = tool_results(result)
    assert (results["c_read"].content, results["c_put"].content) == ("slow 1 done", "put 2 done")
    assert rig.tool_calls() == {"slow_step 1": 2, "slow_put 2": 2}
    read_keys, put_keys = keys(rig, "slow_step"), keys(rig, "slow_put")
    assert len(set(read_keys)) == 1 and len(set(put_keys)) == 1 and read_keys[0] != put_keys[0]
    assert await unknown_events(handle) == []


async def test_write_tool_raising_a_retryable_error_is_retried_and_no_unknown_outcome_is_reported(
    client: Client, rig: CrashRig
) -> None:
    # A tool that raises is a known failure: its retry policy applies, whatever its effect.
    server = rig.model_server
    server.script(rig.model, [call("flaky_write", id="c_flaky", n=3), text("done")])
    rig.start_worker()
    handle = await start_run(client, "crash_agent", "go", task_queue=rig.task_queue)
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert tool_results(result)["c_flaky"].content == "wrote 3 on attempt 2"
    assert rig.tool_calls() == {"flaky_write 3": 2}
    assert await unknown_events(handle) == []


# --- in-process worker: no false unknowns, timeouts, keys -----------------------------------------

RUNS: dict[str, int] = {}
SEEN_KEYS: dict[str, list[str]] = {}


@tool
def pay(key: str, ctx: ToolContext) -> str:
    """Pay (a write).

    Args:
        key: Counter key.
    """
    RUNS[key] = RUNS.get(key, 0) + 1
    SEEN_KEYS.setdefault(key, []).append(ctx.idempotency_key)
    return f"paid {key}"


@tool(timeout=1, retry=RetryPolicy(maximum_attempts=1))
def pay_slowly(key: str) -> str:
    """A write whose only attempt outlives its start-to-close timeout.

    Args:
        key: Counter key.
    """
    RUNS[key] = RUNS.get(key, 0) + 1
    time.sleep(2)
    return "paid late"


@tool(
    timeout=1,
    retry=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=100)),
    on_unknown="ask",
)
def pay_slowly_asked(key: str) -> str:
    """A write that times out on its first attempt; a person decides on the rest.

    Args:
        key: Counter key.
    """
    RUNS[key] = RUNS.get(key, 0) + 1
    time.sleep(2)
    return "paid late"


def _agent(model_server: ScriptedModelServer, *tools: Any) -> tuple[Agent, str]:
    spec = scripted_model(model_server)
    name = f"effects_{uuid.uuid4().hex[:6]}"
    return Agent(name=name, instructions="Use the tools.", model=spec, tools=list(tools)), spec.name


async def test_an_uninterrupted_write_runs_once_with_no_false_unknown_outcome(
    client: Client, model_server: ScriptedModelServer
) -> None:
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay)
    model_server.script(model, [call("pay", id="c_pay", key=key), text("done")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        events = await unknown_events(handle)
    assert tool_results(result)["c_pay"].content == f"paid {key}"
    assert RUNS[key] == 1 and events == []


async def test_a_write_whose_last_attempt_times_out_is_an_unknown_outcome_not_a_failure(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The workflow sees a start-to-close timeout of an attempt that had started the tool.
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay_slowly)
    model_server.script(model, [call("pay_slowly", id="c_slow", key=key), text("done")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        (event,) = await unknown_events(handle)
    message = tool_results(result)["c_slow"]
    assert message.is_error and "unknown outcome" in message.content
    assert "failed and was not retried" not in message.content
    assert RUNS[key] == 1 and event.data["attempt"] == 1


async def test_a_rejected_rerun_after_a_timeout_is_an_error_result_and_never_runs_again(
    client: Client, model_server: ScriptedModelServer, temporal_server: Any
) -> None:
    # The first attempt times out (retries remain): the second does not run the tool; a person
    # is asked (`relaykit pending` says why) and rejects; the model reads the person's reason.
    from tests.test_cli import relaykit

    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay_slowly_asked)
    model_server.script(model, [call("pay_slowly_asked", id="c_q", key=key), text("done")])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)

        async def asked() -> bool:
            return bool(await handle.pending_approvals())

        await eventually(asked, "the question to a person")
        (pending,) = await handle.pending_approvals()
        assert pending.call_id == "c_q.rerun" and "outcome unknown" in (pending.reason or "")
        listed = await asyncio.to_thread(
            relaykit, "pending", handle.id, env={"TEMPORAL_ADDRESS": temporal_server.address}
        )
        (line,) = listed.stdout.splitlines()
        assert line.startswith("c_q.rerun\t") and "pay_slowly_asked(" in line
        assert "outcome unknown: The call to tool 'pay_slowly_asked' has an unknown outcome" in line
        await handle.approve("c_q.rerun", approved=False, reason="the bank says it went through")
        result = await asyncio.wait_for(handle.result(), timeout=60)
    message = tool_results(result)["c_q"]
    assert message.is_error and "unknown outcome" in message.content
    assert "the bank says it went through" in message.content
    assert RUNS[key] == 1


async def test_idempotency_keys_differ_between_calls_turns_reusing_a_call_id_and_runs(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The provider reuses the call id in a later turn; the first run continues as new after
    # every turn; a second run repeats the script.
    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay)
    script = [call("pay", id="c_same", key=key), call("pay", id="c_same", key=key), text("done")]
    model_server.script(model, [*script, *script])
    async with serving(client, agent) as worker:
        for every in (1, None):
            handle = await start_run(
                client, agent, "go", task_queue=worker.task_queue, continue_as_new_after_turns=every
            )
            await asyncio.wait_for(handle.result(), timeout=60)
    assert len(SEEN_KEYS[key]) == 4 and len(set(SEEN_KEYS[key])) == 4


# --- MCP tools (a real worker process with a stdio server, SIGKILL) -------------------------------


async def test_mcp_call_annotated_read_only_runs_again_and_an_unannotated_one_is_an_unknown_outcome(
    client: Client, temporal_server: Any, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # Both calls are in flight when the worker dies. The read-only one runs again on the new
    # worker; the other (a write: no hints) does not, and the killed worker's server dies with
    # it, so it never finishes the call afterwards either.
    from tests.test_mcp import (
        RESULT_TIMEOUT,
        ServerLog,
        WorkerProcesses,
        process_alive,
    )

    log = ServerLog(tmp_path / "stdio.log")
    release = tmp_path / "release"
    workers = WorkerProcesses(
        temporal_server,
        model_server,
        tmp_path,
        extra_env={"MCP_TEST_LOG": str(log.path), "MCP_TEST_RELEASE": str(release)},
    )
    model_server.script(
        workers.model,
        [
            batch(
                call("docs_slow", id="c_read", seconds=0.5),
                call("docs_slow_write", id="c_write", seconds=0.5),
            ),
            text("done"),
        ],
    )
    try:
        first = workers.start()
        handle = await start_run(client, "mcp_crash_agent", "go", task_queue=workers.task_queue)
        await eventually(
            lambda: {"slow", "slow_write"} <= {t for _, t, _, _ in log.lines()},
            "both calls to reach the server",
            timeout=RESULT_TIMEOUT,
        )
        (old_server,) = {pid for pid, t, _, _ in log.lines() if t == "slow_write"}
        kill(first)
        await forget_sticky_worker(client, handle)
        await eventually(lambda: not process_alive(old_server), "the server to die with its worker")
        release.touch()  # from now on any call of either tool finishes at once
        workers.start()
        result = await asyncio.wait_for(handle.result(), RESULT_TIMEOUT)
        events = await unknown_events(handle)  # a query: needs a worker
    finally:
        workers.close()
    results = tool_results(result)
    assert results["c_read"].content == "waited 0.5"
    assert results["c_write"].is_error and "unknown outcome" in results["c_write"].content
    assert log.started()["slow_write 0.5"] == 1 and log.done()["slow_write 0.5"] == 0
    assert log.started()["slow 0.5"] == 2 and log.done()["slow 0.5"] == 1
    (event,) = events
    assert event.data["call_id"] == "c_write"


def test_watch_shows_an_unknown_outcome_and_why_a_person_is_asked() -> None:
    from relaykit.streaming import StreamEvent
    from relaykit.watch import describe

    lost = StreamEvent(
        kind="tool_outcome_unknown",
        seq=3,
        agent="a",
        turn=1,
        workflow_id="w",
        data={
            "call_id": "c1",
            "name": "refund",
            "attempt": 1,
            "started_at": "12:00:01Z",
            "on_unknown": "ask",
        },
    )
    asked = StreamEvent(
        kind="approval_requested",
        seq=4,
        agent="a",
        turn=1,
        workflow_id="w",
        data={
            "call_id": "c1.rerun",
            "tool": "refund",
            "arguments": "{}",
            "reason": "outcome unknown: attempt 1 was lost",
        },
    )
    assert describe(lost) == (
        "? refund: outcome unknown (attempt 1 lost, started 12:00:01Z); a person decides [call c1]"
    )
    assert describe(asked).endswith("[call c1.rerun] (outcome unknown: attempt 1 was lost)")


@tool(
    timeout=1, retry=RetryPolicy(maximum_attempts=2, initial_interval=timedelta(milliseconds=100))
)
def pay_slowly_twice(key: str) -> str:
    """A write whose attempts outlive their start-to-close timeout.

    Args:
        key: Counter key.
    """
    RUNS[key] = RUNS.get(key, 0) + 1
    time.sleep(2)
    return "paid late"


async def test_a_run_continued_from_one_started_before_effects_runs_a_lost_write_again_as_it_did(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A state whose RunSetup predates effects (as a run started before carries it across a
    # continue-as-new): the timed-out attempt is retried in full, as before, and nothing is
    # reported as unknown.
    from relaykit import get_run
    from relaykit.messages import Message
    from relaykit.runs import RunInput, RunSetup, RunState
    from relaykit.workflows.loop import AGENT_RUN_WORKFLOW

    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay_slowly_twice)
    model_server.script(model, [call("pay_slowly_twice", id="c_old", key=key), text("done")])
    state = RunState(agent=agent.name, transcript=[Message.user("go")], setup=RunSetup())
    run_id = f"old-effects-{uuid.uuid4().hex[:8]}"
    async with serving(client, agent) as worker:
        await client.start_workflow(
            AGENT_RUN_WORKFLOW,
            RunInput(agent=agent.name, input="go", state=state),
            id=run_id,
            task_queue=worker.task_queue,
        )
        handle = get_run(client, run_id)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        events = await unknown_events(handle)
    message = tool_results(result)["c_old"]
    assert message.is_error and "failed and was not retried further" in message.content
    assert RUNS[key] == 2 and events == []


async def test_a_fork_that_repeats_a_call_at_the_same_turn_and_position_gets_a_new_idempotency_key(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The fork from turn 1 asks for the very call the origin made at turn 2 (same id, turn and
    # position): it is another call, so an API given the key applies it again.
    from relaykit import fork_run

    key = uuid.uuid4().hex
    agent, model = _agent(model_server, pay)
    model_server.script(
        model,
        [
            call("pay", id="c1", key=key),
            call("pay", id="c2", key=key),
            text("done"),
            call("pay", id="c2", key=key),
            text("done again"),
        ],
    )
    async with serving(client, agent) as worker:
        origin = await start_run(client, agent, "go", task_queue=worker.task_queue)
        await asyncio.wait_for(origin.result(), timeout=60)
        fork = await fork_run(client, origin.id, 1)
        assert (await asyncio.wait_for(fork.result(), timeout=60)).output == "done again"
    assert len(SEEN_KEYS[key]) == 3 and len(set(SEEN_KEYS[key])) == 3
