"""What model calls cost: priced from the bundled table or an override, recorded with the call,
and rolled up to the root run."""

from __future__ import annotations

import dataclasses

from temporalio.client import Client

from relaykit import Agent, ModelSpec, Price, start_run
from relaykit.pricing import PRICE_TABLE
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import scripted_model, serving


def table_model(server: ScriptedModelServer, provider: str = "openai") -> ModelSpec:
    """A model the bundled price table knows, served by the scripted server (no other test
    scripts these names)."""
    if provider == "openai":
        name = "gpt-4o-mini-2024-07-18"
        return ModelSpec(provider="openai", name=name, base_url=f"{server.base_url}/v1")
    name = "claude-3-5-haiku-20241022"
    return ModelSpec(provider="anthropic", name=name, base_url=server.base_url)


async def test_a_call_is_priced_from_the_table_with_its_cached_input_cheaper(
    client: Client, model_server: ScriptedModelServer
) -> None:
    for provider in ("openai", "anthropic"):
        model = table_model(model_server, provider)
        model_server.script(model.name, [text("hi", usage=(1_000_000, 100_000), cached=400_000)])
        agent = Agent(name=f"priced-{provider}", model=model)
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
            result = await handle.result()
            events = await handle.events()
        # gpt-4o-mini: $0.15 input, $0.075 cached, $0.60 output per million;
        # claude-3-5-haiku: $0.80 input, $0.08 cached, $4 output.
        rates = (0.15, 0.075, 0.6) if provider == "openai" else (0.8, 0.08, 4.0)
        expected = 0.6 * rates[0] + 0.4 * rates[1] + 0.1 * rates[2]
        assert abs(result.usage.cost_usd - expected) < 1e-9
        assert result.usage.cached_input_tokens == 400_000
        assert result.usage.by_model == {model.label: result.usage.cost_usd}
        assert result.usage.by_agent == {agent.name: result.usage.cost_usd}
        call_event = next(e for e in events if e.kind == "model_call")
        assert call_event.data["cost"] == result.usage.cost_usd
        assert call_event.data["price_source"] == PRICE_TABLE


async def test_an_override_prices_a_model_the_table_does_not_know(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server, price=Price(input=2.0, output=8.0, cached_input=0.5))
    model_server.script(model.name, [text("hi", usage=(1_000_000, 1_000_000), cached=500_000)])
    agent = Agent(name="override", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    assert abs(result.usage.cost_usd - (0.5 * 2 + 0.5 * 0.5 + 8.0)) < 1e-9
    assert next(e for e in events if e.kind == "model_call").data["price_source"] == "override"


async def test_a_model_without_a_price_has_an_unknown_cost(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text("hi")])
    agent = Agent(name="unpriced", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    assert result.usage.cost_usd == 0 and result.usage.unpriced_requests == 1
    assert not result.usage.cost_known
    assert next(e for e in events if e.kind == "model_call").data["cost"] is None


async def test_the_cost_of_a_handoff_an_agent_tool_and_two_subagents_rolls_up_to_the_root(
    client: Client, model_server: ScriptedModelServer
) -> None:
    from relaykit import Subagents

    def priced(name: str, dollars: float) -> tuple[Agent, ModelSpec]:
        """An agent whose every call (1M input tokens) costs ``dollars``."""
        model = scripted_model(model_server, price=Price(input=dollars, output=0))
        return Agent(name=name, model=model), model

    helper, helper_model = priced("helper", 0.01)
    worker_agent, worker_model = priced("digger", 0.02)
    closer, closer_model = priced("closer", 0.04)
    # boss: five calls at $0.001; helper: one at $0.01; digger: two at $0.02; closer: $0.04
    boss_model = scripted_model(model_server, price=Price(input=0.001, output=0))
    boss = Agent(
        name="boss",
        model=boss_model,
        tools=[helper.as_tool()],
        handoffs=[closer],
        subagents=Subagents(agents=[worker_agent]),
    )
    million = (1_000_000, 0)
    model_server.script(helper_model.name, [text("helped", usage=million)])
    model_server.script(
        worker_model.name, [text("dug a", usage=million), text("dug b", usage=million)]
    )
    model_server.script(closer_model.name, [text("closed", usage=million)])
    model_server.script(
        boss_model.name,
        [
            dataclasses.replace(call("ask_helper", input="help"), usage=million),
            dataclasses.replace(
                call("spawn_subagent", agent="digger", prompt="dig a"), usage=million
            ),
            dataclasses.replace(
                call("spawn_subagent", agent="digger", prompt="dig b"), usage=million
            ),
            dataclasses.replace(call("wait_subagents", timeout_seconds=30), usage=million),
            dataclasses.replace(call("transfer_to_closer"), usage=million),
        ],
    )
    async with serving(client, boss) as worker:
        handle = await start_run(client, boss, "go", task_queue=worker.task_queue)
        result = await handle.result()
    usage = result.usage
    assert abs(usage.by_agent["helper"] - 0.01) < 1e-9
    assert abs(usage.by_agent["digger"] - 0.04) < 1e-9
    assert abs(usage.by_agent["closer"] - 0.04) < 1e-9
    assert abs(usage.by_agent["boss"] - 0.005) < 1e-9
    assert abs(usage.cost_usd - 0.095) < 1e-9
    assert abs(sum(usage.by_model.values()) - usage.cost_usd) < 1e-9
