"""What a dollar budget costs per turn: the same run with ``Budget(max_usd=...)`` and without.

    python -m bench.budget                 # 40-turn runs, 7 of each, round-robin
    python -m bench.budget --turns 20 --reps 3

One process holds a relaykit worker, the scripted model server (priced answers) and the client;
the Temporal dev server runs in its own. Each repetition runs both variants (alternating which
goes first) of a run of ``--turns`` tool-calling turns; the figure is the median wall time and
CPU time of this process per turn, and the ratio budget / plain. The runs are identical but for
the budget (the limit is far away, so neither ever pauses): the difference is the accounting
(pricing each call, the worst-case check and output cap before it, the recorded prices at the
start).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from relaykit import Agent, Budget, ModelSettings, ModelSpec, Price, Worker, start_run, tool
from relaykit.client import connect
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, call, text


@tool(effect="read")
def note(n: int) -> str:
    """Note a number.

    Args:
        n: Any number.
    """
    return f"noted {n}"


def responder(turns: int) -> Callable[[ScriptedRequest], Step]:
    def respond(request: ScriptedRequest) -> Step:
        done = len(request.tool_results)
        if done >= turns:
            return text("done", usage=(2_000, 20))
        return Step(calls=call("note", n=done).calls, usage=(2_000, 20))

    return respond


async def one_run(client: Any, agent: Agent, queue: str, budget: Budget | None) -> None:
    handle = await start_run(client, agent, "go", task_queue=queue, budget=budget, max_turns=500)
    await handle.result()


async def main(turns: int, reps: int) -> None:
    with (
        DevServer(port=0, headless=True, in_memory=True) as server,
        ScriptedModelServer() as models,
    ):
        model = ModelSpec(
            name=f"bench-{uuid.uuid4().hex[:6]}",
            base_url=f"{models.base_url}/v1",
            price=Price(input=1.0, output=4.0),
        )
        models.respond(model.name, responder(turns))
        agent = Agent(
            name="bench_budget",
            model=model,
            tools=[note],
            model_settings=ModelSettings(max_tokens=200),
            max_repeated_calls=None,
        )
        client = await connect(server.address)
        queue = f"bench-budget-{uuid.uuid4().hex[:6]}"
        variants = {"plain": None, "budget": Budget(max_usd=1_000.0)}
        timings: dict[str, list[tuple[float, float]]] = {name: [] for name in variants}
        async with Worker(client, [agent], task_queue=queue):
            for budget in variants.values():  # warm-up
                await one_run(client, agent, queue, budget)
            for rep in range(reps):
                order = list(variants) if rep % 2 == 0 else list(reversed(variants))
                for name in order:
                    wall, cpu = time.perf_counter(), time.process_time()
                    await one_run(client, agent, queue, variants[name])
                    per_turn = (
                        (time.perf_counter() - wall) / turns,
                        (time.process_time() - cpu) / turns,
                    )
                    timings[name].append(per_turn)
        print(f"{turns} turns per run, {reps} runs of each (median per turn)")
        medians = {}
        for name, rows in timings.items():
            wall = statistics.median(r[0] for r in rows) * 1000
            cpu = statistics.median(r[1] for r in rows) * 1000
            medians[name] = (wall, cpu)
            print(f"  {name:<7} wall {wall:6.2f} ms   cpu {cpu:6.2f} ms")
        (pw, pc), (bw, bc) = medians["plain"], medians["budget"]
        print(f"  budget / plain: wall {bw / pw:.3f}   cpu {bc / pc:.3f}")


def cli() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--reps", type=int, default=7)
    args = parser.parse_args()
    asyncio.run(main(args.turns, args.reps))


if __name__ == "__main__":
    cli()
