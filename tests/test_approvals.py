"""Interrupt and resume: approvals, injected messages, pause/resume, cancel and the queries that
show them, against the real Temporal dev server and a scripted model over HTTP; plus the
``relaykit`` and ``temporal`` command lines and the stateless HTTP backend of
``examples/approvals.py``."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import threading
import urllib.error
import urllib.request
import uuid
from typing import Any

import pytest
from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowUpdateFailedError

from relaykit import Agent, ApprovalDecision, RunFailed, RunHandle, start_run, tool
from relaykit.authors import current_user
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import eventually, history_events, scheduled_activities, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


async def waiting_for_approval(handle: RunHandle, count: int = 1) -> None:
    async def check() -> bool:
        return len(await handle.pending_approvals()) >= count

    await eventually(check, f"{count} pending approval(s)")


async def wait_requests(server: ScriptedModelServer, model: str, n: int) -> None:
    await asyncio.to_thread(server.wait_for_requests, model, n, 10.0)


async def completed_activities(handle: RunHandle) -> int:
    return sum(
        e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
        for e in await history_events(handle.workflow)
    )


def make_refund_tool(invocations: list[str]) -> Any:
    @tool(needs_approval=True)
    def refund(order_id: str, amount: int) -> str:
        """Refund an order.

        Args:
            order_id: The order.
            amount: Euros.
        """
        invocations.append(f"{order_id}:{amount}")
        return f"refunded {amount} for {order_id}"

    return refund


# --- approvals ----------------------------------------------------------------------------------


async def test_call_needing_approval_waits_while_earlier_calls_of_the_turn_complete(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A pending approval records who asked for what; calls asked for before it do not wait.
    refunds: list[str] = []
    looked_up = threading.Event()

    @tool
    def lookup(order_id: str) -> str:
        """Look an order up."""
        looked_up.set()
        return f"{order_id}: paid 30"

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("lookup", order_id="A1"),
                call("refund", id="call_refund_1", order_id="A1", amount=30),
            ),
            text("refunded"),
        ],
    )
    agent = Agent(name="refunder", model=model, tools=[make_refund_tool(refunds), lookup])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund A1", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        (pending,) = await handle.pending_approvals()
        assert pending.call_id == "call_refund_1"
        assert pending.tool == "refund"
        assert json.loads(pending.arguments) == {"order_id": "A1", "amount": 30}
        assert pending.agent == "refunder"
        assert pending.run_path == ["refunder"]
        assert pending.turn == 1 and pending.requested_at is not None
        snapshot = await handle.state()
        assert snapshot.status == "waiting_approval"
        assert [p.call_id for p in snapshot.pending_approvals] == ["call_refund_1"]
        # The lookup ran to completion (model call + lookup) while the refund waits.
        assert await asyncio.to_thread(looked_up.wait, 10)

        async def lookup_completed() -> bool:
            return await completed_activities(handle) == 2

        await eventually(lookup_completed, "the lookup activity to complete")
        assert refunds == []
        requested = [e for e in await handle.events() if e.kind == "approval_requested"]
        assert [e.data["call_id"] for e in requested] == ["call_refund_1"]
        assert requested[0].data["tool"] == "refund"

        answered = await handle.approve("call_refund_1")
        assert answered.tool == "refund"
        result = await handle.result()
    assert result.output == "refunded"
    assert refunds == ["A1:30"]
    tool_results = [m.content for m in result.transcript if m.role == "tool"]
    assert tool_results == ["A1: paid 30", "refunded 30 for A1"]
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "lookup",
        "refund",
        "relaykit.model_call",
    ]


async def test_approval_predicate_on_arguments_and_rejection_reason_reaches_the_model(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Only the large transfer waits; its rejection (with the reason) is the tool result.
    transfers: list[int] = []

    @tool(needs_approval=lambda args: args["amount"] > 100)
    def transfer(amount: int) -> str:
        """Transfer money."""
        transfers.append(amount)
        return f"transferred {amount}"

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(call("transfer", amount=50), call("transfer", id="call_big", amount=500)),
            text("done"),
        ],
    )
    agent = Agent(name="banker", model=model, tools=[transfer])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "pay", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        assert [p.call_id for p in await handle.pending_approvals()] == ["call_big"]
        await handle.approve("call_big", approved=False, reason="over the daily limit")
        result = await handle.result()
        answered = [e for e in await handle.events() if e.kind == "approval_answered"]
    assert transfers == [50]
    second = model_server.requests(model.name)[1]
    assert second.tool_results == [
        "transferred 50",
        "Error: The call was rejected by a person: over the daily limit.",
    ]
    rejected = [m for m in result.transcript if m.role == "tool"][1]
    assert rejected.is_error and "over the daily limit" in rejected.content
    assert answered[0].data == {
        "call_id": "call_big",
        "approved": False,
        "reason": "over the daily limit",
        "timed_out": False,
        "by": current_user(),  # the API names the OS user when by= is not given
    }


async def test_approve_update_rejects_unknown_and_already_answered_call_ids(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The update's validator answers at once with a clear error; nothing reaches the history.
    refunds: list[str] = []
    release = threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("refund", id="call_r", order_id="B2", amount=5), text("done", hold=release)],
    )
    agent = Agent(name="validated", model=model, tools=[make_refund_tool(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund B2", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        with pytest.raises(WorkflowUpdateFailedError) as unknown:
            await handle.approve("call_nope")
        assert "no pending approval with call id 'call_nope' (waiting: call_r)" in str(
            unknown.value.cause
        )
        await handle.approve("call_r")
        await wait_requests(model_server, model.name, 2)  # the run went on; it is still open
        with pytest.raises(WorkflowUpdateFailedError) as again:
            await handle.approve("call_r", approved=False)
        assert "call 'call_r' was already answered" in str(again.value.cause)
        release.set()
        result = await handle.result()
    assert result.output == "done" and refunds == ["B2:5"]
    kinds = [
        e.event_type
        for e in await history_events(handle.workflow)
        if e.event_type
        in (
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
            EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_REJECTED,
        )
    ]
    assert kinds == [EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED]


async def test_approve_signal_answers_and_ignores_unknown_call_ids(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The fire-and-forget signal works like the update; a bad call id is ignored, not fatal.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name, [call("refund", id="call_sig", order_id="C3", amount=7), text("done")]
    )
    agent = Agent(name="signalled", model=model, tools=[make_refund_tool(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund C3", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        await handle.workflow.signal(
            "approve_signal", ApprovalDecision(call_id="call_unknown", approved=True)
        )
        await handle.workflow.signal(
            "approve_signal", ApprovalDecision(call_id="call_sig", approved=True)
        )
        result = await handle.result()
    assert result.output == "done" and refunds == ["C3:7"]


async def test_unanswered_approval_times_out_as_a_rejection(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each tool sets its own approval timeout; the model reads "approval timed out".
    ran: list[str] = []

    @tool(needs_approval=True, approval_timeout=0.5)
    def delete_account(user: str) -> str:
        """Delete an account."""
        ran.append(user)
        return "deleted"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("delete_account", user="ann"), text("not deleted")])
    agent = Agent(name="impatient", model=model, tools=[delete_account])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "delete ann", task_queue=worker.task_queue)
        result = await handle.result()
        snapshot = await handle.state()
    assert ran == []
    (tool_result,) = [m for m in result.transcript if m.role == "tool"]
    assert tool_result.is_error and "approval timed out" in tool_result.content
    assert "approval timed out" in model_server.requests(model.name)[1].tool_results[0]
    assert snapshot.pending_approvals == []


# --- injected messages, pause, resume -----------------------------------------------------------


async def test_injected_messages_enter_at_the_next_turn_boundary_exactly_once(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Sent mid-turn (update and signal), they reach the model after the turn's tool result,
    # once, and stay once in the transcript afterwards.
    release = threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("echo", word="a", hold=release), call("echo", word="b"), text("done")],
    )

    @tool
    def echo(word: str) -> str:
        """Echo a word."""
        return word

    agent = Agent(name="listener", model=model, tools=[echo])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "start", task_queue=worker.task_queue)
        await wait_requests(model_server, model.name, 1)
        assert await handle.send_message("note from the update") == 1
        await handle.workflow.signal("send_message_signal", "note from the signal")

        async def both_queued() -> bool:
            return (await handle.state()).mailbox == 2

        await eventually(both_queued, "two queued messages")
        release.set()
        result = await handle.result()
        events = await handle.events()
        snapshot = await handle.state()
    first, second, third = model_server.requests(model.name)
    notes = ["note from the update", "note from the signal"]

    def user_texts(request: Any) -> list[str]:
        return [m["content"] for m in request.messages if m["role"] == "user"]

    assert user_texts(first) == ["start"]
    assert user_texts(second) == ["start", *notes]
    assert [m["role"] for m in second.messages[-4:]] == ["assistant", "tool", "user", "user"]
    assert user_texts(third) == ["start", *notes]
    assert [m.content for m in result.transcript if m.role == "user"] == ["start", *notes]
    injected = [e for e in events if e.kind == "message_injected"]
    assert [(e.turn, e.data["text"]) for e in injected] == [(1, notes[0]), (1, notes[1])]
    assert snapshot.mailbox == 0


async def test_message_sent_during_the_final_model_call_is_answered_not_dropped(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A message accepted while the model writes its final answer gets a turn of its own.
    release = threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name, [text("first answer", hold=release), text("answer to the follow-up")]
    )
    agent = Agent(name="follow_up", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "question", task_queue=worker.task_queue)
        await wait_requests(model_server, model.name, 1)
        await handle.send_message("and a follow-up")
        release.set()
        result = await handle.result()
    assert result.output == "answer to the follow-up"
    assert result.turns == 2
    assert model_server.requests(model.name)[1].last_user_text == "and a follow-up"


async def test_pause_stops_at_the_next_turn_boundary_and_resume_continues_with_a_message(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # No model call starts while paused, even with a message queued; resume adds its text.
    release = threading.Event()
    model = scripted_model(model_server)
    model_server.script(model.name, [call("noop", hold=release), text("resumed answer")])

    @tool
    def noop() -> str:
        """Do nothing."""
        return "ok"

    agent = Agent(name="pausable", model=model, tools=[noop])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "work", task_queue=worker.task_queue)
        await wait_requests(model_server, model.name, 1)
        await handle.pause()
        release.set()  # the turn in flight finishes: its tool still runs

        async def paused() -> bool:
            return (await handle.state()).status == "paused"

        await eventually(paused, "status paused")
        await handle.send_message("queued while paused")
        snapshot = await handle.state()
        assert snapshot.paused and snapshot.turn == 1 and snapshot.mailbox == 1
        assert model_server.request_count(model.name) == 1
        assert await scheduled_activities(handle.workflow) == ["relaykit.model_call", "noop"]
        await handle.resume("please be brief")
        result = await handle.result()
    assert result.output == "resumed answer"
    assert model_server.request_count(model.name) == 2
    second = model_server.requests(model.name)[1]
    user_texts = [m["content"] for m in second.messages if m["role"] == "user"]
    assert user_texts == ["work", "queued while paused", "please be brief"]


async def test_cancel_cancels_the_tool_in_flight_and_ends_the_run_cancelled(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The heartbeating tool learns of the cancellation; the run ends as RunCancelled.
    started = threading.Event()
    cancelled = threading.Event()

    @tool(heartbeat_timeout=1)
    async def long_job() -> str:
        """Work for a long time."""
        started.set()
        try:
            for _ in range(600):
                activity.heartbeat()
                await asyncio.sleep(0.05)
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "finished"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("long_job"), text("never")])
    agent = Agent(name="cancellable", model=model, tools=[long_job])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        assert await asyncio.to_thread(started.wait, 10)
        await handle.cancel()
        with pytest.raises(RunFailed) as failure:
            await asyncio.wait_for(handle.result(), timeout=10)
        assert await asyncio.to_thread(cancelled.wait, 10)
    assert failure.value.type == "RunCancelled"
    assert model_server.request_count(model.name) == 1
    description = await handle.workflow.describe()
    assert description.status is not None and description.status.name == "CANCELED"


async def test_cancel_during_a_model_call_ends_the_run_cancelled_not_failed(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The cancelled model activity must not turn into a ModelCallFailed failure.
    hold = threading.Event()
    model = scripted_model(model_server)
    model_server.script(model.name, [text("never", hold=hold)])
    agent = Agent(name="cancel_model", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        await wait_requests(model_server, model.name, 1)
        await handle.cancel()
        with pytest.raises(RunFailed) as failure:
            await asyncio.wait_for(handle.result(), timeout=10)
        hold.set()
    assert failure.value.type == "RunCancelled"


async def test_queries_report_status_agent_approvals_usage_and_turns(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # running -> waiting_approval -> completed, readable at every step without side effects.
    refunds: list[str] = []
    release = threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("refund", id="call_q", order_id="D4", amount=9),
            text("all done", hold=release),
        ],
    )
    agent = Agent(name="observed", model=model, tools=[make_refund_tool(refunds)])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund D4", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        waiting = await handle.state()
        assert (waiting.status, waiting.agent, waiting.turn) == ("waiting_approval", "observed", 1)
        assert waiting.usage.requests == 1 and waiting.usage.total_tokens == 15
        assert await handle.workflow.query("current_agent") == "observed"
        await handle.approve("call_q")
        await wait_requests(model_server, model.name, 2)
        running = await handle.state()
        assert (running.status, running.turn, running.pending_approvals) == ("running", 2, [])
        release.set()
        await handle.result()
        done = await handle.state()  # a closed run's query replays its history on the worker
    assert (done.status, done.turn, done.usage.requests, done.agent) == (
        "completed",
        2,
        2,
        "observed",
    )


# --- command lines ------------------------------------------------------------------------------


async def run_command(*argv: str, address: str) -> tuple[int, str, str]:
    """Run a command line in a subprocess without blocking the event loop (the test's worker
    runs on it)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE="default", NO_COLOR="1")
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def relaykit_cli(*args: str) -> tuple[str, ...]:
    return (sys.executable, "-m", "relaykit.cli", *args)


def temporal_cli(*args: str) -> tuple[str, ...]:
    from relaykit.devserver import find_temporal_cli

    return (find_temporal_cli(), *args)


async def test_relaykit_pending_and_approve_commands(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # `relaykit pending` lists the call; a bad call id is one clear line and exit status 1.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name, [call("refund", id="call_cli", order_id="E5", amount=12), text("ok")]
    )
    agent = Agent(name="cli_approved", model=model, tools=[make_refund_tool(refunds)])
    address = temporal_server.address
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund E5", task_queue=worker.task_queue)
        await waiting_for_approval(handle)
        code, out, err = await run_command(*relaykit_cli("pending", handle.id), address=address)
        assert code == 0, err
        assert out.splitlines() == [
            'call_cli\tcli_approved\trefund({"order_id": "E5", "amount": 12})'
        ]
        code, out, err = await run_command(
            *relaykit_cli("approve", handle.id, "call_bogus"), address=address
        )
        assert code == 1 and out == ""
        assert err.strip().splitlines() == [
            "error: no pending approval with call id 'call_bogus' (waiting: call_cli)"
        ]
        code, out, err = await run_command(
            *relaykit_cli("approve", handle.id, "call_cli", "--reject", "--reason", "not today"),
            address=address,
        )
        assert code == 0, err
        assert out.strip() == "rejected refund (call_cli)"
        result = await handle.result()
        code, out, err = await run_command(*relaykit_cli("pending", "no-such-run"), address=address)
    assert code == 1 and err.strip().startswith("error: no run with id 'no-such-run'")
    assert len(err.strip().splitlines()) == 1
    assert refunds == []
    assert "not today" in next(m for m in result.transcript if m.role == "tool").content


async def test_temporal_cli_approves_by_update_and_by_signal(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # Plain `temporal workflow update execute` / `signal` with JSON input, as docs/approvals.md
    # shows; a bad call id makes the update command fail.
    refunds: list[str] = []
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("refund", id="call_upd", order_id="F6", amount=1),
                call("refund", id="call_sig", order_id="F7", amount=2),
            ),
            text("both done"),
        ],
    )
    agent = Agent(
        name="temporal_cli_approved",
        model=model,
        tools=[make_refund_tool(refunds)],
        approval_order="parallel",  # both approvals wait at once
    )
    address = temporal_server.address
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund both", task_queue=worker.task_queue)
        await waiting_for_approval(handle, 2)
        code, _, err = await run_command(
            *temporal_cli(
                "workflow",
                "update",
                "execute",
                "--address",
                address,
                "--workflow-id",
                handle.id,
                "--name",
                "approve",
                "--input",
                '{"call_id": "call_nope", "approved": true}',
            ),
            address=address,
        )
        assert code != 0 and "no pending approval with call id 'call_nope'" in err
        code, out, err = await run_command(
            *temporal_cli(
                "workflow",
                "update",
                "execute",
                "--address",
                address,
                "--workflow-id",
                handle.id,
                "--name",
                "approve",
                "--input",
                '{"call_id": "call_upd", "approved": true}',
                "--output",
                "json",
            ),
            address=address,
        )
        assert code == 0, err
        answered = json.loads(out)["result"]  # the PendingApproval the call answered
        assert (answered["call_id"], answered["tool"]) == ("call_upd", "refund")
        code, out, err = await run_command(
            *temporal_cli(
                "workflow",
                "signal",
                "--address",
                address,
                "--workflow-id",
                handle.id,
                "--name",
                "approve_signal",
                "--input",
                '{"call_id": "call_sig", "approved": false, "reason": "duplicate"}',
            ),
            address=address,
        )
        assert code == 0, err
        result = await handle.result()
    assert result.output == "both done"
    assert refunds == ["F6:1"]
    contents = [m.content for m in result.transcript if m.role == "tool"]
    assert contents[0] == "refunded 1 for F6" and "duplicate" in contents[1]


# --- the stateless HTTP backend of examples/approvals.py ----------------------------------------


def http(base: str, method: str, path: str, body: dict[str, Any] | None = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{base}{path}", data=data, method=method)
    request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


async def test_http_backend_starts_continues_and_answers_approvals_without_keeping_handles(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Every request finds the run by the conversation's workflow id; a follow-up after the
    # answer starts a new run that continues the transcript.
    from examples import approvals

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("look_up_order", order_id="A-1001"),
            call("issue_refund", id="call_refund", order_id="A-1001", amount_eur=89, reason="wet"),
            text("Your refund of 89 EUR is on its way."),
            text("You're welcome."),
        ],
    )
    conversation = f"c{uuid.uuid4().hex[:8]}"
    async with serving(client, approvals.refund_agent, default_model=model) as worker:
        backend = approvals.ChatBackend(client, task_queue=worker.task_queue, settle_seconds=10)
        server = approvals.make_http_server(backend, asyncio.get_running_loop())
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        base = f"http://127.0.0.1:{server.server_address[1]}"
        try:
            status, body = await asyncio.to_thread(
                http,
                base,
                "POST",
                f"/conversations/{conversation}/messages",
                {"text": "Refund order A-1001, the jacket leaks."},
            )
            assert status == 200, body
            assert body["status"] == "waiting_approval"
            assert body["run_id"] == f"chat-{conversation}"
            assert [p["call_id"] for p in body["pending_approvals"]] == ["call_refund"]
            assert body["pending_approvals"][0]["tool"] == "issue_refund"

            status, body = await asyncio.to_thread(
                http,
                base,
                "POST",
                f"/conversations/{conversation}/approvals/call_other",
                {"approved": True},
            )
            assert status == 409 and "no pending approval" in body["error"]

            status, body = await asyncio.to_thread(
                http,
                base,
                "POST",
                f"/conversations/{conversation}/approvals/call_refund",
                {"approved": True},
            )
            assert status == 200, body
            assert body["status"] == "completed"
            assert body["answer"] == "Your refund of 89 EUR is on its way."

            status, body = await asyncio.to_thread(
                http, base, "GET", f"/conversations/{conversation}"
            )
            assert (status, body["status"]) == (200, "completed")

            status, body = await asyncio.to_thread(
                http, base, "POST", f"/conversations/{conversation}/messages", {"text": "Thanks!"}
            )
            assert (status, body["status"], body["answer"]) == (200, "completed", "You're welcome.")

            status, body = await asyncio.to_thread(http, base, "GET", "/conversations/unknown-1")
            assert status == 404
            status, body = await asyncio.to_thread(
                http, base, "POST", f"/conversations/{conversation}/messages", {"text": " "}
            )
            assert status == 400
        finally:
            server.shutdown()
            server.server_close()
    follow_up = model_server.requests(model.name)[3]
    assert [m["role"] for m in follow_up.messages if m["role"] != "system"] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
        "user",
    ]
    assert follow_up.last_user_text == "Thanks!"
    runs = [w async for w in client.list_workflows(f"WorkflowId = 'chat-{conversation}'")]
    assert len(runs) == 2  # one run per answered message, under the conversation's id


async def test_http_backend_queues_a_message_into_the_running_conversation(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # While a run waits for approval, a new message goes into that run (update-with-start
    # finds it), and is read at the turn boundary after the approval.
    from examples import approvals

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("issue_refund", id="call_r2", order_id="A-1002", amount_eur=10, reason="late"),
            text("Refunded, and noted."),
        ],
    )
    conversation = f"c{uuid.uuid4().hex[:8]}"
    async with serving(client, approvals.refund_agent, default_model=model) as worker:
        backend = approvals.ChatBackend(client, task_queue=worker.task_queue, settle_seconds=10)
        first = await backend.send_message(conversation, "Refund 10 EUR on A-1002")
        assert first["status"] == "waiting_approval"
        second = await backend.send_message(conversation, "Also, please hurry.")
        assert second["status"] == "waiting_approval" and second["run_id"] == first["run_id"]
        status, body = await approvals.handle_request(
            backend,
            "POST",
            f"/conversations/{conversation}/approvals/call_r2",
            {"approved": True},
        )
    assert (status, body["status"], body["answer"]) == (200, "completed", "Refunded, and noted.")
    assert model_server.requests(model.name)[1].last_user_text == "Also, please hurry."
