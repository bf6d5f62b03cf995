"""Steering a run (``RunHandle.steer``, ``relaykit steer``): the model call in flight is cancelled
and the next one answers the corrected question, against the real dev server, a worker and the
scripted model over HTTP."""

from __future__ import annotations

import asyncio
import os
import threading
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, start_run, tool
from relaykit.authors import current_user
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, call, text
from relaykit.watch import describe
from tests.support import cli, eventually, history_events, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def event_types(history: list[Any]) -> list[int]:
    return [event.event_type for event in history]


async def test_a_steer_cancels_the_held_model_call_and_the_next_call_answers_the_steered_question(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # The first call is held (a slow model): the steer cancels it, the activity stops, its
    # answer is never used, it is not a turn, and the next call, with the steer's text, answers.
    held, second = threading.Event(), threading.Event()
    model = scripted_model(model_server)

    def respond(request: ScriptedRequest) -> Any:
        if request.last_user_text == "actually: the weather in Tokyo":
            return text("Tokyo: sunny", hold=second)
        return text("Paris: rainy (the wrong question)", hold=held)

    model_server.respond(model.name, respond)
    agent = Agent(name="steered_assistant", model=model)
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(
                client, agent, "the weather in Paris", task_queue=worker.task_queue
            )
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 1, 20.0)
            code, out, err = await cli(
                "steer",
                handle.id,
                "actually: the weather in Tokyo",
                address=temporal_server.address,
            )
            assert code == 0, err
            await asyncio.to_thread(model_server.wait_for_requests, model.name, 2, 20.0)

            async def first_call_stopped() -> bool:  # the cancel reached the activity
                return EventType.EVENT_TYPE_ACTIVITY_TASK_CANCELED in event_types(
                    await history_events(handle.workflow)
                )

            await eventually(first_call_stopped, "the held model call to be cancelled")
            second.set()
            result = await handle.result()
            events = await handle.events()
            shown = [
                describe(item)
                async for item in handle.stream(deltas=False)
                if item.kind == "steered"
            ]
    finally:
        held.set()
        second.set()
    assert (
        out.strip()
        == "steered: the model call in flight was cancelled; the next one has your message"
    )
    assert result.output == "Tokyo: sunny"
    assert result.turns == 1 and result.usage.requests == 1
    assert [m.role for m in result.transcript] == ["user", "user", "assistant"]
    assert "Paris: rainy" not in " ".join(m.content for m in result.transcript)
    steered = [e for e in events if e.kind == "steered"]
    me = current_user()  # the CLI names the operator: the OS user without --as
    assert [e.data for e in steered] == [
        {"text": "actually: the weather in Tokyo", "cancelled_call": True, "by": me}
    ]
    assert shown == [  # what `relaykit watch` prints
        "steered: actually: the weather in Tokyo (the model call in flight was abandoned)"
        f" · by {me}"
    ]
    sent = model_server.requests(model.name)[1].messages
    assert [m["content"] for m in sent if m["role"] == "user"] == [
        "the weather in Paris",
        "actually: the weather in Tokyo",
    ]


async def test_a_steer_with_no_model_call_in_flight_is_a_message_and_a_closed_run_refuses_it(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # While a tool call waits for approval nothing is cancelled: the text enters at the next
    # turn boundary, like `send`. On a closed run: one line, exit status 1.
    @tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund money."""
        return f"refunded {amount}"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("refund", amount=5), text("done, and noted")])
    agent = Agent(name="steered_refunder", model=model, tools=[refund])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "refund 5", task_queue=worker.task_queue)

        async def waiting() -> bool:
            return bool(await handle.pending_approvals())

        await eventually(waiting, "the approval")
        assert await handle.steer("and send a receipt") is False
        [pending] = await handle.pending_approvals()
        await handle.approve(pending.call_id)
        result = await handle.result()
        code, out, err = await cli("steer", handle.id, "too late", address=temporal_server.address)
    assert result.output == "done, and noted" and result.turns == 2
    sent = model_server.requests(model.name)[1].messages
    assert (sent[-1]["role"], sent[-1]["content"]) == ("user", "and send a receipt")
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"error: run {handle.id!r} is closed (completed): cannot be steered "
        f"(hint: `relaykit result {handle.id}` shows how it ended)"
    ]
