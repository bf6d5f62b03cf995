"""Every operator action has an author: approve, reject, steer, send, pause, resume, budget,
fork and cancel carry the person's name into the run's history (the signal's or update's
payload, the cancel request's reason, the fork's input) and its events (`relaykit events`),
from the API (``by=``) and the CLI (``--as``, default the OS user); calls of older clients
(no name) keep working. Against the real dev server, a worker and the scripted model."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, RunFailed, RunHandle, fork_run, start_run, tool
from relaykit.authors import current_user
from relaykit.devserver import DevServer
from relaykit.runs import RunEvent
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import cli, eventually, history_events, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def refund_tool() -> Any:
    @tool(needs_approval=True)
    def refund(order_id: str) -> str:
        """Refund an order.

        Args:
            order_id: The order.
        """
        return f"refunded {order_id}"

    return refund


async def pending_call(handle: RunHandle) -> str:
    async def waiting() -> bool:
        return bool(await handle.pending_approvals())

    await eventually(waiting, "a pending approval")
    return (await handle.pending_approvals())[0].call_id


async def status_is(handle: RunHandle, status: str) -> None:
    async def check() -> bool:
        return (await handle.state()).status == status

    await eventually(check, f"status {status}")


def authors(events: list[RunEvent]) -> list[tuple[str, str | None]]:
    """(kind, by) of the events that name someone, in order."""
    return [(e.kind, e.data.get("by")) for e in events if e.data.get("by")]


async def names_in_history(handle: RunHandle) -> dict[str, set[str]]:
    """For each kind of history event: the raw bytes of its attributes, to find names in the
    payloads exactly as Temporal stored them."""
    found: dict[str, set[str]] = {}
    for event in await history_events(handle.workflow):
        kind = EventType.Name(event.event_type).removeprefix("EVENT_TYPE_")
        found.setdefault(kind, set()).add(event.SerializeToString().decode("utf-8", "replace"))
    return found


def in_history(history: dict[str, set[str]], kind: str, name: str) -> bool:
    return any(name in raw for raw in history.get(kind, ()))


async def test_each_action_of_the_api_records_its_author_in_history_and_events(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # approve, pause, send, resume and steer, each by a different person: each name is in the
    # signal's or update's payload in history and on the action's event.
    held, release = threading.Event(), threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("refund", order_id="A1"), text("abandoned", hold=held), text("done", hold=release)],
    )
    agent = Agent(name="authored", model=model, tools=[refund_tool()])
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "refund A1", task_queue=worker.task_queue)
            call_id = await pending_call(handle)
            await handle.pause(by="pat")
            assert await handle.send_message("a note", by="sam") == 1
            answered = await handle.approve(call_id, reason="fine", by="alice")
            assert answered.call_id == call_id
            await status_is(handle, "paused")
            await handle.resume("go on", by="ray")
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 2, 20.0)
            assert await handle.steer("be brief", by="stella") is True
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 3, 20.0)
            release.set()
            result = await handle.result()
            events = await handle.events()
            code, shown, err = await cli("events", handle.id, address=temporal_server.address)
            assert code == 0, err
    finally:
        held.set()
        release.set()
    assert result.output == "done"
    for kind, name in (
        ("approval_answered", "alice"),
        ("paused", "pat"),
        ("resumed", "ray"),
        ("message_injected", "sam"),
        ("steered", "stella"),
    ):  # `relaykit events` puts the name before the event's data, never cut off
        assert any(kind in line and f"by {name}: " in line for line in shown.splitlines())
    assert authors(events) == [
        ("approval_answered", "alice"),
        ("paused", "pat"),
        ("resumed", "ray"),
        ("message_injected", "sam"),
        ("message_injected", "ray"),
        ("steered", "stella"),
        ("message_injected", "stella"),
    ]
    answer = next(e for e in events if e.kind == "approval_answered")
    assert answer.data["reason"] == "fine" and answer.data["approved"] is True
    history = await names_in_history(handle)
    assert in_history(history, "WORKFLOW_EXECUTION_UPDATE_ACCEPTED", "alice")
    assert in_history(history, "WORKFLOW_EXECUTION_UPDATE_ACCEPTED", "sam")
    assert in_history(history, "WORKFLOW_EXECUTION_UPDATE_ACCEPTED", "stella")
    assert in_history(history, "WORKFLOW_EXECUTION_SIGNALED", "pat")
    assert in_history(history, "WORKFLOW_EXECUTION_SIGNALED", "ray")


async def test_calls_without_a_name_from_older_clients_still_act(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The payloads clients sent before names: a bare string to steer/send_message, nothing to
    # pause, one argument to resume. They act as before; their events name nobody.
    held, release = threading.Event(), threading.Event()
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [text("abandoned", hold=held), text("first", hold=release), text("second")],
    )
    agent = Agent(name="old_clients", model=model)
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "hello", task_queue=worker.task_queue)
            flow = handle.workflow
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 1, 20.0)
            assert await flow.execute_update("steer", "old steer", result_type=bool) is True
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 2, 20.0)
            await flow.signal("pause")
            assert await flow.execute_update("send_message", "old note", result_type=int) == 1
            await flow.signal("send_message_signal", "old signal note")
            release.set()
            await status_is(handle, "paused")
            await flow.signal("resume", None)
            result = await handle.result()
            events = await handle.events()
    finally:
        held.set()
        release.set()
    assert result.output == "second"
    assert authors(events) == []
    injected = [e.data["text"] for e in events if e.kind == "message_injected"]
    assert injected == ["old steer", "old note", "old signal note"]
    assert [e.kind for e in events if e.kind in ("paused", "resumed", "steered")] == [
        "steered",
        "paused",
        "resumed",
    ]


async def test_the_cli_records_the_operator_and_relaykit_events_shows_who(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # `--as NAME` names the operator; without it, the OS user. A cancel's author is in the
    # history's cancel request and the run's `cancelled` event.
    held = threading.Event()
    model = scripted_model(model_server)
    model_server.script(model.name, [call("refund", order_id="B2"), text("never", hold=held)])
    agent = Agent(name="cli_authored", model=model, tools=[refund_tool()])
    address = temporal_server.address
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "refund B2", task_queue=worker.task_queue)
            call_id = await pending_call(handle)
            code, _, err = await cli(
                "approve", handle.id, call_id, "--reject", "--as", "Bo Brown", address=address
            )
            assert code == 0, err
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 2, 20.0)
            code, _, err = await cli("cancel", handle.id, address=address)
            assert code == 0, err
            try:
                await handle.result()
                raise AssertionError("the run should have been cancelled")
            except RunFailed:
                pass
            code, shown, err = await cli("events", handle.id, address=address)
            assert code == 0, err
            events = await handle.events()
    finally:
        held.set()
    me = current_user()
    assert authors(events) == [("approval_answered", "Bo Brown"), ("cancelled", me)]
    assert "by Bo Brown: " in shown and f"by {me}: " in shown
    cancel_requests = [
        e.workflow_execution_cancel_requested_event_attributes
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCEL_REQUESTED
    ]
    assert [c.cause for c in cancel_requests] == [f"cancelled by {me}"]


async def test_a_fork_records_who_forked_it_in_its_input_and_first_event(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)

    @tool
    def lookup() -> str:
        """Look something up."""
        return "found"

    model_server.script(model.name, [call("lookup"), text("origin"), text("forked")])
    agent = Agent(name="forkable_authored", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        origin = await start_run(client, agent, "look", task_queue=worker.task_queue)
        await origin.result()
        forked = await fork_run(client, origin.id, 1, input="again", by="fran")
        assert (await forked.result()).output == "forked"
        started = (await forked.events())[0]
    assert started.kind == "run_started"
    assert started.data["by"] == "fran" and started.data["forked_from"] == f"{origin.id}@1"
    history = await names_in_history(forked)
    assert in_history(history, "WORKFLOW_EXECUTION_STARTED", "fran")
