"""The bare-Temporal floor: hand-written minimal workflows that schedule the same activities as
the relaykit runs they are compared with, with tiny payloads (an int in, a short string out).

- :class:`FloorRun` (``turns=K``): ``K`` x (model activity, tool activity), then one final model
  activity, exactly the activity sequence of a relaykit run of ``K`` tool-calling turns.
- :class:`FloorFanout`: a model activity, ``N`` child :class:`FloorRun` of one turn started at
  once, a final model activity.
- :class:`FloorBackground`: a model activity, ``N`` child :class:`FloorRun` of one turn started
  without waiting, a second model activity, a wait for the children, a final model activity
  (relaykit's ``spawn_subagent`` turn, ``wait_subagents`` turn and answer).
- :class:`FloorApproval`: a model activity, a wait for the ``approve`` signal, the tool activity,
  a final model activity. Its argument adds one kind of command before the wait
  (:data:`APPROVAL_EXTRAS`), for ``python -m bench.parked_memory --floor-extra``: what Core keeps
  per command of a cached run.

The model activity sleeps for the configured model latency; nothing here talks HTTP. That is the
floor every target compares with. With ``model_url`` (``python -m bench --floor-http``), the model
activity instead makes the HTTP call relaykit's makes, to the same scripted model server: a chat
completions request with the same system prompt, tool schema and transcript (the turn's earlier
calls and results, each answer carrying the same filler text), parsed and thrown away. That
floor is a reference (what a bare-Temporal agent pays for its model call), not the targets'
floor. The waiting workflow sets the ``RelayStatus`` search attribute (one upsert), as relaykit
runs do, so that the benchmark can count parked workflows the same way for both systems.
"""

from __future__ import annotations

import asyncio
import json
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey

FLOOR_MODEL = "floor_model"
FLOOR_TOOL = "floor_tool"
_TIMEOUT = timedelta(minutes=5)
_STATUS = SearchAttributeKey.for_keyword("RelayStatus")
APPROVAL_EXTRAS = ("marker", "local-activity", "summary")
"""What :class:`FloorApproval` can add before its wait: a ``workflow.patched`` marker (with
Temporal's ``TemporalChangeVersion`` upsert) and one upsert of its own; a local activity; a
4,000-character summary on its model activity."""


@workflow.defn(name="FloorRun")
class FloorRun:
    @workflow.run
    async def run(self, turns: int) -> str:
        for turn in range(1, turns + 1):
            await workflow.execute_activity(FLOOR_MODEL, turn, start_to_close_timeout=_TIMEOUT)
            await workflow.execute_activity(FLOOR_TOOL, turn, start_to_close_timeout=_TIMEOUT)
        return await workflow.execute_activity(
            FLOOR_MODEL, turns + 1, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="FloorFanout")
class FloorFanout:
    @workflow.run
    async def run(self, children: int) -> str:
        await workflow.execute_activity(FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT)
        parent = workflow.info().workflow_id
        await asyncio.gather(
            *(
                workflow.execute_child_workflow(FloorRun.run, 1, id=f"{parent}/{index}")
                for index in range(children)
            )
        )
        return await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)


@workflow.defn(name="FloorBackground")
class FloorBackground:
    @workflow.run
    async def run(self, children: int) -> str:
        await workflow.execute_activity(FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT)
        parent = workflow.info().workflow_id
        handles = await asyncio.gather(
            *(
                workflow.start_child_workflow(FloorRun.run, 1, id=f"{parent}/task-{index}")
                for index in range(children)
            )
        )
        await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)
        await asyncio.gather(*handles)
        return await workflow.execute_activity(FLOOR_MODEL, 2, start_to_close_timeout=_TIMEOUT)


@workflow.defn(name="FloorApproval")
class FloorApproval:
    def __init__(self) -> None:
        self.approved = False

    @workflow.run
    async def run(self, extra: str = "") -> str:
        if extra == "marker":
            workflow.patched("bench.floor-extra")
            workflow.upsert_search_attributes([_STATUS.value_set("starting")])
        summary = "x" * 4000 if extra == "summary" else None
        await workflow.execute_activity(
            FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT, summary=summary
        )
        if extra == "local-activity":
            await workflow.execute_local_activity(FLOOR_TOOL, 0, start_to_close_timeout=_TIMEOUT)
        workflow.upsert_search_attributes([_STATUS.value_set("waiting_approval")])
        await workflow.wait_condition(lambda: self.approved)
        await workflow.execute_activity(FLOOR_TOOL, 1, start_to_close_timeout=_TIMEOUT)
        return await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)

    @workflow.signal
    def approve(self) -> None:
        self.approved = True


FLOOR_WORKFLOWS: list[type] = [FloorRun, FloorFanout, FloorBackground, FloorApproval]


def floor_activities(
    latency_s: float, model_url: str | None = None, response_bytes: int = 100
) -> list[Any]:
    http_model = _http_model(model_url, response_bytes) if model_url else None

    @activity.defn(name=FLOOR_MODEL)
    async def model(turn: int) -> str:
        if http_model is not None:  # the server waits for the latency itself
            return await http_model(turn)
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        return "ok"

    @activity.defn(name=FLOOR_TOOL)
    async def tool(turn: int) -> str:
        return "ok"

    return [model, tool]


SYSTEM = "You are a benchmark agent. Follow the task in the first message."
_LOOKUP_SCHEMA = {
    "type": "function",
    "function": {
        "name": "lookup",
        "description": "Look something up.",
        "parameters": {
            "additionalProperties": False,
            "properties": {
                "q": {"description": "What to look up.", "title": "Q", "type": "string"}
            },
            "required": ["q"],
            "type": "object",
        },
    },
}
_OPEN_ENDED = "turns=1000000"
"""The task the HTTP floor sends: the scripted model answers every turn with a ``lookup`` call
and the filler text, as it answers a relaykit run's tool turns."""


def http_body(turn: int, pad: str) -> dict[str, Any]:
    """The HTTP floor's request at ``turn``: the body relaykit's model activity sends for a
    ``lookup`` run at that turn (``tests/test_bench_floor.py`` holds the two alike)."""
    messages: list[dict[str, Any]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": _OPEN_ENDED},
    ]
    for done in range(1, turn):
        call_id = f"call_{done}"
        function = {"name": "lookup", "arguments": json.dumps({"q": f"t{done}"})}
        call = {"id": call_id, "type": "function", "function": function}
        messages.append({"role": "assistant", "content": pad, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": call_id, "content": f"found t{done}"})
    return {"model": "bench", "messages": messages, "tools": [_LOOKUP_SCHEMA]}


_JSON_CONTENT = {"content-type": "application/json"}


def _http_model(model_url: str, response_bytes: int) -> Any:
    """The HTTP floor's model call: one shared connection pool per worker, relaykit's own
    model client (what relaykit's HTTP costs is then the same on both sides)."""
    import ssl

    import httpx
    import pydantic_core

    from bench.model_server import filler
    from relaykit.models.http_transport import model_http_client

    http = model_http_client(
        timeout=httpx.Timeout(120.0, connect=10.0),
        max_connections=200,
        verify=ssl.create_default_context(),
    )
    url = f"{model_url.rstrip('/')}/v1/chat/completions"
    pad = filler(response_bytes)

    async def call(turn: int) -> str:
        body = pydantic_core.to_json(http_body(turn, pad))  # encoded as relaykit encodes it
        response = await http.post(url, content=body, headers=_JSON_CONTENT)
        response.raise_for_status()
        json.loads(response.content)
        return "ok"

    return call
