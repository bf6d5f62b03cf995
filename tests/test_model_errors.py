"""Model failures become Temporal retry decisions, the same way for every provider, through a
real run; and secrets never reach history."""

from __future__ import annotations

import pytest
from temporalio.client import Client

from relaykit import Agent, RunFailed, start_run, tool
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    call,
    context_overflow,
    disconnect,
    error,
    text,
)
from tests.support import history_events, scheduled_activities, scripted_model, serving


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_rate_limit_with_retry_after_is_retried_then_the_run_completes(
    client: Client, model_server: ScriptedModelServer, provider: str
) -> None:
    model = scripted_model(model_server, provider)
    model_server.script(
        model.name,
        [
            disconnect(),  # a connection error: the retry policy's first interval (1 s)
            error(429, headers={"retry-after-ms": "50"}),
            error(503, headers={"retry-after-ms": "50"}),
            text("made it"),
        ],
    )
    agent = Agent(name=f"patient_{provider}", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "made it"
    assert model_server.request_count(model.name) == 4
    # One model activity, retried inside Temporal: the history holds a single scheduled call.
    assert await scheduled_activities(handle.workflow) == ["relaykit.model_call"]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_authentication_error_fails_the_run_without_retrying(
    client: Client, model_server: ScriptedModelServer, provider: str
) -> None:
    model = scripted_model(model_server, provider)
    model_server.script(model.name, [error(401)])
    agent = Agent(name=f"unauthorised_{provider}", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "ModelHTTPError"
    assert "401" in failure.value.message
    assert model_server.request_count(model.name) == 1


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_context_window_overflow_is_not_retried(
    client: Client, model_server: ScriptedModelServer, provider: str
) -> None:
    model = scripted_model(model_server, provider)
    model_server.script(model.name, [context_overflow()])
    agent = Agent(name=f"overflowing_{provider}", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "ContextWindowExceeded"
    assert model_server.request_count(model.name) == 1


async def test_x_should_retry_false_overrides_a_retryable_status(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [error(503, headers={"x-should-retry": "false"})])
    agent = Agent(name="no_retry", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        with pytest.raises(RunFailed):
            await handle.result()
    assert model_server.request_count(model.name) == 1


async def test_anthropic_tool_loop_end_to_end(
    client: Client, model_server: ScriptedModelServer
) -> None:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        return {"a": "alpha"}.get(key, "?")

    model = scripted_model(model_server, "anthropic")
    model_server.script(model.name, [call("lookup", key="a"), text("a is alpha")])
    agent = Agent(name="claude_like", instructions="Look things up.", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        result = await (await start_run(client, agent, "a?", task_queue=worker.task_queue)).result()
    assert result.output == "a is alpha"
    second = model_server.requests(model.name)[1]
    assert second.api == "anthropic" and second.system == "Look things up."
    assert second.tool_results == ["alpha"]


async def test_streaming_model_call_gives_the_same_run(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server, stream=True)
    model_server.script(model.name, [call("lookup_len", word="durable"), text("seven letters")])

    @tool
    def lookup_len(word: str) -> int:
        """Length of a word."""
        return len(word)

    agent = Agent(name="streamer", model=model, tools=[lookup_len])
    async with serving(client, agent) as worker:
        result = await (
            await start_run(client, agent, "len?", task_queue=worker.task_queue)
        ).result()
    assert result.output == "seven letters"
    assert all(r.stream for r in model_server.requests(model.name))
    assert [m.content for m in result.transcript if m.role == "tool"] == ["7"]


async def test_api_key_is_sent_to_the_provider_but_never_stored_in_history(
    client: Client, model_server: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "sk-test-5up3r-s3cr3t-value"
    monkeypatch.setenv("RELAYKIT_TEST_KEY", secret)
    model = scripted_model(model_server, api_key_env="RELAYKIT_TEST_KEY")
    model_server.script(model.name, [error(429, headers={"retry-after-ms": "10"}), text("ok")])
    agent = Agent(name="keyed", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        await handle.result()
    assert model_server.requests(model.name)[0].headers["authorization"] == f"Bearer {secret}"
    history = b"".join(event.SerializeToString() for event in await history_events(handle.workflow))
    assert secret.encode() not in history
    assert b"RELAYKIT_TEST_KEY" in history  # only the variable's name travels
