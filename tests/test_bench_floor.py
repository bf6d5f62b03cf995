"""The benchmark's HTTP floor (``python -m bench --floor-http``) makes the call relaykit makes.

The reference is only worth its figures if the floor's request is the one relaykit's model
activity sends for the same turn, and if the benchmark's model answers it as it answers a run.
"""

from __future__ import annotations

import asyncio

from bench.agents import MODEL_NAME, build_agents, lookup
from bench.floor import _OPEN_ENDED, SYSTEM, _http_model, http_body
from bench.model_server import filler, make_responder
from relaykit.messages import Message, ToolCall
from relaykit.models.openai import build_request
from relaykit.models.spec import ModelRequest, ModelSpec
from relaykit.testing.scripted_server import ScriptedModelServer


def relaykit_body(turn: int, pad: str) -> dict[str, object]:
    messages = [Message.user(_OPEN_ENDED)]
    for done in range(1, turn):
        call = ToolCall(id=f"call_{done}", name="lookup", arguments=f'{{"q": "t{done}"}}')
        messages += [Message.assistant(pad, [call]), Message.tool_result(call, f"found t{done}")]
    spec = ModelSpec(provider="openai", name=MODEL_NAME, base_url="http://127.0.0.1:1/v1")
    request = ModelRequest(model=spec, system=SYSTEM, messages=messages, tools=[lookup.spec])
    return build_request(request)


def test_the_floor_sends_the_body_relaykit_sends_for_the_same_turn() -> None:
    pad = filler(100)
    assert SYSTEM == build_agents("http://127.0.0.1:1")[0].instructions
    for turn in (1, 4):
        assert http_body(turn, pad) == relaykit_body(turn, pad)


def test_the_benchmark_model_answers_the_floor_with_a_tool_call_at_every_turn() -> None:
    responder = make_responder(0.0, 100)
    with ScriptedModelServer(fallback=responder) as server:
        call = _http_model(server.base_url, 100)
        assert asyncio.run(call(3)) == "ok"
        (request,) = server.requests()
    assert request.tool_results == ["found t1", "found t2"]
    answer = responder(request)
    assert [c.name for c in answer.calls] == ["lookup"] and answer.text == filler(100)
