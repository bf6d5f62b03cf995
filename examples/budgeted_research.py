"""A research job with a $0.05 limit: it pauses at the limit, a person raises it, and it finishes.

The lead (``budgeted_lead``) starts two ``budgeted_researcher`` subagents, each given a
reservation out of what the run has left, waits for their reports, and writes the answer. With
``Budget(max_usd=0.05)`` the run waits in ``budget_reached`` when its next call would not fit;
a person looks and raises the limit, and the run goes on where it stopped::

    relaykit worker examples.budgeted_research      # with a real model: RELAYKIT_MODEL=...
    relaykit run budgeted_lead "Compare Temporal and Celery" --max-usd 0.05
    relaykit runs --status budget_reached           # the run, what it spent, its limit
    relaykit pending RUN_ID                         # "budget reached: spent … of $0.0500"
    relaykit budget RUN_ID --raise 0.10             # it goes on where it stopped
    relaykit result RUN_ID                          # the answer, and what it cost

``python -m examples.budgeted_research`` plays it all without a model provider, on the Temporal
server of ``TEMPORAL_ADDRESS`` (e.g. ``temporal server start-dev``): a scripted model server
whose calls are priced (:data:`PRICE`, so each costs what its tokens say), a worker, the run,
the pause, the raise and the answer, printing what a person would see. A real model is priced from
the bundled price table instead (docs/budgets.md).
"""

from __future__ import annotations

import asyncio
import dataclasses
import os

from relaykit import Agent, Budget, ModelSettings, ModelSpec, Price, Subagents, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, batch, call, text

PRICE = Price(input=2.50, output=10.00)
"""USD per million tokens the scripted model charges (a mid-sized hosted model's price)."""
LIMIT = 0.05
RAISE = 0.10


@tool(effect="read")
def read_source(topic: str) -> str:
    """Read what the library has on a topic.

    Args:
        topic: One word, e.g. "temporal".
    """
    return {
        "temporal": "Temporal keeps every workflow step in history and replays it after a crash.",
        "celery": "Celery retries a task on failure; multi-step state is the application's.",
    }.get(topic.strip().lower(), f"nothing on {topic}")


def research_team(model: ModelSpec | None = None) -> Agent:
    """The lead and its researchers (with ``model``, or the worker's default model)."""
    researcher = Agent(
        name="budgeted_researcher",
        instructions="Research the topic with read_source and report the facts in one sentence.",
        tools=[read_source],
        model=model,
        model_settings=ModelSettings(max_tokens=100),
    )
    return Agent(
        name="budgeted_lead",
        instructions=(
            "Start one budgeted_researcher per topic with spawn_subagent, wait for their "
            "reports, then answer with a short comparison."
        ),
        model=model,
        subagents=Subagents([researcher], max_concurrent=2, max_turns=4),
        model_settings=ModelSettings(max_tokens=800),
        budget=Budget(max_usd=LIMIT),
    )


budgeted_lead = research_team()


def scripted_budgeted_research(request: ScriptedRequest) -> Step:
    """The model of both agents, offline. The lead's answers report 6,000 input tokens (a long
    research prompt: $0.015 a call), a researcher's 200 ($0.0005)."""
    if "spawn_subagent" in request.tool_names:
        return dataclasses.replace(_lead(request), usage=(6_000, 0))
    if request.tool_results:
        step = text(f"Report: {request.tool_results[-1]}")
    else:
        step = call("read_source", topic=request.last_user_text.split()[-1].strip("."))
    return dataclasses.replace(step, usage=(200, 0))


def _lead(request: ScriptedRequest) -> Step:
    everything = " ".join(str(m.get("content")) for m in request.messages)
    ended = everything.count("budgeted_researcher] ")  # "[task-1 · budgeted_researcher] …"
    called = {
        tc.get("function", {}).get("name")
        for m in request.messages
        for tc in m.get("tool_calls") or []
    }
    if "spawn_subagent" not in called:
        return batch(
            *(call("spawn_subagent", prompt=f"Research {t}") for t in ("temporal", "celery"))
        )
    if ended < 2:
        return call("wait_subagents", timeout_seconds=30)
    return text("Comparison: Temporal replays its history after a crash; Celery retries tasks.")


async def play(address: str | None = None) -> str:
    """The whole story without a model provider, as a person would see it; returns the answer."""
    from relaykit import Worker, start_run
    from relaykit.client import connect
    from relaykit.pricing import format_usd
    from relaykit.testing.scripted_server import ScriptedModelServer

    with ScriptedModelServer() as server:
        model = ModelSpec(name="scripted-research", base_url=f"{server.base_url}/v1", price=PRICE)
        server.respond(model.name, scripted_budgeted_research)
        lead = research_team(model)
        client = await connect(address)
        queue = f"budgeted-research-{os.getpid()}"
        async with Worker(client, [lead], task_queue=queue):
            handle = await start_run(client, lead, "Compare Temporal and Celery", task_queue=queue)
            while True:  # (a short wait while researchers hold their reservations is not it)
                snapshot = await handle.state()
                budget = snapshot.budget
                if snapshot.status == "budget_reached" and budget and not budget.reserved:
                    break
                await asyncio.sleep(0.2)
            print(
                f"{handle.id}: budget_reached, spent {format_usd(budget.spent)} "
                f"of {format_usd(budget.limit)}"
            )
            view = await handle.set_budget(raise_by=RAISE, by="example")
            print(f"raised to {format_usd(view.limit)}")
            result = await handle.result()
        print(f"{result.output}\n(cost {format_usd(result.usage.cost_usd)})")
        return str(result.output)


if __name__ == "__main__":
    asyncio.run(play())
