"""The benchmark's model: relaykit's scripted server, answering by rule, in a process of its own.

``python -m bench.model_server [--latency-ms MS] [--response-bytes N]`` prints
``ready <base url>`` once it listens on 127.0.0.1, and serves until SIGTERM.

Every answer is delayed by the configured latency (the step ``delay=`` option) and every
tool-calling answer carries ``N`` bytes of assistant text, which enter the transcript like a real
model's words would. The rule is in :func:`answer` (tasks are described in :mod:`bench.agents`).

It runs in its own process so that its work (parsing every request body, which grows with the
transcript) is visible as its own CPU time and does not compete with the benchmark driver.
"""

from __future__ import annotations

import argparse
import signal
import threading
from typing import Any

from relaykit.testing import scripted_server
from relaykit.testing.scripted_server import (
    Responder,
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    batch,
    call,
    error,
    text,
)

from bench.agents import APPROVAL_CALL_ID, APPROVE_TASK, FANOUT_TOOL, GUARDED, LOOKUP, turns_task

_FILLER = "The quick brown fox jumps over the lazy dog. "


def filler(size: int) -> str:
    return (_FILLER * (size // len(_FILLER) + 1))[:size]


def first_user_text(req: ScriptedRequest) -> str:
    for message in req.messages:
        if message.get("role") == "user":
            content = message.get("content")
            return content if isinstance(content, str) else ""
    return ""


def make_responder(latency_s: float, response_bytes: int) -> Responder:
    pad = filler(response_bytes)

    def answer(req: ScriptedRequest) -> Step:
        task = first_user_text(req)
        kind, _, value = task.partition("=")
        done = len(req.tool_results)
        if kind == "turns":
            if done < int(value):
                return batch(call(LOOKUP, q=f"t{done + 1}"), text=pad, delay=latency_s)
            return text("done", delay=latency_s)
        if kind == "fanout":
            if done == 0:
                calls = [call(FANOUT_TOOL, input=turns_task(1)) for _ in range(int(value))]
                return batch(*calls, text=pad, delay=latency_s)
            return text("done", delay=latency_s)
        if kind == "spawn":
            if done == 0:
                calls = [
                    call("spawn_subagent", prompt=turns_task(1), agent="helper")
                    for _ in range(int(value))
                ]
                return batch(*calls, text=pad, delay=latency_s)
            if done == int(value):
                return batch(call("wait_subagents", timeout_seconds=600), text=pad, delay=latency_s)
            return text("done", delay=latency_s)
        if task == APPROVE_TASK:
            if done == 0:
                return batch(call(GUARDED, id=APPROVAL_CALL_ID, note="x"), text=pad, delay=latency_s)
            return text("done", delay=latency_s)
        return error(400, message=f"unknown benchmark task {task!r}")

    return answer


class BenchModelServer(ScriptedModelServer):
    """The scripted server without its request log: a benchmark sends hundreds of thousands of
    requests whose bodies hold whole transcripts, and nothing here reads them back."""

    def _record_and_pick(self, *args: Any, **kwargs: Any) -> tuple[ScriptedRequest, Step]:
        picked = super()._record_and_pick(*args, **kwargs)
        with self._cond:
            self._requests.clear()
        return picked


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--latency-ms", type=float, default=0.0)
    parser.add_argument("--response-bytes", type=int, default=100)
    args = parser.parse_args(argv)
    # Two settings of the scripted server that would otherwise dominate the figures:
    # - its handler writes the headers and the body of a response separately, so with Nagle's
    #   algorithm on, the body waits for the client's delayed ACK: about 40 ms per model call;
    # - the stock accept backlog (5) drops connection attempts when a hundred runs call the
    #   model at once, and a dropped SYN costs a one-second retransmit.
    scripted_server._Handler.disable_nagle_algorithm = True
    scripted_server._HTTPServer.request_queue_size = 1024
    server = BenchModelServer(
        fallback=make_responder(args.latency_ms / 1000.0, args.response_bytes)
    ).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    print(f"ready {server.base_url}", flush=True)
    try:
        stop.wait()
    finally:
        server.stop()


if __name__ == "__main__":
    main()
