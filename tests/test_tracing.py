"""OpenTelemetry spans of a run (workflow, model and tool activities, GenAI attributes), caught
by an in-memory exporter; and a replay of the recorded history that must emit none."""

from __future__ import annotations

import asyncio
import logging
import threading
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from temporalio.client import Client
from temporalio.contrib.opentelemetry import TracingInterceptor
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from relaykit import Agent, ApprovalDecision, Worker, connect, registry, start_run, tool
from relaykit.devserver import DevServer
from relaykit.sandbox import sandbox_runner
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.tracing import TRACING_ENV, temporal_interceptor, tracing_enabled
from relaykit.workflows.agent_run import AgentRun
from tests.support import scripted_model


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First number.
        b: Second number.
    """
    return a + b


@pytest.fixture
def spans() -> Iterator[tuple[InMemorySpanExporter, TracerProvider]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter, provider
    provider.shutdown()


def named(found: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in found if s.name == name]


async def test_a_run_is_one_trace_with_genai_attributes_on_model_and_tool_spans(
    temporal_server: DevServer,
    model_server: ScriptedModelServer,
    spans: tuple[InMemorySpanExporter, TracerProvider],
) -> None:
    # Contract: a traced client and worker give one trace per run: the workflow's steps, each
    # model call (model, tokens) and each tool call (tool name).
    exporter, provider = spans
    tracer = provider.get_tracer("relaykit-test")
    traced = await connect(
        temporal_server.address, namespace=temporal_server.namespace, tracing=True, tracer=tracer
    )
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=2, b=3), text("5")])
    agent = Agent(name="adder", model=model, tools=[add])
    async with Worker(
        traced, agent, task_queue=f"tq-{uuid.uuid4().hex[:10]}", tracing=True
    ) as worker:
        handle = await start_run(traced, agent, "2+3?", task_queue=worker.task_queue)
        assert (await handle.result()).output == "5"
    found = exporter.get_finished_spans()
    assert len(named(found, "StartWorkflow:AgentRun")) == 1
    assert len(named(found, "RunWorkflow:AgentRun")) == 1
    assert len(named(found, "StartActivity:relaykit.model_call")) == 2
    assert len({s.context.trace_id for s in found}) == 1

    chats = named(found, "RunActivity:relaykit.model_call")
    assert len(chats) == 2
    for span in chats:
        attrs = dict(span.attributes or {})
        assert attrs["gen_ai.operation.name"] == "chat"
        assert attrs["gen_ai.provider.name"] == "openai"
        assert attrs["gen_ai.request.model"] == model.name
        assert attrs["gen_ai.usage.input_tokens"] == 10
        assert attrs["gen_ai.usage.output_tokens"] == 5
        assert attrs["temporalWorkflowID"] == handle.id
    [tool_span] = named(found, "RunActivity:add")
    attrs = dict(tool_span.attributes or {})
    assert attrs["gen_ai.operation.name"] == "execute_tool"
    assert attrs["gen_ai.tool.name"] == "add"
    assert attrs["relaykit.agent"] == "adder"
    [start_add] = named(found, "StartActivity:add")
    assert tool_span.parent is not None and tool_span.parent.span_id == start_add.context.span_id


def test_tracing_is_off_by_default_and_on_with_one_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TRACING_ENV, raising=False)
    assert not tracing_enabled() and tracing_enabled(True)
    monkeypatch.setenv(TRACING_ENV, "1")
    assert tracing_enabled() and not tracing_enabled(False)


async def test_a_worker_without_tracing_adds_no_interceptor(
    client: Client, model_server: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(TRACING_ENV, raising=False)
    agent = Agent(name="plain", model=scripted_model(model_server))
    async with Worker(client, agent, task_queue=f"tq-{uuid.uuid4().hex[:10]}") as worker:
        assert worker._worker is not None
        interceptors = worker._worker.config()["interceptors"]
        assert not any(isinstance(i, TracingInterceptor) for i in interceptors)
    monkeypatch.setenv(TRACING_ENV, "on")
    async with Worker(client, agent, task_queue=f"tq-{uuid.uuid4().hex[:10]}") as worker:
        assert worker._worker is not None
        interceptors = worker._worker.config()["interceptors"]
        assert any(isinstance(i, TracingInterceptor) for i in interceptors)


async def test_replaying_a_traced_run_emits_no_spans_and_no_logs(
    client: Client,
    model_server: ScriptedModelServer,
    spans: tuple[InMemorySpanExporter, TracerProvider],
    caplog: pytest.LogCaptureFixture,
) -> None:
    # Contract: a worker replaying history (after a restart, or a Replayer) does not send the
    # run's spans or workflow log lines a second time.
    exporter, provider = spans
    tracer = provider.get_tracer("relaykit-test")
    gate = threading.Event()
    model = scripted_model(model_server)
    model_server.script(model.name, [call("add", a=1, b=1), text("2", hold=gate)])
    agent = Agent(name="replayed", model=model, tools=[add])
    build_id = uuid.uuid4().hex[:10]
    task_queue = f"replay-{build_id}"  # the task queue a Replayer with this build id runs on
    caplog.set_level(logging.INFO, logger="temporalio.workflow")
    try:
        async with Worker(
            client, agent, task_queue=task_queue, tracing=True, tracer=tracer
        ) as worker:
            handle = await start_run(client, agent, "1+1?", task_queue=task_queue)
            await model_server_waits(model_server, model.name, 2)
            # An answer nobody asked for: the workflow logs a warning and records it as refused.
            await handle.workflow.signal(
                "approve_signal", ApprovalDecision(call_id="nope", approved=True)
            )
            gate.set()
            assert (await handle.result()).output == "2"
            graph = worker.graph
    finally:
        gate.set()
    live_spans = exporter.get_finished_spans()
    assert named(live_spans, "RunWorkflow:AgentRun") and named(
        live_spans, "HandleSignal:approve_signal"
    )
    assert any("refused approval" in r.getMessage() for r in caplog.records)

    history = await handle.workflow.fetch_history()
    exporter.clear()
    caplog.clear()
    registry.register(task_queue, graph)
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            interceptors=[temporal_interceptor(tracer)],
            workflow_runner=sandbox_runner("opentelemetry"),
            data_converter=pydantic_data_converter,
            build_id=build_id,
        )
        result = await replayer.replay_workflow(history)
    finally:
        registry.unregister(task_queue, graph)
    assert result.replay_failure is None
    assert exporter.get_finished_spans() == ()
    assert not [r for r in caplog.records if r.name.startswith("temporalio.workflow")]


async def model_server_waits(server: ScriptedModelServer, model: str, n: int) -> None:
    await asyncio.to_thread(server.wait_for_requests, model, n, 10.0)
