"""``relaykit replay-check``: replay the histories of runs against new agent code before deploying
it, with Temporal's own :class:`~temporalio.worker.Replayer`. Nothing on the server changes.

A run whose history the new code cannot replay would wedge on the first worker of that code to
pick it up (its workflow task failing on every attempt). The check finds such runs first: it
builds the agent graph of the modules given, as ``relaykit worker`` would, registers it for the
task queue each history was recorded on (workflow code finds its agents there), and replays.

Histories come from the server (open ``AgentRun`` executions on a task queue, children included,
or those a visibility query matches) or from JSON files as ``temporal workflow show -o json``
writes them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from temporalio.client import Client, WorkflowHistory
from temporalio.runtime import Runtime, TelemetryConfig
from temporalio.worker import Replayer

from relaykit import registry
from relaykit.agent import Agent
from relaykit.graph import AgentGraph
from relaykit.loading import load_agents
from relaykit.models.spec import ModelSpec
from relaykit.runs import RunInput
from relaykit.sandbox import sandbox_runner
from relaykit.search_attributes import upsert_choices
from relaykit.stuck import first_line
from relaykit.worker import default_model_from_env
from relaykit.workflows.agent_run import AgentRun
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW

REPLAY_BUILD_ID = "relaykit-replay-check"
REPLAY_MODEL = ModelSpec(provider="openai", name="replay-check")
"""Agents without a model of their own replay with ``RELAYKIT_MODEL`` when it is set, or with
this stand-in: replay never calls a model, and Temporal does not compare activity inputs."""


@dataclass
class ReplayOutcome:
    workflow_id: str
    run_id: str | None
    outcome: str
    """``ok``, ``failed`` or ``skipped``."""
    detail: str = ""

    def line(self) -> str:
        run = f" (run {self.run_id})" if self.run_id else ""
        return f"{self.outcome}: {self.workflow_id}{run}: {self.detail}"


@dataclass
class _History:
    history: WorkflowHistory
    run_id: str | None


def _started(history: WorkflowHistory) -> object | None:
    for event in history.events:
        if event.HasField("workflow_execution_started_event_attributes"):
            return event.workflow_execution_started_event_attributes
    return None


async def _server_histories(
    client: Client, query: str, limit: int | None
) -> AsyncIterator[_History]:
    async for execution in client.list_workflows(query, limit=limit):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        yield _History(await handle.fetch_history(), execution.run_id)


def _file_histories(directory: Path) -> list[_History]:
    files = [directory] if directory.is_file() else sorted(directory.glob("*.json"))
    loaded = []
    for path in files:
        data = json.loads(path.read_text(encoding="utf-8"))
        events = data.get("events", []) if isinstance(data, dict) else []
        first = events[0] if events else {}
        attributes = first.get("workflowExecutionStartedEventAttributes", {})
        workflow_id = attributes.get("workflowId") or path.stem
        loaded.append(_History(WorkflowHistory.from_json(workflow_id, data), None))
    return loaded


def default_query(task_queue: str) -> str:
    return (
        f"WorkflowType = '{AGENT_RUN_WORKFLOW}' AND ExecutionStatus = 'Running' "
        f"AND TaskQueue = '{task_queue}'"
    )


async def open_run_queues(client: Client, limit: int = 1000) -> dict[str, int]:
    """The task queues that have open ``AgentRun`` runs, with how many (of the first
    ``limit``): where a check that found nothing on its queue should have looked."""
    queues: dict[str, int] = {}
    query = f"WorkflowType = '{AGENT_RUN_WORKFLOW}' AND ExecutionStatus = 'Running'"
    async for execution in client.list_workflows(query, limit=limit):
        queues[execution.task_queue] = queues.get(execution.task_queue, 0) + 1
    return queues


async def replay_check(
    client: Client,
    targets: Sequence[str],
    *,
    task_queue: str,
    query: str | None = None,
    histories: Path | None = None,
    limit: int | None = None,
) -> list[ReplayOutcome]:
    """Replay each history against the agents of ``targets``; one outcome per history."""
    agents: list[Agent] = []
    for target in targets:
        agents.extend(a for a in load_agents(target) if all(a is not b for b in agents))
    graph = AgentGraph.build(agents, default_model=default_model_from_env() or REPLAY_MODEL)
    # Runs recorded before relaykit wrote its run-setup markers replay with the choice a worker
    # of this namespace would make today, as they would on a worker.
    (
        graph.search_attributes,
        graph.cost_attribute,
        graph.list_attributes,
        graph.waiting_calls_attribute,
    ) = await upsert_choices(client)
    # A Replayer runs workflows on the task queue "replay-<build id>", whatever the history
    # says; workflow code finds its agents by task queue, so the graph is registered there.
    replayer = Replayer(
        workflows=[AgentRun],
        data_converter=client.data_converter,
        workflow_runner=sandbox_runner(),
        namespace=client.namespace,
        build_id=REPLAY_BUILD_ID,
        # The SDK core would log each failing replay to stdout too; the outcome lines say it.
        runtime=Runtime(telemetry=TelemetryConfig(logging=None)),
    )
    if histories is not None:
        items: list[_History] = _file_histories(histories)[:limit]
    else:
        items = [
            h async for h in _server_histories(client, query or default_query(task_queue), limit)
        ]
    queue = f"replay-{REPLAY_BUILD_ID}"
    registry.register(queue, graph)
    try:
        return [await _replay_one(replayer, graph, client, item) for item in items]
    finally:
        registry.unregister(queue, graph)


async def _replay_one(
    replayer: Replayer, graph: AgentGraph, client: Client, item: _History
) -> ReplayOutcome:
    history = item.history
    started = _started(history)
    if started is None:
        return ReplayOutcome(
            history.workflow_id, item.run_id, "failed", "the history has no start event"
        )
    agents = await _agents_of(client, started)
    if agents and not any(agent in graph.agents for agent in agents):
        return ReplayOutcome(
            history.workflow_id, item.run_id, "skipped", f"agent {agents[0]!r} is not defined here"
        )
    result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    if result.replay_failure is None:
        return ReplayOutcome(history.workflow_id, item.run_id, "ok")
    detail = first_line(str(result.replay_failure))
    return ReplayOutcome(history.workflow_id, item.run_id, "failed", detail)


async def _agents_of(client: Client, started: object) -> list[str]:
    """The run's agents from its start input: the one it started with and, for a run that
    continued as new, the one it had then (empty when the input cannot be read: the replay
    then says what is wrong). A run is another module's when MODULE defines neither; one whose
    current agent MODULE no longer defines replays (the turn loop stands in for it)."""
    payloads = list(started.input.payloads)  # type: ignore[attr-defined]
    if not payloads:
        return []
    try:
        (value,) = await client.data_converter.decode(payloads[:1], [RunInput])
    except Exception:  # noqa: BLE001 - a malformed input is the replay's to report
        return []
    if not isinstance(value, RunInput):
        return []
    agents = [value.agent, *([value.state.agent] if value.state is not None else [])]
    return [agent for agent in agents if isinstance(agent, str) and agent]
