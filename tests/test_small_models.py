"""Settings that let a small model finish: a bounded number of tool turns per agent, and a
default context policy for models with a small context window."""

from __future__ import annotations

import dataclasses
import itertools

from temporalio.client import Client

from relaykit import Agent, ContextPolicy, start_run, tool
from relaykit.context_policy import default_context_policy
from relaykit.models.spec import LOCAL_CONTEXT_WINDOW, parse_model
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    call,
    text,
)
from tests.support import scheduled_activities, scripted_model, serving


@tool
def lookup(key: str) -> str:
    """Look something up.

    Args:
        key: What to look up.
    """
    return f"value of {key}"


def wanders(request: ScriptedRequest) -> Step:
    """A model that always calls the tool with new arguments unless it is given no tools."""
    if request.body.get("tool_choice") == "none":
        return text(f"answer from {len(request.tool_results)} lookups")
    return call("lookup", key=f"k{request.index}")


async def test_an_agent_answers_without_tools_after_its_answer_after_tool_turns(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The loop guard cannot stop a model that changes its arguments every turn; the agent's
    # tool-turn limit does, even with the default max_turns of 50.
    model = scripted_model(model_server)
    model_server.respond(model.name, wanders)
    agent = Agent(name="wanderer", model=model, tools=[lookup], answer_after_tool_turns=3)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "find it", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "answer from 3 lookups"
    assert result.turns == 4
    assert (await scheduled_activities(handle.workflow)).count("lookup") == 3


async def test_tool_turns_count_again_after_a_user_message(
    client: Client, model_server: ScriptedModelServer
) -> None:
    from relaykit.messages import Message

    model = scripted_model(model_server)
    model_server.respond(model.name, wanders)
    agent = Agent(name="wanderer2", model=model, tools=[lookup], answer_after_tool_turns=1)
    async with serving(client, agent) as worker:
        first = await (await start_run(client, agent, "one", task_queue=worker.task_queue)).result()
        second = await (
            await start_run(
                client,
                agent,
                [*first.transcript, Message.user("two")],
                task_queue=worker.task_queue,
            )
        ).result()
    assert first.output == "answer from 1 lookups"
    assert second.output == "answer from 2 lookups"  # one new lookup, then the answer


def test_small_context_windows_get_a_default_policy_and_large_or_unknown_ones_do_not() -> None:
    local = parse_model("local:smollm2")
    assert local.context_window == LOCAL_CONTEXT_WINDOW
    policy = default_context_policy(local)
    assert policy is not None and policy.strategy == "keep_last"
    assert policy.max_input_tokens < LOCAL_CONTEXT_WINDOW
    assert default_context_policy(parse_model("openai:gpt-4.1-mini")) is None
    big = parse_model("openai:x").model_copy(update={"context_window": 200_000})
    assert default_context_policy(big) is None


async def test_a_run_on_a_small_window_model_drops_old_turns_instead_of_overflowing(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # 1000-token window: compaction at 600 input tokens; the model reports 700 from turn 1 on.
    # No summary model call is made (a small model would summarise slowly and badly).
    model = scripted_model(model_server, context_window=1000)
    keys = itertools.count()

    def respond(request: ScriptedRequest) -> Step:
        if request.index >= 6:
            return text("done")
        return dataclasses.replace(call("lookup", key=f"k{next(keys)}"), usage=(700, 5))

    model_server.respond(model.name, respond)
    agent = Agent(name="small_window", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "the task", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    compactions = [e for e in events if e.kind == "context_compacted"]
    assert compactions and all(e.data["strategy"] == "keep_last" for e in compactions)
    assert result.output == "done"
    assert (await scheduled_activities(handle.workflow)).count("relaykit.model_call") == 7
    last = model_server.requests(model.name)[-1]
    users = [m["content"] for m in last.messages if m["role"] == "user"]
    assert users[0] == "the task"  # the task is always kept
    assert "removed to fit the context window" in users[1]
    assert len([m for m in last.messages if m["role"] == "tool"]) <= 3


async def test_an_agents_own_context_policy_wins_over_the_default(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server, context_window=1000)
    model_server.script(
        model.name,
        [dataclasses.replace(call("lookup", key=f"k{i}"), usage=(700, 5)) for i in range(4)]
        + [text("done")],
    )
    agent = Agent(
        name="own_policy",
        model=model,
        tools=[lookup],
        context_policy=ContextPolicy(max_input_tokens=100_000),
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "the task", task_queue=worker.task_queue)
        await handle.result()
        events = await handle.events()
    assert not [e for e in events if e.kind == "context_compacted"]


def test_a_constrained_answer_cut_by_max_tokens_is_closed_into_the_value_it_began() -> None:
    from relaykit.models.openai import close_truncated_json

    cut = '{"name": "transfer_to_billing", "arguments": {"reason": "I was charged tw'
    assert close_truncated_json(cut) == cut + '"}}'
    assert close_truncated_json('{"reply": "Your refund') == '{"reply": "Your refund"}'
    assert close_truncated_json('{"name": "f", "arguments": {"a": 1, "b"') == (
        '{"name": "f", "arguments": {"a": 1}}'
    )
    assert close_truncated_json('{"cities": ["Paris", "To') == '{"cities": ["Paris", "To"]}'
    assert close_truncated_json('{"a": 1}') is None  # complete: nothing to do
    assert close_truncated_json("plain words") is None


async def test_a_small_model_cut_off_inside_its_tool_call_still_calls_the_tool(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The bundled model rambles inside a string argument until max_tokens; the call it was
    # writing still happens, and a cut reply still reads as a reply (not as raw JSON).
    model = scripted_model(model_server, tool_calls="constrained")
    model_server.script(
        model.name,
        [
            text('{"name": "lookup", "arguments": {"key": "abc and then on and on', truncated=True),
            text('{"reply": "It is the value of abc, and', truncated=True),
        ],
    )
    agent = Agent(name="cut_off", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "find abc", task_queue=worker.task_queue)
        result = await handle.result()
    assert (await scheduled_activities(handle.workflow)).count("lookup") == 1
    assert [m.content for m in result.transcript if m.role == "tool"] == [
        "value of abc and then on and on"
    ]
    assert result.output == "It is the value of abc, and"


def test_annotated_bounds_of_tool_parameters_reach_the_schema_and_are_enforced() -> None:
    # Bounds in the JSON schema let a constrained server stop a small model from writing a
    # 150-digit invoice number; models that ignore the schema get an error result to correct.
    import pytest

    from examples.triage import refund_status, service_status

    schema = refund_status.spec.parameters["properties"]["invoice_id"]
    assert schema["maxLength"] == 20
    assert service_status.spec.parameters["properties"]["service"]["enum"] == [
        "login",
        "api",
        "dashboard",
    ]
    with pytest.raises(ValueError, match="at most 20 characters"):
        refund_status.parse_arguments('{"invoice_id": "' + "1" * 150 + '"}')
