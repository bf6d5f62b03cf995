"""The turn loop against the real Temporal dev server and a scripted model over HTTP."""

from __future__ import annotations

import asyncio
import threading

import pytest
from pydantic import BaseModel
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit import Agent, Budget, RunFailed, get_run, start_run, tool
from relaykit.testing.scripted_server import ScriptedModelServer, batch, call, text
from tests.support import activity_summaries, scheduled_activities, scripted_model, serving


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First number.
        b: Second number.
    """
    return a + b


async def test_multi_turn_tool_loop_returns_final_answer_and_usage(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The model calls a tool, reads its result, calls again, then answers.
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=2, b=3), call("add", a=5, b=10), text("15")])
    agent = Agent(name="calc", instructions="Add numbers.", model=model, tools=[add])
    async with serving(client, agent) as worker:
        handle = await start_run(client, "calc", "2+3+10?", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "15"
    assert result.final_agent == "calc"
    assert result.turns == 3
    assert result.usage.requests == 3
    assert result.usage.input_tokens == 30 and result.usage.output_tokens == 15
    requests = model_server.requests(model.name)
    assert requests[0].system == "Add numbers."
    assert requests[0].tool_names == ["add"]
    assert requests[2].tool_results == ["5", "15"]
    assert [m.role for m in result.transcript] == [
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
        "assistant",
    ]


async def test_each_tool_is_its_own_activity_type_with_readable_summaries(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The history reads like the run: model calls and `add`, each with a summary.
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=1, b=2), text("3")])
    agent = Agent(name="summaries", model=model, tools=[add])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "1+2", task_queue=worker.task_queue)
        await handle.result()
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "add",
        "relaykit.model_call",
    ]
    summaries = await activity_summaries(handle.workflow, client)
    assert summaries == [
        f"summaries · turn 1 · {model.name}",
        "add(a=1, b=2)",
        f"summaries · turn 2 · {model.name}",
    ]
    description = await handle.workflow.describe()
    assert (await description.static_summary()) == "summaries: 1+2"


async def test_parallel_tool_calls_run_concurrently_and_results_keep_call_order(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Both calls must be in flight at once to pass the barrier; results come back in call order.
    barrier = threading.Barrier(2, timeout=10)

    @tool
    def meet(name: str) -> str:
        """Wait for the other call."""
        barrier.wait()
        return f"met {name}"

    model = scripted_model(model_server)
    model_server.script(
        model.name, [batch(call("meet", name="first"), call("meet", name="second")), text("ok")]
    )
    agent = Agent(name="parallel", model=model, tools=[meet])
    async with serving(client, agent) as worker:
        result = await (await start_run(client, agent, "go", task_queue=worker.task_queue)).result()
    tool_messages = [m for m in result.transcript if m.role == "tool"]
    assert [m.content for m in tool_messages] == ["met first", "met second"]
    assert not any(m.is_error for m in tool_messages)


class Answer(BaseModel):
    city: str
    temperature: float


async def test_output_type_validation_failure_is_sent_back_and_retried(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # An answer that does not match output_type gets a retry prompt; the next valid one wins.
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [text('{"city": "Paris"}'), text('```json\n{"city": "Paris", "temperature": 14}\n```')],
    )
    agent = Agent(name="structured", model=model, output_type=Answer)
    async with serving(client, agent) as worker:
        result = await (
            await start_run(client, agent, "weather", task_queue=worker.task_queue)
        ).result()
    assert result.output == {"city": "Paris", "temperature": 14.0}
    first, second = model_server.requests(model.name)
    assert first.body["response_format"]["json_schema"]["schema"]["required"] == [
        "city",
        "temperature",
    ]
    assert "temperature" in second.last_user_text and "schema" in second.last_user_text


async def test_output_validation_gives_up_after_bounded_retries(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # lovia's default: one repair request, then OutputValidationFailed (2 requests in all).
    model = scripted_model(model_server)
    model_server.script(model.name, [text("no"), text("still no"), text("never")])
    agent = Agent(name="stubborn", model=model, output_type=Answer)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "weather", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "OutputValidationFailed"
    assert model_server.request_count(model.name) == 2


async def test_non_object_output_type_is_wrapped_and_unwrapped(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text('{"result": ["a", "b"]}')])
    agent = Agent(name="lister", model=model, output_type=list[str])
    async with serving(client, agent) as worker:
        result = await (
            await start_run(client, agent, "list", task_queue=worker.task_queue)
        ).result()
    assert result.output == ["a", "b"]


async def test_max_turns_ends_the_run_with_a_typed_error(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=1, b=1)] * 3)
    agent = Agent(name="looper", model=model, tools=[add])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "loop", task_queue=worker.task_queue, max_turns=3)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "MaxTurnsExceeded"
    assert model_server.request_count(model.name) == 3


async def test_token_budget_stops_the_run(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each response costs 15 tokens; a 40-token budget is exceeded by the third call.
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=1, b=1)] * 5)
    agent = Agent(name="spender", model=model, tools=[add])
    async with serving(client, agent) as worker:
        handle = await start_run(
            client, agent, "go", task_queue=worker.task_queue, budget=Budget(max_total_tokens=40)
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "BudgetExceeded"
    assert model_server.request_count(model.name) == 3


async def test_tool_errors_are_results_the_model_sees(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Bad JSON, invalid arguments, an unknown tool and a raising tool: the run goes on.
    invocations: list[str] = []

    @tool
    def fragile(x: int) -> str:
        """Fails on purpose."""
        invocations.append("fragile")
        raise RuntimeError("disk on fire")

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            batch(
                call("add", raw_arguments="{not json"),
                call("add", a="two", b=1),
                call("teleport", to="mars"),
                call("fragile", x=1),
            ),
            text("recovered"),
        ],
    )
    agent = Agent(name="errors", model=model, tools=[add, fragile])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "recovered"
    results = [m for m in result.transcript if m.role == "tool"]
    assert all(m.is_error for m in results)
    assert "Invalid arguments for tool 'add'" in results[0].content
    assert "a: Input should be a valid integer" in results[1].content
    assert "Unknown tool 'teleport'" in results[2].content and "add, fragile" in results[2].content
    assert "RuntimeError: disk on fire" in results[3].content
    # Bad arguments and unknown tools never reach an activity; the raising tool ran once.
    assert await scheduled_activities(handle.workflow) == [
        "relaykit.model_call",
        "fragile",
        "relaykit.model_call",
    ]
    assert invocations == ["fragile"]
    sent_back = model_server.requests(model.name)[1].body["messages"]
    assert [m["content"].startswith("Error") for m in sent_back if m["role"] == "tool"] == [
        True
    ] * 4


async def test_application_error_in_a_tool_uses_temporal_retries(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # An infrastructure failure (ApplicationError) is retried by Temporal, not shown to the model.
    attempts: list[int] = []

    @tool(
        retry=RetryPolicy(
            initial_interval=__import__("datetime").timedelta(milliseconds=50), maximum_attempts=5
        )
    )
    def flaky() -> str:
        """Succeeds on the third attempt."""
        attempts.append(1)
        if len(attempts) < 3:
            raise ApplicationError("upstream unavailable")
        return "finally"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("flaky"), text("done")])
    agent = Agent(name="retrier", model=model, tools=[flaky])
    async with serving(client, agent) as worker:
        result = await (await start_run(client, agent, "go", task_queue=worker.task_queue)).result()
    assert len(attempts) == 3
    assert [m.content for m in result.transcript if m.role == "tool"] == ["finally"]


async def test_run_started_by_name_through_the_plain_temporal_client(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Any Temporal client can start a run with a JSON input and read a JSON result.
    model = scripted_model(model_server)
    model_server.script(model.name, [text("hello from a plain client")])
    agent = Agent(name="plain", model=model)
    async with serving(client, agent) as worker:
        result = await client.execute_workflow(
            "AgentRun",
            {"agent": "plain", "input": "hi", "max_turns": 5},
            id="plain-client-run",
            task_queue=worker.task_queue,
        )
    assert isinstance(result, dict)
    assert result["output"] == "hello from a plain client"
    assert result["usage"]["requests"] == 1


async def test_unknown_agent_fails_the_run_at_once_with_a_clear_error(
    client: Client, model_server: ScriptedModelServer
) -> None:
    agent = Agent(name="known", model=scripted_model(model_server))
    async with serving(client, agent) as worker:
        handle = await start_run(client, "unknown", "hi", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await asyncio.wait_for(handle.result(), timeout=10)
    assert failure.value.type == "UnknownAgent"
    assert "known" in failure.value.message


async def test_result_can_be_read_later_by_run_id(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text("later")])
    agent = Agent(name="later", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        await handle.result()
        again = get_run(client, handle.id)
        assert (await again.result()).output == "later"
        events = await again.events()  # a query on a closed run replays it on the worker
    assert [e.kind for e in events] == ["run_started", "model_call", "message", "final"]
    assert [e.seq for e in events] == [0, 1, 2, 3]


async def test_dynamic_instructions_read_the_run_context(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text("ok")])
    agent = Agent(
        name="dynamic",
        model=model,
        instructions=lambda ctx: f"You serve {ctx.context['customer']} at turn {ctx.turn}.",
    )
    async with serving(client, agent) as worker:
        await (
            await start_run(
                client,
                agent,
                "hi",
                task_queue=worker.task_queue,
                context={"customer": "ACME"},
                extra_instructions="Be brief.",
            )
        ).result()
    assert model_server.requests(model.name)[0].system == "You serve ACME at turn 1.\n\nBe brief."
