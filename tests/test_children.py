"""Agent-as-tool child workflows and background subagents, on the real Temporal server."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, Budget, RunFailed, Subagents, start_run, tool
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    batch,
    call,
    text,
)
from tests.support import history_events, scripted_model, serving


@tool
def note(text: str) -> str:
    """Write a note."""
    return f"noted: {text}"


async def test_agent_as_tool_runs_a_child_workflow_that_sees_only_its_prompt(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The child gets the prompt the model wrote, not the parent's history; its output is the
    # tool result and its usage is added to the parent's.
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [text("five bullet points")])
    model_server.script(
        parent_model.name,
        [call("ask_summarizer", input="Summarise: durable runs"), text("Here it is.")],
    )
    summarizer = Agent(name="summarizer", instructions="Summarise.", model=child_model)
    manager = Agent(name="manager", model=parent_model, tools=[summarizer.as_tool()])
    async with serving(client, manager) as worker:
        handle = await start_run(
            client, manager, "secret parent context", task_queue=worker.task_queue
        )
        result = await handle.result()
    assert result.output == "Here it is."
    child_request = model_server.requests(child_model.name)[0]
    assert child_request.last_user_text == "Summarise: durable runs"
    assert "secret parent context" not in json.dumps(child_request.body)
    assert [m.content for m in result.transcript if m.role == "tool"] == ["five bullet points"]
    assert result.usage.requests == 3  # two parent calls + one child call
    child_started = [
        e
        for e in await history_events(handle.workflow)
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(child_started) == 1
    attrs = child_started[0].start_child_workflow_execution_initiated_event_attributes
    assert attrs.workflow_id.startswith(f"{handle.id}/")
    assert attrs.workflow_type.name == "AgentRun"


async def test_child_max_turns_exhaustion_is_an_error_result_for_the_parent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [call("note", text="x"), call("note", text="y")])
    model_server.script(parent_model.name, [call("ask_worker", input="go"), text("gave up")])
    worker_agent = Agent(name="worker", model=child_model, tools=[note])
    boss = Agent(name="boss", model=parent_model, tools=[worker_agent.as_tool(max_turns=2)])
    async with serving(client, boss) as worker:
        result = await (await start_run(client, boss, "go", task_queue=worker.task_queue)).result()
    assert result.output == "gave up"
    tool_result = next(m for m in result.transcript if m.role == "tool")
    assert tool_result.is_error and "max_turns=2" in tool_result.content
    assert result.usage.requests == 4  # the failed child's usage still counts


async def test_root_budget_caps_the_whole_tree(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Each response costs 15 tokens; the root allows 40, so the tree stops with a budget error.
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.respond(child_model.name, lambda req: call("note", text="more"))
    model_server.script(parent_model.name, [call("ask_worker", input="go"), text("never")])
    worker_agent = Agent(name="worker", model=child_model, tools=[note])
    boss = Agent(name="boss", model=parent_model, tools=[worker_agent.as_tool(max_turns=20)])
    async with serving(client, boss) as worker:
        handle = await start_run(
            client, boss, "go", task_queue=worker.task_queue, budget=Budget(max_total_tokens=40)
        )
        with pytest.raises(RunFailed) as failure:
            await handle.result()
    assert failure.value.type == "BudgetExceeded"
    assert model_server.request_count(child_model.name) == 2


async def test_cancelling_the_parent_cancels_its_running_child(
    client: Client, model_server: ScriptedModelServer
) -> None:
    hold = threading.Event()
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [text("late", hold=hold)])
    model_server.script(parent_model.name, [call("ask_slow", input="go")])
    slow = Agent(name="slow", model=child_model)
    boss = Agent(name="boss", model=parent_model, tools=[slow.as_tool()])
    try:
        async with serving(client, boss) as worker:
            handle = await start_run(client, boss, "go", task_queue=worker.task_queue)
            await asyncio.to_thread(model_server.wait_for_requests, child_model.name, 1)
            await handle.cancel()
            with pytest.raises(RunFailed) as failure:
                await handle.result()
            child = client.get_workflow_handle(await _first_child_id(handle))
            description = await child.describe()
    finally:
        hold.set()
    assert failure.value.type == "RunCancelled"
    assert description.status is not None and description.status.name == "CANCELED"


async def _first_child_id(handle: object) -> str:
    events = await handle.events()  # type: ignore[attr-defined]
    return next(e.data["workflow_id"] for e in events if e.kind == "tool_call")


# --- background subagents ---------------------------------------------------------------------


def _researcher_responder(gates: dict[str, threading.Event]) -> object:
    def respond(request: ScriptedRequest) -> Step:
        topic = request.last_user_text.split()[-1]
        gate = gates.get(topic)
        return text(f"report on {topic}", hold=gate)

    return respond


async def test_parent_spawns_three_subagents_keeps_working_and_gets_reports_at_turn_boundaries(
    client: Client, model_server: ScriptedModelServer
) -> None:
    gates = {topic: threading.Event() for topic in ("alpha", "beta", "gamma")}
    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)
    model_server.respond(researcher_model.name, _researcher_responder(gates))  # type: ignore[arg-type]
    researcher = Agent(name="researcher", model=researcher_model)
    lead = Agent(
        name="lead",
        model=lead_model,
        tools=[note],
        subagents=Subagents([researcher], max_concurrent=3),
    )
    seen_reports: list[list[str]] = []

    def lead_respond(request: ScriptedRequest) -> Step:
        reports = [
            m["content"]
            for m in request.messages
            if m["role"] == "user" and "Background task report" in str(m["content"])
        ]
        seen_reports.append(reports)
        n = request.index
        if n == 0:
            return batch(*(call("spawn_subagent", prompt=f"research {t}") for t in gates))
        if n == 1:
            gates["alpha"].set()
            return call("note", text="working while they run")
        if n in (2, 3) and len(reports) < 1:
            return call("note", text="still working")
        if n < 6 and len(reports) < 3:
            gates["beta"].set()
            gates["gamma"].set()
            return call("wait_subagents", timeout_seconds=30)
        return text("final: " + "; ".join(sorted(r.split(":")[-1].strip() for r in reports)))

    model_server.respond(lead_model.name, lead_respond)
    async with serving(client, lead) as worker:
        handle = await start_run(
            client, lead, "research three things", task_queue=worker.task_queue
        )
        result = await asyncio.wait_for(handle.result(), timeout=60)
    tool_results = [m for m in result.transcript if m.role == "tool"]
    assert [json.loads(m.content)["id"] for m in tool_results[:3]] == ["task-1", "task-2", "task-3"]
    # The reminder with task status travels with each request but is not in the transcript.
    assert "Background tasks:" in model_server.requests(lead_model.name)[1].last_user_text
    assert not any("Background tasks:" in m.content for m in result.transcript)
    # Every report reached the model exactly once: as a turn-boundary message or a wait result.
    delivered = " ".join(m.content for m in result.transcript if m.role in ("user", "tool"))
    for topic in gates:
        assert delivered.count(f"report on {topic}") == 1, topic
    assert result.usage.requests == model_server.request_count(lead_model.name) + 3


async def test_spawn_beyond_max_concurrent_is_refused(
    client: Client, model_server: ScriptedModelServer
) -> None:
    hold = threading.Event()
    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)
    model_server.respond(researcher_model.name, lambda req: text("done", hold=hold))
    model_server.script(
        lead_model.name,
        [
            batch(call("spawn_subagent", prompt="one"), call("spawn_subagent", prompt="two")),
            call("cancel_subagent", raw_arguments='{"id": "task-1"}'),
            text("ok"),
        ],
    )
    researcher = Agent(name="researcher", model=researcher_model)
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([researcher], max_concurrent=1))
    try:
        async with serving(client, lead) as worker:
            handle = await start_run(client, lead, "go", task_queue=worker.task_queue)
            result = await asyncio.wait_for(handle.result(), timeout=30)
    finally:
        hold.set()
    first, second, cancelled = [m for m in result.transcript if m.role == "tool"]
    assert not first.is_error
    assert second.is_error and "already running" in second.content
    assert cancelled.content == "Task task-1 cancelled."
    assert "report" not in " ".join(m.content for m in result.transcript if m.role == "user")


async def test_unfinished_subagents_are_cancelled_when_the_parent_ends(
    client: Client, model_server: ScriptedModelServer
) -> None:
    hold = threading.Event()
    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)
    model_server.respond(researcher_model.name, lambda req: text("done", hold=hold))
    model_server.script(lead_model.name, [call("spawn_subagent", prompt="long job"), text("bye")])
    researcher = Agent(name="researcher", model=researcher_model)
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([researcher]))
    try:
        async with serving(client, lead) as worker:
            handle = await start_run(client, lead, "go", task_queue=worker.task_queue)
            result = await asyncio.wait_for(handle.result(), timeout=30)
            child = client.get_workflow_handle(f"{handle.id}/task-1")
            description = await child.describe()
    finally:
        hold.set()
    assert result.output == "bye"
    assert description.status is not None and description.status.name == "CANCELED"


async def test_subagents_without_agents_clone_the_current_agent_without_spawning_tools(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)

    def respond(request: ScriptedRequest) -> Step:
        if "spawn_subagent" not in request.tool_names:
            return text("clone report")  # the clone has no spawning tools
        if request.index == 0:
            return call("spawn_subagent", prompt="do it")
        if "clone report" not in json.dumps(request.messages):  # as a wait result or a report
            return call("wait_subagents")
        return text("lead done")

    model_server.respond(model.name, respond)
    lead = Agent(name="solo", model=model, tools=[note], subagents=Subagents())
    async with serving(client, lead) as worker:
        result = await (await start_run(client, lead, "go", task_queue=worker.task_queue)).result()
    assert result.output == "lead done"
    clone_requests = [
        r for r in model_server.requests(model.name) if "spawn_subagent" not in r.tool_names
    ]
    assert clone_requests and clone_requests[0].tool_names == ["note"]


async def test_detached_subagent_outlives_its_parent_and_delivers_its_report(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The parent ends first; the detached child keeps running and POSTs its report.
    import http.server

    received: list[dict[str, object]] = []
    arrived = threading.Event()

    class Receiver(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # http.server's naming
            received.append(json.loads(self.rfile.read(int(self.headers["content-length"]))))
            self.send_response(204)
            self.end_headers()
            arrived.set()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Receiver)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    hold = threading.Event()
    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)
    model_server.respond(researcher_model.name, lambda req: text("late findings", hold=hold))
    model_server.script(
        lead_model.name, [call("spawn_subagent", prompt="dig"), text("parent done")]
    )
    researcher = Agent(name="researcher", model=researcher_model)
    url = f"http://127.0.0.1:{server.server_address[1]}/reports"
    lead = Agent(
        name="lead",
        model=lead_model,
        subagents=Subagents([researcher], detached=True, deliver_url=url),
    )
    try:
        async with serving(client, lead) as worker:
            handle = await start_run(client, lead, "go", task_queue=worker.task_queue)
            assert (await handle.result()).output == "parent done"
            child = client.get_workflow_handle(f"{handle.id}/task-1")
            assert (await child.describe()).status.name == "RUNNING"  # type: ignore[union-attr]
            hold.set()
            assert await asyncio.to_thread(arrived.wait, 20)
            await child.result()
    finally:
        hold.set()
        server.shutdown()
    assert received[0]["task_id"] == "task-1" and received[0]["status"] == "finished"
    assert received[0]["output"] == "late findings"


async def test_approval_inside_an_agent_tool_child_is_answered_through_the_parent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Eino's action scoping: the child's interrupt crosses the agent-tool boundary; the person
    # answers the run they started, and the answer reaches the child that owns the call.
    refunds: list[int] = []

    @tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund money."""
        refunds.append(amount)
        return f"refunded {amount}"

    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [call("refund", amount=30), text("refund done")])
    model_server.script(
        parent_model.name, [call("ask_billing", input="refund 30"), text("all set")]
    )
    billing = Agent(name="billing", model=child_model, tools=[refund])
    front = Agent(name="front", model=parent_model, tools=[billing.as_tool()])
    async with serving(client, front) as worker:
        handle = await start_run(client, front, "please refund", task_queue=worker.task_queue)
        for _ in range(100):
            pending = await handle.pending_approvals()
            if pending:
                break
            await asyncio.sleep(0.1)
        assert [p.tool for p in pending] == ["refund"]
        assert pending[0].workflow_id != handle.id and pending[0].workflow_id.startswith(handle.id)
        assert pending[0].run_path == ["front", "billing"]
        assert (await handle.state()).status == "waiting_approval"
        await handle.approve(pending[0].call_id)
        result = await handle.result()
        assert await handle.pending_approvals() == []
    assert refunds == [30]
    assert result.output == "all set"


async def test_subagent_approvals_are_rejected_unless_they_go_to_the_parent(
    client: Client, model_server: ScriptedModelServer
) -> None:
    @tool(needs_approval=True)
    def wire(amount: int) -> str:
        """Wire money."""
        return "wired"

    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)
    model_server.respond(
        researcher_model.name,
        lambda req: text(req.tool_results[-1]) if req.tool_results else call("wire", amount=5),
    )
    model_server.script(
        lead_model.name, [call("spawn_subagent", prompt="pay"), call("wait_subagents"), text("ok")]
    )
    researcher = Agent(name="payer", model=researcher_model, tools=[wire])
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([researcher]))
    async with serving(client, lead) as worker:
        result = await (await start_run(client, lead, "go", task_queue=worker.task_queue)).result()
    # The report arrives as a turn-boundary message or as the wait result, whichever is first.
    delivered = " ".join(m.content for m in result.transcript if m.role in ("user", "tool"))
    assert "unattended" in delivered


async def test_research_example_runs_subagents_and_an_agent_tool_end_to_end(
    client: Client, model_server: ScriptedModelServer
) -> None:
    from examples.research import research_lead, scripted_research_lead

    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_research_lead)
    async with serving(client, research_lead, default_model=model) as worker:
        handle = await start_run(
            client, research_lead, "Compare Temporal and Celery", task_queue=worker.task_queue
        )
        result = await asyncio.wait_for(handle.result(), timeout=60)
        kinds = [e.kind for e in await handle.events()]
    assert result.output.startswith("Comparison:")
    assert "replay it and continue" in result.output and "broker" in result.output
    assert kinds.count("subagent_started") == 2
    assert any(
        m.name == "ask_editor" and m.content.startswith("Edited:") for m in result.transcript
    )


async def test_send_to_subagent_steers_a_running_task(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The message enters the child's conversation at its next turn boundary.
    gate = threading.Event()
    researcher_model = scripted_model(model_server)
    lead_model = scripted_model(model_server)

    def research(request: ScriptedRequest) -> Step:
        if request.index == 0:
            return call("note", text="first", hold=gate)
        return text("saw: " + request.last_user_text)

    model_server.respond(researcher_model.name, research)
    researcher = Agent(name="researcher", model=researcher_model, tools=[note])
    lead = Agent(name="lead", model=lead_model, subagents=Subagents([researcher]))

    def lead_respond(request: ScriptedRequest) -> Step:
        if request.index == 0:
            return call("spawn_subagent", prompt="start")
        if request.index == 1:
            return call(
                "send_to_subagent", raw_arguments='{"id": "task-1", "message": "focus on B"}'
            )
        if request.index == 2:
            gate.set()
            return call("wait_subagents", timeout_seconds=30)
        return text("done")

    model_server.respond(lead_model.name, lead_respond)
    async with serving(client, lead) as worker:
        result = await asyncio.wait_for(
            (await start_run(client, lead, "go", task_queue=worker.task_queue)).result(), 30
        )
    delivered = " ".join(m.content for m in result.transcript if m.role in ("user", "tool"))
    assert "saw: focus on B" in delivered
