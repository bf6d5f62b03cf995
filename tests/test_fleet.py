"""A fleet sharing its model providers: provider queues and their limits, on the real server."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import Agent, fork_run, start_run, tool
from relaykit.errors import ConfigurationError
from relaykit.models.queues import LIMITS_ENV, ModelLimit, limits_from_env, parse_limit
from relaykit.run_list import RunFilter, list_runs_page, model_wait
from relaykit.runs import MODEL_ACTIVITY
from relaykit.testing.scripted_server import ScriptedModelServer, call, error, text
from tests.support import history_events, scripted_model, serving


async def model_call_queues(handle: object) -> list[str]:
    """The task queue of every model call the run scheduled, from its history."""
    return [
        e.activity_task_scheduled_event_attributes.task_queue.name
        for e in await history_events(handle)  # type: ignore[arg-type]
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and e.activity_task_scheduled_event_attributes.activity_type.name == MODEL_ACTIVITY
    ]


async def test_model_calls_run_on_their_providers_queue_served_by_the_same_worker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    derived = scripted_model(model_server)
    named = scripted_model(model_server, task_queue=f"gpu-{uuid.uuid4().hex[:8]}")
    model_server.script(derived.name, [text("one")])
    model_server.script(named.name, [text("two")])
    first = Agent(name="first", model=derived)
    second = Agent(name="second", model=named)
    async with serving(client, [first, second]) as worker:
        one = await start_run(client, first, "hi", task_queue=worker.task_queue)
        two = await start_run(client, second, "hi", task_queue=worker.task_queue)
        assert (await one.result()).output == "one"
        assert (await two.result()).output == "two"
    assert await model_call_queues(one.workflow) == [f"{worker.task_queue}.model.openai"]
    assert await model_call_queues(two.workflow) == [named.task_queue]


async def test_a_model_on_the_workers_own_queue_is_served_there_and_refuses_limits(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The run queue's worker serves the calls (Temporal hands each one over with the workflow
    # task that scheduled it); limits there would hold every activity, so they are refused.
    queue = f"tq-{uuid.uuid4().hex[:10]}"
    model = scripted_model(model_server, task_queue=queue)
    model_server.script(model.name, [call("ping"), text("done")])

    @tool(effect="read")
    def ping() -> str:
        """Ping."""
        return "pong"

    agent = Agent(name="own_queue", model=model, tools=[ping])
    async with serving(client, agent, task_queue=queue) as worker:
        assert worker.task_queue == queue
        handle = await start_run(client, agent, "hi", task_queue=queue)
        assert (await handle.result()).output == "done"
    assert await model_call_queues(handle.workflow) == [queue, queue]
    for options in ({"model_limits": {queue: "2"}}, {"models_only": True}):
        with pytest.raises(ConfigurationError, match=f"own task queue '{queue}'"):
            async with serving(client, agent, task_queue=queue, **options):
                pass


async def test_a_worker_limit_of_two_never_has_more_than_two_requests_in_flight(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text(f"answer {i}", delay=0.4) for i in range(6)])
    agent = Agent(name="limited", model=model)
    async with serving(client, agent, model_limits={"openai": "2"}) as worker:
        handles = [
            await start_run(client, agent, f"q{i}", task_queue=worker.task_queue) for i in range(6)
        ]
        results = await asyncio.gather(*(h.result() for h in handles))
    assert sorted(r.output for r in results) == [f"answer {i}" for i in range(6)]
    assert model_server.peak_in_flight(model.name) == 2


WORKER_COMMAND = (sys.executable, "-m", "relaykit.cli", "worker", "tests.fleet_agents")


def _worker_process(
    address: str, server: ScriptedModelServer, model: str, queue: str, tmp: Path, *args: str
) -> subprocess.Popen[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(
        TEMPORAL_ADDRESS=address,
        TEMPORAL_NAMESPACE="default",
        FLEET_MODEL_URL=server.base_url,
        FLEET_MODEL_NAME=model,
        RELAYKIT_STORE=(tmp / "store").as_uri(),  # shared: model calls read transcripts by ref
        RELAYKIT_MODEL_LIMITS="openai=2/s",
        PYTHONUNBUFFERED="1",
    )
    log = open(tmp / f"worker-{uuid.uuid4().hex[:6]}.log", "wb")  # noqa: SIM115
    return subprocess.Popen(
        [*WORKER_COMMAND, "--task-queue", queue, *args],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )


async def test_a_cluster_rate_limit_holds_across_two_worker_processes(
    client: Client, model_server: ScriptedModelServer, temporal_server: Any, tmp_path: Path
) -> None:
    # Two processes poll the provider queue (one of them a dedicated model worker): each could
    # send every call at once, but the server dispatches 2 a second across both.
    model = f"fleet-{uuid.uuid4().hex[:10]}"
    queue = f"fleet-{uuid.uuid4().hex[:10]}"
    model_server.script(model, [text(f"answer {i}") for i in range(8)])
    args = (temporal_server.address, model_server, model, queue, tmp_path)
    procs = [_worker_process(*args), _worker_process(*args, "--models-only")]
    try:
        handles = [
            await start_run(client, "fleet_agent", f"q{i}", task_queue=queue) for i in range(8)
        ]
        results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), timeout=90)
    finally:
        for proc in procs:
            proc.kill()
            proc.wait(timeout=10)
    assert sorted(r.output for r in results) == [f"answer {i}" for i in range(8)]
    arrivals = sorted(r.at for r in model_server.requests(model))
    assert len(arrivals) == 8
    # 8 calls at 2 a second take seconds, even after the server's rate limiter lets its burst
    # (a few calls) through at once; unlimited, they all arrive within a fraction of one
    assert arrivals[-1] - arrivals[0] >= 1.5, arrivals
    assert await model_call_queues(handles[0].workflow) == [f"{queue}.model.openai"]


@tool
def lookup(term: str) -> str:
    """Look a term up.

    Args:
        term: What to look up.
    """
    return f"{term}: found"


def _priorities(events: list[Any]) -> dict[str, list[tuple[int, str, float]]]:
    """The priority each workflow start, activity and child start in a history carries."""
    seen: dict[str, list[tuple[int, str, float]]] = {}
    for e in events:
        for field in (
            "workflow_execution_started_event_attributes",
            "activity_task_scheduled_event_attributes",
            "start_child_workflow_execution_initiated_event_attributes",
        ):
            if e.HasField(field):
                attrs = getattr(e, field)
                name = (
                    attrs.activity_type.name
                    if field.startswith("activity")
                    else field.split("_event")[0]
                )
                p = attrs.priority
                seen.setdefault(name, []).append(
                    (p.priority_key, p.fairness_key, round(p.fairness_weight, 3))
                )
    return seen


async def test_priority_and_tenant_reach_children_model_calls_and_tools(
    client: Client, model_server: ScriptedModelServer
) -> None:
    child_model = scripted_model(model_server)
    parent_model = scripted_model(model_server)
    model_server.script(child_model.name, [call("lookup", term="b"), text("child done")])
    model_server.script(
        parent_model.name,
        [call("lookup", term="a"), call("ask_helper", input="go"), text("all done")],
    )
    helper = Agent(name="helper", model=child_model, tools=[lookup])
    lead = Agent(name="lead", model=parent_model, tools=[lookup, helper.as_tool()])
    async with serving(client, lead) as worker:
        handle = await start_run(
            client,
            lead,
            "go",
            task_queue=worker.task_queue,
            priority=2,
            tenant="acme",
            tenant_weight=2.0,
        )
        assert (await handle.result()).output == "all done"
    parent = _priorities(await history_events(handle.workflow))
    child_id = next(
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in await history_events(handle.workflow)
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    )
    child = _priorities(await history_events(client.get_workflow_handle(child_id)))
    mine = (2, "acme", 2.0)
    assert parent["workflow_execution_started"] == [mine]
    assert parent[MODEL_ACTIVITY] == [mine] * 3
    assert parent["lookup"] == [mine]
    # the child run starts with the parent's (Temporal's inheritance, shown on its start)
    assert child["workflow_execution_started"] == [mine]
    assert child[MODEL_ACTIVITY] == [mine] * 2
    assert child["lookup"] == [mine]
    assert (await handle.workflow.describe()).search_attributes.get("RelayTenant") == ["acme"]


async def test_priority_and_tenant_carry_across_continue_as_new_and_forks(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("lookup", term="a"), call("lookup", term="b"), text("done"), text("forked")],
    )
    agent = Agent(name="long", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        handle = await start_run(
            client,
            agent,
            "go",
            task_queue=worker.task_queue,
            continue_as_new_after_turns=1,
            priority=4,
            tenant="globex",
        )
        assert (await handle.result()).output == "done"
        latest = client.get_workflow_handle(handle.id)  # the last run of the chain
        events = await history_events(latest)
        started = events[0].workflow_execution_started_event_attributes
        assert started.continued_execution_run_id  # a continue-as-new happened
        assert _priorities(events)["workflow_execution_started"] == [(4, "globex", 0.0)]
        fork = await fork_run(client, handle.id, 1)
        assert (await fork.result()).output == "forked"
    forked = _priorities(await history_events(fork.workflow))
    assert forked["workflow_execution_started"] == [(4, "globex", 0.0)]
    page = await list_runs_page(client, RunFilter(tenant="globex"), page_size=10)
    assert {handle.id, fork.id} <= {row.run_id for row in page.rows}
    assert {row.tenant for row in page.rows} == {"globex"}


async def test_a_429_with_retry_after_holds_every_call_of_that_provider_on_the_worker(
    client: Client, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    slow_down = error(429, headers={"retry-after": "2"}, message="slow down")
    model_server.script(model.name, [slow_down, *(text(f"answer {i}") for i in range(4))])
    agent = Agent(name="busy", model=model)
    async with serving(client, agent) as worker:
        first = await start_run(client, agent, "q0", task_queue=worker.task_queue)
        [refused] = await asyncio.to_thread(model_server.wait_for_requests, model.name, 1)
        others = [
            await start_run(client, agent, f"q{i}", task_queue=worker.task_queue)
            for i in range(1, 4)
        ]
        reason = await _waiting_reason(client, others[0])
        results = await asyncio.gather(*(h.result() for h in [first, *others]))
    assert sorted(r.output for r in results) == [f"answer {i}" for i in range(4)]
    requests = model_server.requests(model.name)
    assert len(requests) == 5  # the refused call, then each call once
    assert all(r.at - refused.at >= 1.9 for r in requests[1:]), [
        r.at - refused.at for r in requests
    ]
    assert reason is not None and reason.startswith("rate limited by openai until "), reason


async def _waiting_reason(client: Client, handle: Any) -> str | None:
    """The reason the status line of ``relaykit run --wait`` gives for a model call not yet
    sent (read from the pending call's heartbeat details), once there is one."""
    for _ in range(40):
        reason = await model_wait(client, await handle.workflow.describe())
        if reason:
            return reason
        await asyncio.sleep(0.05)
    return None


async def test_a_priority_or_tenant_temporal_would_refuse_is_a_clear_error_at_start(
    client: Client,
) -> None:
    for bad in ({"priority": 0}, {"priority": 6}, {"tenant": "x" * 65}, {"tenant_weight": 0}):
        with pytest.raises(ConfigurationError):
            await start_run(client, "nobody", "hi", task_queue="unused", **bad)  # type: ignore[arg-type]


def test_model_limits_read_from_flags_and_environment() -> None:
    assert parse_limit("openai=8,20/s") == ("openai", ModelLimit(8, 20.0))
    assert parse_limit("relaykit.model.anthropic=3.5/s") == (
        "relaykit.model.anthropic",
        ModelLimit(None, 3.5),
    )
    assert limits_from_env({LIMITS_ENV: "openai=8;anthropic=2,1/s"}) == {
        "openai": ModelLimit(8, None),
        "anthropic": ModelLimit(2, 1.0),
    }
    for bad in ("openai", "openai=", "openai=0", "openai=1,2", "openai=fast", "openai=inf/s"):
        with pytest.raises(ConfigurationError):
            parse_limit(bad)


async def test_a_run_recorded_before_provider_queues_keeps_its_queue_across_continue_as_new(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The state a continue-as-new carries from a run recorded before provider queues: its
    # choices say no, so its next workflow run sends model calls to the run's queue as before.
    from relaykit.runs import AGENT_RUN_WORKFLOW, RunInput, RunResult, RunSetup, RunState
    from relaykit.workflows.run_setup import NEW_RUN_CHOICES

    model = scripted_model(model_server)
    model_server.script(model.name, [text("as before")])
    agent = Agent(name="veteran", model=model)
    setup = RunSetup(**dict.fromkeys(NEW_RUN_CHOICES, True))
    assert setup.provider_queues is False
    async with serving(client, agent) as worker:
        handle = await client.start_workflow(
            AGENT_RUN_WORKFLOW,
            RunInput(agent="veteran", input="hi", state=RunState(agent="veteran", setup=setup)),
            id=f"veteran-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
            result_type=RunResult,
        )
        assert (await handle.result()).output == "as before"
    assert await model_call_queues(handle) == [worker.task_queue]
