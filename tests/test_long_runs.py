"""Long runs: bounded history per turn, continue-as-new, context compaction, big outputs."""

from __future__ import annotations

import asyncio
import json
import shutil
import threading
from datetime import timedelta
from pathlib import Path

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit import Agent, ContextPolicy, Subagents, ToolContext, start_run, tool
from relaykit.messages import Message
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    batch,
    call,
    text,
)
from relaykit.transcripts import TranscriptNotFound, TranscriptStore
from tests.support import scripted_model, serving


@tool
def step(n: int) -> str:
    """Do one step of the job."""
    return f"step {n} done: " + "x" * 200


async def _runs_of(client: Client, workflow_id: str) -> list[str]:
    """Run ids of every workflow run of ``workflow_id``, oldest first."""
    runs = [w async for w in client.list_workflows(f"WorkflowId = '{workflow_id}'")]
    return [w.run_id for w in sorted(runs, key=lambda w: w.start_time)]


async def _bytes_per_model_turn(client: Client, workflow_id: str, run_id: str) -> list[int]:
    """History bytes from one model call's scheduling to the next one's, per turn of a run."""
    handle = client.get_workflow_handle(workflow_id, run_id=run_id)
    sizes: list[int] = []
    async for event in handle.fetch_history_events():
        scheduled = event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        if (
            scheduled
            and event.activity_task_scheduled_event_attributes.activity_type.name
            == "relaykit.model_call"
        ):
            sizes.append(0)
        if sizes:
            sizes[-1] += event.ByteSize()
    return sizes[:-1]  # the last turn has no successor to close it


async def test_transcript_store_rebuilds_prefixes_from_chained_nodes(tmp_path: Path) -> None:
    store = TranscriptStore(tmp_path)
    first = await store.save("run-1", None, [Message.user("task"), Message.assistant("a")])
    second = await store.save("run-1", first, [Message.user("more")])
    fresh = TranscriptStore(tmp_path)  # another worker sharing the directory
    assert [m.content for m in await fresh.load("run-1", second)] == ["task", "a", "more"]
    assert await store.save("run-1", None, [Message.user("task"), Message.assistant("a")]) == first
    try:
        await TranscriptStore(tmp_path / "elsewhere").load("run-1", second)
    except TranscriptNotFound:
        pass
    else:
        raise AssertionError("a store without the nodes must not find the prefix")


async def test_three_hundred_turns_across_continue_as_new_with_subagents_and_flat_history(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A 300-turn job with background researchers finishing across continue-as-new boundaries:
    # the answer is right, each report arrives once, and a turn's history bytes stay flat.
    turns = 300
    lead_model = scripted_model(model_server)
    researcher_model = scripted_model(model_server)
    progress = {"lead": 0}
    finish_at = {"alpha": 70, "beta": 160, "gamma": 240}  # lead turns when each may report

    def researcher(request: ScriptedRequest) -> Step:
        topic = request.last_user_text.split()[-1]
        if progress["lead"] >= finish_at.get(topic, 0):
            return text(f"findings on {topic}")
        return call("step", n=0, delay=0.05)

    def lead(request: ScriptedRequest) -> Step:
        progress["lead"] = n = request.index + 1
        if n == 1:
            return call("spawn_subagent", prompt="research alpha")
        if n in (2, 3):
            return call("spawn_subagent", prompt="research " + ("beta" if n == 2 else "gamma"))
        if n < turns:
            return call("step", n=n)
        reports = [
            m["content"] for m in request.messages if "Background task report" in str(m["content"])
        ]
        return text(f"done after {n} turns; reports seen in last run: {len(reports)}")

    model_server.respond(lead_model.name, lead)
    model_server.respond(researcher_model.name, researcher)
    worker_agent = Agent(name="researcher", model=researcher_model, tools=[step])
    boss = Agent(
        name="long_lead",
        model=lead_model,
        tools=[step],
        subagents=Subagents([worker_agent], max_turns=400),
    )
    async with serving(client, boss) as worker:
        handle = await start_run(
            client,
            boss,
            "a long job",
            task_queue=worker.task_queue,
            max_turns=turns + 5,
            continue_as_new_after_turns=60,
        )
        result = await handle.result()
    assert result.turns == turns
    assert result.output.startswith(f"done after {turns} turns")
    # Every report reached the lead exactly once, across continue-as-new boundaries: the last
    # request carries the whole transcript (rebuilt by the model worker from the store).
    final_request = model_server.requests(lead_model.name)[-1]
    reports = [
        str(m["content"])
        for m in final_request.messages
        if "Background task report" in str(m["content"])
    ]
    for task, topic in (("task-1", "alpha"), ("task-2", "beta"), ("task-3", "gamma")):
        assert (
            sum(f"[{task} · researcher] finished:\nfindings on {topic}" in r for r in reports) == 1
        )
    assert len(final_request.messages) > 2 * turns
    runs = await _runs_of(client, handle.id)
    assert len(runs) >= 5
    first = await _bytes_per_model_turn(client, handle.id, runs[0])
    last = await _bytes_per_model_turn(client, handle.id, runs[-1])
    turn_10, turn_300 = first[9], last[-1]
    assert turn_300 <= 1.5 * turn_10, (turn_10, turn_300)
    for run_id in runs:
        described = await client.get_workflow_handle(handle.id, run_id=run_id).describe()
        assert described.raw_description.workflow_execution_info.history_length < 2_000


async def test_a_worker_without_the_stored_prefix_falls_back_to_sending_it_all(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    model = scripted_model(model_server)
    gate = threading.Event()
    model_server.script(model.name, [call("step", n=1), call("step", n=2, hold=gate), text("ok")])
    agent = Agent(name="forgetful", model=model, tools=[step])
    store_dir = tmp_path / "store"
    async with serving(client, agent, transcript_dir=store_dir) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        await asyncio.to_thread(model_server.wait_for_requests, model.name, 2)
        shutil.rmtree(store_dir)  # as if the next call ran on a machine without the store
        worker.transcripts._cache.clear()
        gate.set()
        result = await handle.result()
    assert result.output == "ok"
    last = model_server.requests(model.name)[-1]
    assert [m["role"] for m in last.messages] == ["user", "assistant", "tool", "assistant", "tool"]


async def test_context_policy_summarises_old_turns_and_keeps_the_task(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each response reports 10 input tokens; past 30 the older turns are summarised.
    model = scripted_model(model_server)

    def respond(request: ScriptedRequest) -> Step:
        if "compress a conversation" in request.system:
            return text("SUMMARY: steps 1-3 done")
        if request.index < 6:
            return batch(call("step", n=request.index), usage=(10 * (request.index + 1), 5))
        return text("finished")

    model_server.respond(model.name, respond)
    agent = Agent(
        name="compacting",
        model=model,
        tools=[step],
        context_policy=ContextPolicy(max_input_tokens=30, keep_last_turns=2),
    )
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "the original task", task_queue=worker.task_queue)
        result = await handle.result()
        events = await handle.events()
    assert result.output == "finished"
    compacted = [e for e in events if e.kind == "context_compacted"]
    assert compacted and compacted[0].data["strategy"] == "summarize"
    after = [r for r in model_server.requests(model.name) if "compress" not in r.system][-1]
    assert after.messages[0]["content"] == "the original task"
    assert "SUMMARY: steps 1-3 done" in after.messages[1]["content"]
    assert sum(1 for m in after.messages if m["role"] == "assistant") <= 3


async def test_huge_tool_output_is_truncated_with_a_marker_not_a_failed_run(
    client: Client, model_server: ScriptedModelServer
) -> None:
    @tool
    def fetch_page() -> str:
        """A 5 MB page."""
        return "p" * 5_000_000

    model = scripted_model(model_server)
    model_server.script(model.name, [call("fetch_page"), text("read it")])
    agent = Agent(name="reader", model=model, tools=[fetch_page])
    async with serving(client, agent) as worker:
        result = await (
            await start_run(client, agent, "read", task_queue=worker.task_queue)
        ).result()
    tool_message = next(m for m in result.transcript if m.role == "tool")
    assert result.output == "read it"
    assert len(tool_message.content) < 200_000
    assert "output truncated by relaykit: 4900000 characters dropped" in tool_message.content


async def test_long_tool_resumes_from_its_heartbeat_progress_on_retry(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # A sync tool reports progress with heartbeats; the retry after a failure starts from there.
    attempts: list[tuple[int, int]] = []
    workflow_ids: list[str] = []

    @tool(
        heartbeat_timeout=5,
        retry=RetryPolicy(initial_interval=timedelta(milliseconds=100), maximum_attempts=3),
    )
    def crawl(pages: int, ctx: ToolContext) -> str:
        """Crawl some pages."""
        start = ctx.progress or 0
        attempts.append((ctx.attempt, start))
        workflow_ids.append(ctx.workflow_id)
        for page in range(start, pages):
            if ctx.attempt == 1 and page == 3:
                raise ApplicationError("the browser machine went away")
            ctx.heartbeat(page + 1)
        return f"crawled pages {start + 1}..{pages} on attempt {ctx.attempt}"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("crawl", pages=5), text("done")])
    agent = Agent(name="crawler", model=model, tools=[crawl])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "crawl", task_queue=worker.task_queue)
        result = await handle.result()
    assert attempts == [(1, 0), (2, 3)]
    assert workflow_ids == [handle.id, handle.id]  # from the activity's info
    assert [m.content for m in result.transcript if m.role == "tool"] == [
        "crawled pages 4..5 on attempt 2"
    ]


def test_turn_payloads_leave_out_default_fields_and_parse_back() -> None:
    message = Message.user("hi")
    assert message.model_dump_json() == '{"role":"user","content":"hi"}'
    assert Message.model_validate_json(message.model_dump_json()) == message


async def test_tool_schemas_travel_once_then_by_digest(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # After the first call the model activity's input refers to the system prompt and tool
    # schemas by digest; the model still receives them every turn.
    model = scripted_model(model_server)
    model_server.script(model.name, [call("step", n=1), call("step", n=2), text("done")])
    agent = Agent(name="digest_user", instructions="Be exact.", model=model, tools=[step])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        await handle.result()
    inputs = [
        json.loads(e.activity_task_scheduled_event_attributes.input.payloads[0].data)
        async for e in handle.workflow.fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == "relaykit.model_call"
    ]
    assert "tools" in inputs[0] and inputs[0]["store_static"] is True
    assert all("tools" not in i and "system" not in i for i in inputs[1:])
    assert {i["static_ref"] for i in inputs} == {inputs[0]["static_ref"]}
    for request in model_server.requests(model.name):
        assert request.tool_names == ["step"] and request.system == "Be exact."
