"""Workflow code: deterministic, replayed after crashes. Nothing here does I/O."""

from relaykit.workflows.agent_run import AgentRun
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW, MODEL_ACTIVITY, TurnLoop, run_agent

__all__ = ["AGENT_RUN_WORKFLOW", "MODEL_ACTIVITY", "AgentRun", "TurnLoop", "run_agent"]
