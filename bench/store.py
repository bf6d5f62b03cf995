"""The store's cost per turn: a local directory against S3 (moto's S3 server on 127.0.0.1).

``python -m bench.store`` measures, for each backend:

- the store operations one model call makes: saving the turn's prefix node, and loading a
  prefix on a worker that has it in memory (the common case) and on one that does not (a new
  worker after a deploy: the chain is read from the store);
- the wall time per turn of a whole relaykit run (scripted model, one tool call per turn) on a
  worker whose store is that backend, against a Temporal dev server started here.

moto is a Python emulation of S3, so its figures are an upper bound on request overhead rather
than what a real bucket costs (real S3 adds network latency instead). Options: ``--turns``
(default 50), ``--reps`` (default 3), ``--json PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import shutil
import socket
import statistics
import tempfile
import time
import uuid
from typing import Any

from relaykit.messages import Message


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _turn(i: int) -> list[Message]:
    return [Message.assistant(f"thinking about step {i} " + "x" * 100), Message.user(f"step {i} done")]


async def _store_ops(url: str, turns: int) -> dict[str, float]:
    from relaykit.transcripts import TranscriptStore

    store = TranscriptStore(url)
    scope = f"bench-{uuid.uuid4().hex[:8]}"
    ref = await store.save(scope, None, [Message.user("task")])
    saves = []
    for i in range(turns):
        start = time.perf_counter()
        ref = await store.save(scope, ref, _turn(i))
        saves.append(time.perf_counter() - start)
    hits = []
    for _ in range(50):
        start = time.perf_counter()
        await store.load(scope, ref)
        hits.append(time.perf_counter() - start)
    fresh = TranscriptStore(url)  # a new worker: nothing in memory
    start = time.perf_counter()
    await fresh.load(scope, ref)
    cold = time.perf_counter() - start
    # One turn on a worker that has the previous prefix in memory only through the store.
    other = TranscriptStore(url)
    previous = await store.save(scope, ref, _turn(turns))
    start = time.perf_counter()
    await other.load(scope, previous)
    await other.save(scope, previous, _turn(turns + 1))
    first_turn_elsewhere = time.perf_counter() - start
    return {
        "save_ms": statistics.median(saves) * 1e3,
        "load_hit_ms": statistics.median(hits) * 1e3,
        f"load_cold_{turns}_turn_chain_ms": cold * 1e3,
        "turn_on_a_new_worker_ms": first_turn_elsewhere * 1e3,
    }


async def _run_turns(url: str, turns: int, reps: int) -> float:
    """Median wall seconds per turn of a ``turns``-turn run on a worker storing in ``url``."""
    from temporalio.client import Client

    from relaykit import Agent, ModelSpec, Worker, start_run, tool
    from relaykit.devserver import DevServer
    from relaykit.payload_storage import with_external_storage
    from relaykit.storage import Store
    from relaykit.testing.scripted_server import ScriptedModelServer, call, text

    @tool
    def step(n: int) -> str:
        """One step."""
        return f"step {n} done"

    with DevServer(port=0, headless=True, in_memory=True) as server, ScriptedModelServer() as models:
        from temporalio.contrib.pydantic import pydantic_data_converter

        store = Store(url)
        client = await Client.connect(
            server.address, namespace=server.namespace,
            data_converter=with_external_storage(pydantic_data_converter, store),
        )
        name = f"bench-{uuid.uuid4().hex[:6]}"

        def respond(request: Any) -> Any:
            done = sum(1 for m in request.messages if m["role"] == "tool")
            return call("step", n=done + 1) if done < turns - 1 else text("done")

        models.respond(name, respond)
        agent = Agent(name="bench_store", model=ModelSpec(provider="openai", name=name, base_url=f"{models.base_url}/v1"), tools=[step])
        per_turn = []
        async with Worker(client, agent, task_queue=f"bench-{uuid.uuid4().hex[:6]}", store=store) as worker:
            for rep in range(reps + 1):
                start = time.perf_counter()
                handle = await start_run(client, agent, "go", task_queue=worker.task_queue, max_turns=turns + 2)
                await handle.result()
                if rep:  # the first run warms up
                    per_turn.append((time.perf_counter() - start) / turns)
        return statistics.median(per_turn)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    port = _free_port()
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    moto.start()
    directory = tempfile.mkdtemp(prefix="relaykit-bench-store-")
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_REGION")}
    os.environ.update(AWS_ACCESS_KEY_ID="bench", AWS_SECRET_ACCESS_KEY="bench", AWS_REGION="us-east-1")
    try:
        endpoint = f"http://127.0.0.1:{port}"
        boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket="relaykit-bench")
        backends = {
            "local": f"file://{directory}",
            "s3 (moto)": f"s3://relaykit-bench/store?endpoint={endpoint}&allow_http=true",
        }
        results: dict[str, dict[str, float]] = {}
        for label, url in backends.items():
            row = asyncio.run(_store_ops(url, args.turns))
            row["run_ms_per_turn"] = asyncio.run(_run_turns(url, args.turns, args.reps)) * 1e3
            results[label] = row
    finally:
        moto.stop()
        shutil.rmtree(directory, ignore_errors=True)
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    keys = list(next(iter(results.values())))
    print("| backend | " + " | ".join(keys) + " |")
    print("|---|" + "---|" * len(keys))
    for label, row in results.items():
        print(f"| {label} | " + " | ".join(f"{row[k]:.2f}" for k in keys) + " |")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2)


if __name__ == "__main__":
    main()
