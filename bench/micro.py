"""Isolated costs of the pieces a relaykit turn adds to a bare Temporal turn.

``python -m bench.micro`` times, in this process and without a Temporal server, the operations
the profile (``python -m bench.profile``) points at, so a proposed fix can be judged by its
size: building tool schemas, converting model requests of growing transcripts to and from
payloads, an ``asyncio.to_thread`` round trip, one httpx POST to the scripted model server, and
the transcript store. Figures are the best of several repeats (least disturbed by other load).
"""

from __future__ import annotations

import asyncio
import json
import shutil
import tempfile
import time
import timeit
from collections.abc import Callable
from typing import Any

from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit.messages import Message, ModelResponse, ToolCall
from relaykit.models.spec import ModelRequest, ModelSpec

from bench.agents import lookup
from bench.model_server import filler


def best_us(fn: Callable[[], Any], number: int = 200, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def transcript(turns: int, response_bytes: int = 100) -> list[Message]:
    messages = [Message.user(f"turns={turns}")]
    for i in range(turns):
        call = ToolCall(id=f"call_{i}", name="lookup", arguments=json.dumps({"q": f"t{i + 1}"}))
        messages.append(Message.assistant(filler(response_bytes), [call]))
        messages.append(Message.tool_result(call, f"found t{i + 1}"))
    return messages


async def _cpu_per_call(call: Callable[[], Any], n: int) -> float:
    started = time.process_time()
    for _ in range(n):
        await call()
    return (time.process_time() - started) / n * 1e6


def main() -> None:
    rows: list[tuple[str, str]] = []
    rows.append(("Tool.spec (pydantic JSON schema of one tool)", f"{best_us(lambda: lookup.spec):.0f} µs"))

    converter = pydantic_data_converter.payload_converter
    spec = ModelSpec(name="bench", base_url="http://127.0.0.1:1/v1")
    for k in (1, 10, 100, 300):
        request = ModelRequest(model=spec, system="x", messages=transcript(k), tools=[lookup.spec])
        payload = converter.to_payloads([request])[0]
        encode = best_us(lambda: converter.to_payloads([request]), number=20)
        decode = best_us(lambda: converter.from_payloads([payload], [ModelRequest]), number=20)
        rows.append(
            (f"ModelRequest, whole transcript of {k} turns ({len(payload.data) / 1024:.1f} KiB)",
             f"encode {encode:.0f} µs, decode {decode:.0f} µs")
        )
    response = ModelResponse(message=transcript(1)[1])
    payload = converter.to_payloads([response])[0]
    rows.append(
        (f"ModelResponse ({len(payload.data)} B)",
         f"encode {best_us(lambda: converter.to_payloads([response])):.0f} µs, decode "
         f"{best_us(lambda: converter.from_payloads([payload], [ModelResponse])):.0f} µs")
    )
    rows.append(("floor payload (an int)", f"encode {best_us(lambda: converter.to_payloads([3])):.1f} µs"))

    async def hop() -> None:
        await asyncio.to_thread(lambda: None)

    rows.append(("asyncio.to_thread round trip (CPU)", f"{asyncio.run(_cpu_per_call(hop, 2000)):.0f} µs"))

    async def wrapped() -> None:
        async def work() -> int:
            return 1

        task = asyncio.ensure_future(work())
        await asyncio.wait({task}, timeout=1.0)

    rows.append((
        "extra task + asyncio.wait(timeout) around an await (CPU)",
        f"{asyncio.run(_cpu_per_call(wrapped, 5000)):.0f} µs",
    ))

    from bench.procs import Child

    with Child("model-server", ["-m", "bench.model_server"]) as model:
        import httpx

        async def posts() -> tuple[float, float]:
            async with httpx.AsyncClient() as http:
                body = {"model": "bench", "messages": [{"role": "user", "content": "turns=1000"}]}
                url = f"{model.info}/v1/chat/completions"

                async def post() -> None:
                    (await http.post(url, json=body)).json()

                for _ in range(20):
                    await post()
                wall = time.perf_counter()
                cpu = await _cpu_per_call(post, 300)
                return cpu, (time.perf_counter() - wall) / 300 * 1e6

        cpu, wall = asyncio.run(posts())
        rows.append(("httpx POST to the scripted model server", f"client CPU {cpu:.0f} µs, wall {wall:.0f} µs"))

    try:
        from relaykit.transcripts import TranscriptStore
    except ImportError:
        rows.append(("transcript store", "not in this relaykit"))
    else:
        directory = tempfile.mkdtemp(prefix="relaykit-bench-")
        try:
            store = TranscriptStore(directory)
            messages = transcript(1)
            loop = asyncio.new_event_loop()
            ref = [loop.run_until_complete(store.save("bench", None, messages[:1]))]

            def save() -> None:
                ref[0] = loop.run_until_complete(store.save("bench", ref[0], messages[1:]))

            def load() -> None:
                loop.run_until_complete(store.load("bench", ref[0]))

            rows.append(("TranscriptStore.save of one turn (2 messages)", f"{best_us(save):.0f} µs"))
            rows.append(("TranscriptStore.load, cache hit", f"{best_us(load):.0f} µs"))
            loop.close()
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    print("| operation | cost |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
