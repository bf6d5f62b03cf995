"""Runs in flight when the subagent changes were deployed keep replaying.

``tests/histories/subagents_v0.json`` was recorded by the code from before them: its agent-tool
child is named after the call id and its ``wait_subagents(timeout_seconds=0)`` started a 60 s
timer. Today's code names children after their agent and does not wait for a 0 s timeout, but
behind ``workflow.patched``, so this history must replay unchanged.
"""

from __future__ import annotations

from pathlib import Path

from temporalio.client import WorkflowHistory
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.worker import Replayer

from relaykit import registry
from relaykit.sandbox import sandbox_runner
from relaykit.workflows.agent_run import AgentRun
from tests.histories import subagents

HISTORY = Path(__file__).resolve().parent / "histories" / subagents.HISTORY


async def test_a_run_recorded_before_the_subagent_changes_replays_with_todays_code() -> None:
    history = WorkflowHistory.from_json(subagents.WORKFLOW_ID, HISTORY.read_text())
    started = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        for e in history.events
        if e.HasField("start_child_workflow_execution_initiated_event_attributes")
    ]
    assert f"{subagents.WORKFLOW_ID}/call_summary" in started  # the old naming, as recorded
    assert any(e.HasField("timer_started_event_attributes") for e in history.events)
    graph = subagents.graph()
    build_id = subagents.TASK_QUEUE.removeprefix("replay-")
    registry.register(subagents.TASK_QUEUE, graph)
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            data_converter=pydantic_data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build_id,
        )
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(subagents.TASK_QUEUE, graph)
    assert result.replay_failure is None
