"""A recorded run with an agent tool and background subagents, for ``tests/test_subagent_replay.py``.

``subagents_v0.json`` was recorded with the workflow code from *before* the subagent changes
guarded by ``workflow.patched`` in ``relaykit/workflows/children.py`` (agent-tool children named
after the call id, ``wait_subagents`` turning ``timeout_seconds: 0`` into a 60 s timer). Replaying
it through today's code proves that runs in flight at that deploy keep going. Re-recording it
with today's code would record the patched behaviour instead, so keep the file as it is; record
further scenarios into new files::

    python -m tests.histories.subagents NAME.json
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from relaykit import Agent, ModelSpec, Subagents
from relaykit.graph import AgentGraph
from relaykit.testing.scripted_server import ScriptedRequest, Step, batch, call, text

MODEL_NAME = "replay-model"
TASK_QUEUE = "replay-subagents"
WORKFLOW_ID = "replay-subagents"
PROMPT = "Research alpha and summarise it."
HISTORY = "subagents_v0.json"

summarizer = Agent(name="summarizer", instructions="Summarise.")
researcher = Agent(name="researcher", instructions="Research.")
lead = Agent(
    name="lead",
    instructions="Delegate.",
    tools=[summarizer.as_tool()],
    subagents=Subagents([researcher]),
)


def respond(request: ScriptedRequest) -> Step:
    """The model of all three agents (the lead alone has spawn_subagent)."""
    if "spawn_subagent" not in request.tool_names:
        # the researcher takes a while, so the lead's wait really waits for its report
        slow = request.system.startswith("Research")
        return text(f"{request.system.split('.')[0]}: done", delay=2.0 if slow else 0.0)
    results = len(request.tool_results)
    if results == 0:
        return batch(
            call("spawn_subagent", id="call_spawn", prompt="research alpha"),
            call("ask_summarizer", id="call_summary", input="sum up alpha"),
        )
    if results == 2:
        return call("wait_subagents", id="call_wait", timeout_seconds=0)
    return text("All done.")


def model(base_url: str | None = None) -> ModelSpec:
    return ModelSpec(provider="openai", name=MODEL_NAME, base_url=base_url)


def graph(base_url: str | None = None) -> AgentGraph:
    built = AgentGraph.build([lead], default_model=model(base_url))
    built.search_attributes = False
    return built


async def record(name: str) -> None:
    from temporalio.client import Client
    from temporalio.contrib.pydantic import pydantic_data_converter

    from relaykit import Worker, start_run
    from relaykit.devserver import DevServer
    from relaykit.testing.scripted_server import ScriptedModelServer

    with ScriptedModelServer() as model_server:
        model_server.respond(MODEL_NAME, respond)
        async with DevServer(port=0, headless=True, in_memory=True) as server:
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, identity="relaykit-histories"
            )
            async with Worker(
                client, lead, task_queue=TASK_QUEUE, search_attributes=False,
                default_model=model(f"{model_server.base_url}/v1"), identity="relaykit-histories",
            ):
                handle = await start_run(client, lead, PROMPT, task_queue=TASK_QUEUE, id=WORKFLOW_ID)
                result = await handle.result()
                history = await handle.workflow.fetch_history()
    path = Path(__file__).resolve().parent / name
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    print(f"{path.name}: {len(history.events)} events, output {result.output!r}")


if __name__ == "__main__":
    asyncio.run(record(sys.argv[1] if len(sys.argv) > 1 else HISTORY))
