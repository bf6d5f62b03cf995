"""Model text streamed to clients while the model writes, against the real Temporal dev server:
the scripted SSE server, and a paced one whose pieces the test releases one by one."""

from __future__ import annotations

import json
import statistics
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, ModelSpec, start_run, tool
from relaykit.streaming import StreamEvent
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import history_events, scripted_model, serving


@tool
def lookup(city: str) -> str:
    """Look a city up."""
    return f"{city}: sunny"


def texts_by_message(items: list[StreamEvent]) -> list[tuple[str, str]]:
    """(deltas joined, message text) for every message event, per run."""
    pending: dict[str, list[str]] = {}
    pairs = []
    for item in items:
        if item.is_delta:
            if item.data.get("reset"):
                pending[item.workflow_id] = []
            pending.setdefault(item.workflow_id, []).append(item.data["text"])
        elif item.kind == "message":
            pairs.append(("".join(pending.pop(item.workflow_id, [])), item.data["text"]))
    return pairs


async def test_deltas_arrive_in_order_and_add_up_to_each_final_message(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Contract: before each message event, the run's deltas since its previous model call
    # concatenate to the message (also in a child run), in order.
    model = scripted_model(model_server, stream=True)
    child_model = scripted_model(model_server, stream=True)
    model_server.script(child_model.name, [text("Child answer, written in many small pieces.")])
    model_server.script(
        model.name,
        [
            batch(call("lookup", city="Oslo"), text="Let me look that up first."),
            call("ask_helper", input="help"),
            text("Oslo is sunny today, and the helper agrees with that forecast."),
        ],
    )
    helper = Agent(name="helper", model=child_model)
    agent = Agent(name="writer", model=model, tools=[lookup, helper.as_tool()])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "weather?", task_queue=worker.task_queue)
        items = [item async for item in handle.stream()]
        result = await handle.result()
    assert texts_by_message(items) == [
        ("Let me look that up first.", "Let me look that up first."),
        (
            "Child answer, written in many small pieces.",
            "Child answer, written in many small pieces.",
        ),
        (result.output, result.output),
    ]
    child_deltas = [i for i in items if i.is_delta and i.workflow_id != handle.id]
    assert child_deltas and all(i.run_path == ["writer", "helper"] for i in child_deltas)


# --- a model whose pieces the test releases ---------------------------------------------------


class PacedModel:
    """An OpenAI-compatible SSE server that sends each piece only when the test releases it."""

    def __init__(self, pieces: list[str]) -> None:
        self.pieces = pieces
        self.go = threading.Semaphore(0)
        self.sent_at: list[float] = []
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                try:
                    self._answer()
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the test ended before the answer did

            def _answer(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.end_headers()
                base = {"id": "c1", "object": "chat.completion.chunk", "model": body["model"]}

                def send(choice: dict[str, Any] | None, **extra: Any) -> None:
                    chunk = {**base, "choices": [choice] if choice else [], **extra}
                    self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
                    self.wfile.flush()

                send(
                    {
                        "index": 0,
                        "delta": {"role": "assistant", "content": ""},
                        "finish_reason": None,
                    }
                )
                for piece in owner.pieces:
                    if not owner.go.acquire(timeout=20):
                        return
                    owner.sent_at.append(time.monotonic())
                    send({"index": 0, "delta": {"content": piece}, "finish_reason": None})
                send({"index": 0, "delta": {}, "finish_reason": "stop"})
                send(None, usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True

    @property
    def spec(self) -> ModelSpec:
        return ModelSpec(
            name="paced", base_url=f"http://127.0.0.1:{self.httpd.server_port}/v1", stream=True
        )


@contextmanager
def paced(pieces: list[str]) -> Iterator[PacedModel]:
    model = PacedModel(pieces)
    thread = threading.Thread(target=model.httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield model
    finally:
        for _ in pieces:
            model.go.release()
        model.httpd.shutdown()
        model.httpd.server_close()


PIECES = ["The ", "answer ", "is ", "written ", "while ", "you ", "watch."]


async def test_text_appears_while_the_model_writes_and_history_keeps_only_the_final_message(
    client: Client,
) -> None:
    # Contract: each piece reaches the stream before the model sends the next one; the run's
    # history gains no event for it (no signal, no update), only the final message.
    latencies: list[float] = []
    with paced(PIECES) as model:
        agent = Agent(name="writer", model=model.spec)
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
            seen = ""
            released = 0
            model.go.release()
            released = 1
            items: list[StreamEvent] = []
            async for item in handle.stream():
                items.append(item)
                if not item.is_delta:
                    continue
                seen += item.data["text"]
                while released <= len(PIECES) and seen == "".join(PIECES[:released]):
                    if len(model.sent_at) == released:
                        latencies.append(time.monotonic() - model.sent_at[-1])
                    if released == len(PIECES):
                        break
                    model.go.release()
                    released += 1
            result = await handle.result()
            history = await history_events(handle.workflow)
    assert result.output == "".join(PIECES)
    live = [i for i in items if i.is_delta]
    assert [i.data["text"] for i in live] == PIECES  # one delta per piece, as released
    assert texts_by_message(items) == [(result.output, result.output)]
    assert not {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_SIGNALED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED,
    } & {e.event_type for e in history}
    print(
        f"\ndelta latency over {len(latencies)} pieces: "
        f"mean {statistics.mean(latencies) * 1000:.0f} ms, "
        f"max {max(latencies) * 1000:.0f} ms"
    )
    assert max(latencies) < 3.0


async def test_a_stream_resumed_mid_message_continues_the_text_without_repeating_it(
    client: Client,
) -> None:
    # Contract: a client that disconnects after some deltas and resumes from the last cursor
    # gets the rest of the text, not the beginning again.
    with paced(PIECES) as model:
        agent = Agent(name="writer", model=model.spec)
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
            for _ in range(3):
                model.go.release()
            first: list[StreamEvent] = []
            async for item in handle.stream():
                first.append(item)
                if "".join(i.data["text"] for i in first if i.is_delta) == "".join(PIECES[:3]):
                    break  # the client goes away mid-message
            for _ in PIECES[3:]:
                model.go.release()
            rest = [item async for item in handle.stream(from_offset=first[-1].cursor)]
            result = await handle.result()
    assert texts_by_message(first + rest) == [(result.output, result.output)]
    assert not [i for i in rest if i.kind == "run_started"]
