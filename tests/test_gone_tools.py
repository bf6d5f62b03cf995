"""A worker asked to run a tool its code does not define (a run's call scheduled before a
deploy renamed or removed it) answers at once, instead of failing the attempt as not registered
until the call's retry policy gives up. The deploy matrix shows it end to end
(``tests/test_deploy_matrix.py``); these pin the answers for each kind of input.

Only relaykit's own runs get that answer: another application's activity on relaykit's task
queue is left to that application's workers (a real dev server, a plain Temporal workflow)."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import sys
import time
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from temporalio import activity, workflow
from temporalio.client import Client, WorkflowHandle
from temporalio.common import RawValue, RetryPolicy
from temporalio.converter import default
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment
from temporalio.worker import UnsandboxedWorkflowRunner
from temporalio.worker import Worker as TemporalWorker

from relaykit import Agent, MCPServer, ModelSpec
from relaykit.activities.gone_tools import answer_gone
from relaykit.runs import AGENT_RUN_WORKFLOW
from relaykit.tools import ATTEMPT_CLAIM_KEY, ToolInvocation
from tests.support import serving


def environment(kind: str, heartbeat: tuple[object, ...] = ()) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(
        env.info,
        activity_type=kind,
        heartbeat_details=list(heartbeat),
        workflow_type=AGENT_RUN_WORKFLOW,  # a relaykit run scheduled the call
    )
    return env


def sent(**fields: object) -> list[RawValue]:
    invocation = ToolInvocation(call_id="c1", arguments="{}", **fields)  # type: ignore[arg-type]
    return [RawValue(default().payload_converter.to_payload(invocation.model_dump(mode="json")))]


async def test_a_call_of_a_gone_tool_is_an_error_result_saying_it_did_not_run() -> None:
    outcome = await environment("lookup").run(answer_gone, "lookup", sent(effect="read"))
    assert outcome["is_error"] is True
    assert outcome["content"].startswith("Tool 'lookup' is not defined by the code this worker")
    assert "was not run" in outcome["content"]


async def test_a_lost_write_of_a_gone_tool_keeps_its_unknown_outcome() -> None:
    started = {
        ATTEMPT_CLAIM_KEY: {
            "attempt": 1,
            "started_at": datetime.now(UTC).isoformat(),
            "state": "started",
        }
    }
    env = environment("refund", (started,))
    with pytest.raises(ApplicationError) as raised:
        await env.run(answer_gone, "refund", sent(effect="write"))
    assert raised.value.type == "ToolOutcomeUnknown"


@pytest.mark.parametrize("kind", ["relaykit.model_call", "mcp:docs/search"])
async def test_relaykit_and_mcp_activity_types_still_fail_as_not_registered(kind: str) -> None:
    with pytest.raises(ApplicationError) as raised:
        await environment(kind).run(answer_gone, kind, sent())
    assert raised.value.type == "NotFoundError" and raised.value.non_retryable


async def test_an_activity_another_workflow_type_scheduled_fails_as_not_registered_retryably() -> (
    None
):
    env = environment("other_app_activity")
    env.info = dataclasses.replace(env.info, workflow_type="OtherAppOrder")
    with pytest.raises(ApplicationError) as raised:
        await env.run(answer_gone, "other_app_activity", sent(effect="read"))
    assert raised.value.type == "NotFoundError" and not raised.value.non_retryable
    assert "not registered on this worker" in raised.value.message


# --- another application on relaykit's task queue (real dev server) -------------------------------

OTHER_APP_RUNS: list[str] = []


@activity.defn(name="other_app_activity")
async def other_app_activity(order: str) -> str:
    OTHER_APP_RUNS.append(order)
    return f"other app shipped {order}"


@workflow.defn(name="OtherAppOrder")
class OtherAppOrder:
    """Another application's workflow: its activity runs on relaykit's task queue."""

    @workflow.run
    async def run(self, queue: str, order: str) -> Any:
        return await workflow.execute_activity(
            "other_app_activity",
            order,
            task_queue=queue,
            start_to_close_timeout=timedelta(seconds=10),
            retry_policy=RetryPolicy(
                initial_interval=timedelta(milliseconds=100), backoff_coefficient=1.0
            ),
        )


def relaykit_agent(with_mcp: bool) -> Agent:
    tools: list[Any] = []
    if with_mcp:  # the worker's dynamic activity is then MCP's
        server = Path(__file__).resolve().parent / "mcp_docs_server.py"
        tools.append(MCPServer.stdio("docs", [sys.executable, str(server)]))
    return Agent(
        name=f"neighbour_{uuid.uuid4().hex[:6]}",
        model=ModelSpec(provider="openai", name="unused", base_url="http://127.0.0.1:9/v1"),
        tools=tools,
    )


@asynccontextmanager
async def other_app(client: Client, queue: str, *, activities: bool) -> AsyncIterator[str]:
    """The other application's workers: its workflows on a queue of their own, and (with
    ``activities``) its activity on relaykit's queue."""
    own_queue = f"other-app-{uuid.uuid4().hex[:8]}"
    workers = [
        TemporalWorker(
            client,
            task_queue=own_queue,
            workflows=[OtherAppOrder],
            workflow_runner=UnsandboxedWorkflowRunner(),
        )
    ]
    if activities:  # its own connection, as another application's process would have
        own_client = await Client.connect(
            client.service_client.config.target_host, namespace=client.namespace
        )
        workers.append(
            TemporalWorker(own_client, task_queue=queue, activities=[other_app_activity])
        )
    async with contextlib.AsyncExitStack() as stack:
        for worker in workers:
            await stack.enter_async_context(worker)
        yield own_queue


async def start_order(client: Client, own_queue: str, queue: str, order: str) -> WorkflowHandle:
    return await client.start_workflow(
        OtherAppOrder.run,
        args=[queue, order],
        id=f"order-{uuid.uuid4().hex[:8]}",
        task_queue=own_queue,
        execution_timeout=timedelta(seconds=60),
    )


async def refused_by_relaykit(handle: WorkflowHandle) -> str:
    """The failure relaykit's worker gave the activity's attempts so far (waits for one)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        description = await handle.describe()
        if description.status is not None and description.status != 1:  # no longer running
            return f"the workflow ended first: {await handle.result()!r}"
        for pending in description.raw_description.pending_activities:
            if pending.attempt >= 2 and pending.last_failure.message:
                return pending.last_failure.message
        await asyncio.sleep(0.1)
    return "relaykit's worker never failed an attempt"


@pytest.mark.parametrize("with_mcp", [False, True], ids=["gone-tool activity", "mcp activity"])
async def test_another_applications_activity_on_relaykits_queue_is_left_to_its_own_worker(
    client: Client, with_mcp: bool
) -> None:
    # relaykit's worker polls alone first: it fails the attempts as not registered (never
    # completes them); the other application's worker, started after, runs the activity.
    OTHER_APP_RUNS.clear()
    async with serving(client, relaykit_agent(with_mcp)) as worker:
        queue = worker.task_queue
        async with other_app(client, queue, activities=False) as own_queue:
            handle = await start_order(client, own_queue, queue, "order-7")
            refusal = await refused_by_relaykit(handle)
            assert "not registered on this worker" in refusal, refusal
            async with other_app(client, queue, activities=True):
                result = await asyncio.wait_for(handle.result(), 45)
    assert result == "other app shipped order-7"
    assert OTHER_APP_RUNS == ["order-7"]


async def test_with_both_workers_polling_every_activity_of_the_other_application_is_its_own(
    client: Client,
) -> None:
    OTHER_APP_RUNS.clear()
    async with serving(client, relaykit_agent(False)) as worker:
        queue = worker.task_queue
        async with other_app(client, queue, activities=True) as own_queue:
            handles = [await start_order(client, own_queue, queue, f"o{n}") for n in range(6)]
            results = await asyncio.wait_for(asyncio.gather(*(h.result() for h in handles)), 60)
    assert results == [f"other app shipped o{n}" for n in range(6)]
    assert sorted(OTHER_APP_RUNS) == [f"o{n}" for n in range(6)]
