"""``python -m bench.fleet``: a fleet sharing one provider (docs/fleet.md), measured.

Three scenarios, each against an in-memory dev server and the scripted model server, with one
relaykit worker (in this process) whose provider queue allows ``--concurrent`` calls at once:

- ``fairness``: tenant A starts ``--a-runs`` runs, then tenant B starts ``--b-runs``; B's median
  time from its start to its first model request, against B alone on an idle system, with the
  server's fairness on and off;
- ``priority``: ``--backlog-runs`` priority-3 runs, then one priority-1 run: the time from its
  start to its first model request;
- ``storm``: the model server answers 429 with ``Retry-After: 2`` for ``--storm-seconds`` while
  ``--storm-runs`` runs call it: requests the server saw per model call, and whether every run
  completed.

Each run is one model call that answers after ``--latency-ms``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit import Agent, ModelSpec, Worker, start_run
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, error, text


class Stamps:
    """When each run's first request reached the model server (by the run's prompt)."""

    def __init__(self) -> None:
        self.first: dict[str, float] = {}
        self.requests = 0
        self.lock = threading.Lock()

    def seen(self, prompt: str) -> None:
        with self.lock:
            self.requests += 1
            self.first.setdefault(prompt, time.monotonic())


@contextmanager
def servers(fairness: bool) -> Iterator[tuple[DevServer, ScriptedModelServer]]:
    config = {"matching.enableFairness": fairness}
    with (
        DevServer(port=0, headless=True, in_memory=True, dynamic_config=config) as temporal,
        ScriptedModelServer() as model_server,
    ):
        yield temporal, model_server


async def connect(temporal: DevServer) -> Client:
    return await Client.connect(
        temporal.address, namespace=temporal.namespace, data_converter=pydantic_data_converter
    )


def agent_for(model_server: ScriptedModelServer, name: str) -> Agent:
    model = ModelSpec(provider="openai", name=name, base_url=f"{model_server.base_url}/v1")
    return Agent(name="fleet_bench", instructions="Answer.", model=model)


async def start_many(
    client: Client, agent: Agent, queue: str, prompts: list[str], **options: Any
) -> tuple[list[Any], dict[str, float]]:
    handles, started = [], {}
    for prompt in prompts:
        started[prompt] = time.monotonic()
        handles.append(await start_run(client, agent, prompt, task_queue=queue, **options))
    return handles, started


async def wait_all(handles: list[Any], timeout: float) -> int:
    results = await asyncio.wait_for(
        asyncio.gather(*(h.result() for h in handles), return_exceptions=True), timeout
    )
    return sum(1 for r in results if not isinstance(r, BaseException))


def answering(stamps: Stamps, latency: float) -> Any:
    def respond(req: ScriptedRequest) -> Step:
        stamps.seen(req.last_user_text)
        return text("ok", delay=latency)

    return respond


async def tenant_b_wait(args: argparse.Namespace, *, fairness: bool, idle: bool) -> float:
    """B's median seconds from start to first model request."""
    latency = args.latency_ms / 1000
    with servers(fairness) as (temporal, model_server):
        client = await connect(temporal)
        stamps = Stamps()
        model = f"fair-{uuid.uuid4().hex[:6]}"
        model_server.respond(model, answering(stamps, latency))
        agent = agent_for(model_server, model)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        limits = {"openai": str(args.concurrent)}
        async with Worker(client, agent, task_queue=queue, model_limits=limits):
            a: list[Any] = []
            if not idle:
                a, _ = await start_many(
                    client, agent, queue, [f"A{i}" for i in range(args.a_runs)], tenant="A"
                )
            b, started = await start_many(
                client, agent, queue, [f"B{i}" for i in range(args.b_runs)], tenant="B"
            )
            await wait_all(b, 600)
            waits = [stamps.first[p] - started[p] for p in started]
            await wait_all(a, 600)
        return statistics.median(waits)


async def priority_wait(args: argparse.Namespace, urgent: int) -> float:
    latency = args.latency_ms / 1000
    with servers(True) as (temporal, model_server):
        client = await connect(temporal)
        stamps = Stamps()
        model = f"prio-{uuid.uuid4().hex[:6]}"
        model_server.respond(model, answering(stamps, latency))
        agent = agent_for(model_server, model)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        limits = {"openai": str(args.concurrent)}
        async with Worker(client, agent, task_queue=queue, model_limits=limits):
            backlog, _ = await start_many(
                client, agent, queue, [f"P3-{i}" for i in range(args.backlog_runs)], priority=3
            )
            first, started = await start_many(client, agent, queue, ["P1"], priority=urgent)
            await wait_all(first, 600)
            wait = stamps.first["P1"] - started["P1"]
            await wait_all(backlog, 600)
        return wait


async def storm(args: argparse.Namespace) -> dict[str, Any]:
    with servers(True) as (temporal, model_server):
        client = await connect(temporal)
        stamps = Stamps()
        model = f"storm-{uuid.uuid4().hex[:6]}"
        until = time.monotonic() + args.storm_seconds

        def respond(req: ScriptedRequest) -> Step:
            stamps.seen(req.last_user_text)
            if time.monotonic() < until:
                return error(429, headers={"retry-after": "2"}, message="slow down")
            return text("ok", delay=args.latency_ms / 1000)

        model_server.respond(model, respond)
        agent = agent_for(model_server, model)
        queue = f"bench-{uuid.uuid4().hex[:6]}"
        limits = {"openai": str(args.concurrent)}
        async with Worker(client, agent, task_queue=queue, model_limits=limits):
            handles, _ = await start_many(
                client, agent, queue, [f"S{i}" for i in range(args.storm_runs)]
            )
            completed = await wait_all(handles, 600)
        return {
            "runs": args.storm_runs,
            "completed": completed,
            "requests": stamps.requests,
            "requests_per_call": round(stamps.requests / args.storm_runs, 3),
        }


@contextmanager
def gates_open() -> Iterator[None]:
    """The storm as it was before 429 backpressure: every call retries on its own."""
    from relaykit.models.backpressure import ProviderGates

    original = ProviderGates.wait

    async def never_wait(self: Any, key: str, provider: str, heartbeat: Any) -> Any:
        return lambda exc: None

    ProviderGates.wait = never_wait  # type: ignore[method-assign]
    try:
        yield
    finally:
        ProviderGates.wait = original  # type: ignore[method-assign]


async def main(args: argparse.Namespace) -> dict[str, Any]:
    out: dict[str, Any] = {"args": vars(args)}
    if "fairness" in args.scenarios:
        idle = await tenant_b_wait(args, fairness=True, idle=True)
        fair = await tenant_b_wait(args, fairness=True, idle=False)
        unfair = await tenant_b_wait(args, fairness=False, idle=False)
        out["fairness"] = {
            "b_first_call_idle_s": round(idle, 3),
            "b_first_call_fairness_on_s": round(fair, 3),
            "b_first_call_fairness_off_s": round(unfair, 3),
            "ratio_on": round(fair / idle, 2),
            "ratio_off": round(unfair / idle, 2),
        }
        print(json.dumps({"fairness": out["fairness"]}), flush=True)
    if "priority" in args.scenarios:
        out["priority"] = {
            "p1_first_call_s": round(await priority_wait(args, 1), 3),
            "same_run_at_priority_3_s": round(await priority_wait(args, 3), 3),
        }
        print(json.dumps({"priority": out["priority"]}), flush=True)
    if "storm" in args.scenarios:
        out["storm"] = await storm(args)
        print(json.dumps({"storm": out["storm"]}), flush=True)
        with gates_open():
            out["storm_without_gate"] = await storm(args)
        print(json.dumps({"storm_without_gate": out["storm_without_gate"]}), flush=True)
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.fleet", description=__doc__)
    parser.add_argument("--scenarios", default="fairness,priority,storm")
    parser.add_argument("--a-runs", type=int, default=200)
    parser.add_argument("--b-runs", type=int, default=10)
    parser.add_argument("--backlog-runs", type=int, default=200)
    parser.add_argument("--storm-runs", type=int, default=50)
    parser.add_argument("--storm-seconds", type=float, default=10.0)
    parser.add_argument("--concurrent", type=int, default=4)
    parser.add_argument("--latency-ms", type=float, default=500.0)
    args = parser.parse_args(argv)
    args.scenarios = [s.strip() for s in args.scenarios.split(",") if s.strip()]
    return args


if __name__ == "__main__":
    print(json.dumps(asyncio.run(main(parse_args())), indent=2))
