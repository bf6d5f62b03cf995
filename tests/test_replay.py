"""Replay safety: histories recorded by ``tests/histories/record.py`` must replay through today's
workflow code without a nondeterminism error, or runs in flight would break on deploy.

A failure here means a change altered the commands a run issues (an activity added, removed or
reordered, a timer, an upsert). Either make the change replay old histories (``workflow.patched``,
see ``docs/replay.md``) or, if no run in flight can be affected, re-record the histories.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer
from temporalio.workflow import NondeterminismError

from relaykit import registry
from relaykit.graph import AgentGraph
from relaykit.sandbox import sandbox_runner
from relaykit.workflows.agent_run import AgentRun
from tests.histories import agents
from tests.histories.agents import SCENARIOS, Scenario

HISTORIES = Path(__file__).resolve().parent / "histories"


def load(scenario: Scenario) -> WorkflowHistory:
    text = (HISTORIES / scenario.history_file).read_text()
    return WorkflowHistory.from_json(scenario.workflow_id, text)


@contextmanager
def replaying(scenario: Scenario, graph: AgentGraph) -> Iterator[Replayer]:
    """A replayer whose workflows find ``graph``, as they would on a worker.

    Workflow code looks its agents up by ``workflow.info().task_queue``. A Replayer runs
    workflows on a task queue of its own, ``replay-<build_id>`` (not the one recorded in the
    history), so the build id is chosen to make that the scenario's recorded task queue, and
    the graph is registered under it.
    """
    build_id = scenario.task_queue.removeprefix("replay-")
    task_queue = f"replay-{build_id}"
    assert task_queue == scenario.task_queue
    registry.register(task_queue, graph)
    try:
        yield Replayer(
            workflows=[AgentRun],
            data_converter=pydantic_data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build_id,
        )
    finally:
        registry.unregister(task_queue, graph)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=[s.name for s in SCENARIOS])
async def test_recorded_history_replays_with_todays_workflow_code(scenario: Scenario) -> None:
    with replaying(scenario, agents.graph_for(scenario)) as replayer:
        result = await replayer.replay_workflow(load(scenario))
    assert result.replay_failure is None


async def test_replay_catches_a_change_in_the_commands_a_run_issues() -> None:
    # The net works: the same tool loop, but `add` now waits for approval, cannot replay.
    scenario = next(s for s in SCENARIOS if s.name == "tool_loop")
    changed_add = dataclasses.replace(agents.add, needs_approval=True)
    changed = agents.calculator.clone(tools=[changed_add])
    graph = AgentGraph.build([changed], default_model=agents.model())
    graph.search_attributes = agents.SEARCH_ATTRIBUTES
    with replaying(scenario, graph) as replayer:
        with pytest.raises(NondeterminismError):
            await replayer.replay_workflow(load(scenario))
