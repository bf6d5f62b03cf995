"""A provider's response never carries a key into durable history, a query, the CLI or a log.

The scripted server below behaves like a misconfigured proxy: it echoes the request's
credential header back, in a body that is not JSON, in a stream event that is not JSON, in a
401 and in a 500. Whatever relaykit builds from those responses must pass its one redaction.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from temporalio.client import Client

from relaykit import Agent, RunFailed, start_run
from relaykit.devserver import DevServer
from relaykit.models.providers import redact
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    error,
    raw,
    text,
)
from tests.support import history_events, scripted_model, serving

ROOT = Path(__file__).resolve().parent.parent
SECRET = "sk-test-redact-9f8e7d6c5b4a"


def _echo(req: ScriptedRequest) -> str:
    """What a proxy that dumps the request headers would print."""
    return "; ".join(f"{k}: {v}" for k, v in req.headers.items())


def _non_json_page(req: ScriptedRequest) -> Step:
    return raw(f"<html><body>Bad gateway. Request headers: {_echo(req)}</body></html>")


def _non_json_event(req: ScriptedRequest) -> Step:
    return raw(f"data: upstream said {_echo(req)}\n\n", content_type="text/event-stream")


def _unauthorised(req: ScriptedRequest) -> Step:
    return error(401, message=f"invalid key in {_echo(req)}")


def _html_500_then(answer: Callable[[ScriptedRequest], Step]) -> Callable[[ScriptedRequest], Step]:
    def respond(req: ScriptedRequest) -> Step:
        if req.index == 0:
            return raw(
                f"internal error while handling {_echo(req)}", status=500, content_type="text/plain"
            )
        return answer(req)

    return respond


async def _cli(server: DevServer, *args: str) -> str:
    env = {**os.environ, "NO_COLOR": "1", "COLUMNS": "200", "TEMPORAL_ADDRESS": server.address}
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relaykit.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), 60)
    return out.decode()


CASES = {
    "non-json body": ("openai", False, _non_json_page, "ModelCallFailed"),
    "non-json sse event": ("openai", True, _non_json_event, "ModelCallFailed"),
    "401 openai": ("openai", False, _unauthorised, "ModelHTTPError"),
    "401 anthropic": ("anthropic", False, _unauthorised, "ModelHTTPError"),
    "500 then non-json body": ("openai", False, _html_500_then(_non_json_page), "ModelCallFailed"),
}


@pytest.mark.parametrize("case", list(CASES))
async def test_a_key_echoed_by_the_provider_reaches_no_history_query_cli_or_log(
    client: Client,
    model_server: ScriptedModelServer,
    temporal_server: DevServer,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    case: str,
) -> None:
    provider, stream, responder, error_type = CASES[case]
    monkeypatch.setenv("RELAYKIT_REDACT_KEY", SECRET)
    model = scripted_model(model_server, provider, api_key_env="RELAYKIT_REDACT_KEY", stream=stream)
    model_server.respond(model.name, responder)
    agent = Agent(name=f"leaky_{case.replace(' ', '_').replace('-', '_')}", model=model)
    caplog.set_level(logging.DEBUG)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        with pytest.raises(RunFailed) as failure:
            await handle.result()
        events = await handle.events()
        # while a worker serves the queue: a query on a closed run is answered by a worker
        outputs = [await _cli(temporal_server, cmd, handle.id) for cmd in ("result", "events")]
    # The provider really saw (and echoed) the key: the test would catch a leak.
    sent = model_server.requests(model.name)[0].headers
    assert SECRET in (sent.get("authorization", "") + sent.get("x-api-key", ""))
    assert failure.value.type == error_type
    assert "[redacted]" in failure.value.message
    history = b"".join(e.SerializeToString() for e in await history_events(handle.workflow))
    assert SECRET.encode() not in history
    assert SECRET not in repr([e.model_dump() for e in events])
    assert SECRET not in caplog.text
    assert all(SECRET not in output for output in outputs)


async def test_a_retried_failure_that_echoed_the_key_leaves_no_trace_when_the_run_succeeds(
    client: Client, model_server: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The last failure of a retried activity is kept in its started event (``last_failure``).
    monkeypatch.setenv("RELAYKIT_REDACT_KEY", SECRET)
    model = scripted_model(model_server, api_key_env="RELAYKIT_REDACT_KEY")
    model_server.respond(model.name, _html_500_then(lambda req: text("fine")))
    agent = Agent(name="leaky_retry", model=model)
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "hi", task_queue=worker.task_queue)
        assert (await handle.result()).output == "fine"
    assert model_server.request_count(model.name) == 2
    history = b"".join(e.SerializeToString() for e in await history_events(handle.workflow))
    assert SECRET.encode() not in history
    assert b"[redacted]" in history


@pytest.mark.parametrize(
    "text_in, secrets",
    [
        ("Authorization: Bearer abcdefgh12345678", ()),
        ('{"api_key": "zzzzzzzzzzzz"}', ()),
        ("x-api-key=QWERTYUIOP123", ()),
        ("url?key=sk%2Fabc%2Bdef%3D123", ("sk/abc+def=123",)),
        ('{"echo": "sk-with-\\"quote\\"-inside"}', ('sk-with-"quote"-inside',)),
    ],
)
def test_redact_removes_known_keys_in_any_encoding_and_credential_shapes(
    text_in: str, secrets: tuple[str, ...]
) -> None:
    out = redact(text_in, secrets)
    assert "[redacted]" in out
    for secret in secrets:
        assert secret not in out
    assert not any(part in out for part in ("abcdefgh12345678", "zzzzzzzzzzzz", "QWERTYUIOP123"))
