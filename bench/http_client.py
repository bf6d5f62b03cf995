"""``python -m bench.http_client``: the CPU one model request costs a worker, by HTTP client.

Sends the body a relaykit run sends at its fifth turn (:func:`bench.floor.http_body`) to the
benchmark's model server (its own process), ``--requests`` times at each concurrency, and reads
this process's CPU time around each batch. Three ways, each with a pool of 200 connections:

- ``httpx``: httpx's own transport (relaykit's model client before it moved to aiohttp's pool,
  and still its client behind an HTTP proxy);
- ``adapter``: httpx's API over aiohttp's pool, the worker's client
  (:func:`relaykit.models.http_transport.model_http_client`) as a streaming call uses it, and as
  every call did before a plain one went straight through aiohttp;
- ``relaykit``: a plain (non-streaming) call as the worker makes it
  (:func:`relaykit.models.http_transport.post`: aiohttp's pool, no httpx on the way).

Prints a markdown table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import ssl
import time
from collections.abc import Callable

import httpx

from bench.floor import http_body
from bench.model_server import filler
from bench.procs import Child, commit
from relaykit.models.http_transport import model_http_client, post

TIMEOUT = httpx.Timeout(120.0, connect=10.0)


def _worker_client() -> httpx.AsyncClient:
    return model_http_client(
        timeout=TIMEOUT, max_connections=200, verify=ssl.create_default_context()
    )


CLIENTS: dict[str, Callable[[], httpx.AsyncClient]] = {
    "httpx": lambda: httpx.AsyncClient(
        timeout=TIMEOUT, limits=httpx.Limits(max_connections=200, max_keepalive_connections=200)
    ),
    "adapter": _worker_client,
    "relaykit": _worker_client,
}


async def cpu_per_request(
    client: str, url: str, requests: int, concurrency: int, body: bytes
) -> float:
    """Milliseconds of this process's CPU per request (after a warm-up that opens the pool)."""
    http = CLIENTS[client]()
    gate = asyncio.Semaphore(concurrency)
    headers = {"content-type": "application/json", "authorization": "Bearer bench"}

    async def one() -> None:
        async with gate:
            if client == "relaykit":
                answer = await post(http, url, body, headers, 120.0)
                assert answer.status_code == 200
                json.loads(answer.content)
                return
            response = await http.post(url, content=body, headers=headers)
            response.raise_for_status()
            json.loads(response.content)

    async with http:
        await asyncio.gather(*(one() for _ in range(max(concurrency, 50))))
        started = time.process_time()
        await asyncio.gather(*(one() for _ in range(requests)))
        return (time.process_time() - started) * 1000 / requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--concurrency", default="1,20,200", help="comma-separated")
    parser.add_argument("--reps", type=int, default=3, help="median of this many batches")
    args = parser.parse_args()
    levels = [int(level) for level in args.concurrency.split(",")]
    body = json.dumps(http_body(5, filler(200))).encode()
    results: dict[str, dict[int, float]] = {client: {} for client in CLIENTS}
    with Child("model", ["-m", "bench.model_server"]) as model:
        url = f"{model.info.rstrip('/')}/v1/chat/completions"
        for level in levels:
            for client in CLIENTS:
                figures = sorted(
                    asyncio.run(cpu_per_request(client, url, args.requests, level, body))
                    for _ in range(args.reps)
                )
                results[client][level] = figures[len(figures) // 2]
    print(
        "| concurrent requests | httpx's transport, ms CPU/request | httpx's API over aiohttp "
        "| relaykit's plain call |"
    )
    print("|---|---|---|---|")
    for level in levels:
        cells = " | ".join(f"{results[client][level]:.3f}" for client in CLIENTS)
        print(f"| {level} | {cells} |")
    print(
        json.dumps(
            {
                "commit": commit(),
                "load_average": round(os.getloadavg()[0], 1),
                "requests": args.requests,
                "body_bytes": len(body),
                "ms_cpu_per_request": results,
            }
        )
    )


if __name__ == "__main__":
    main()
