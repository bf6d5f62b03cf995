"""relaykit: durable multi-agent LLM runs on Temporal.

An agent run is a Temporal workflow; every model call and every tool execution is an activity,
so a crash of a worker, a model server or a machine loses nothing.
"""

from relaykit.agent import Agent, AgentTool, Budget, RunContext
from relaykit.context_policy import ContextPolicy, default_context_policy
from relaykit.client import RunHandle, connect, get_run, run, start_run
from relaykit.errors import ConfigurationError, RelaykitError, RunFailed
from relaykit.handoff import (
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    for_context_rewrite,
    remove_tool_calls,
)
from relaykit.messages import Message, ToolCall, Usage
from relaykit.models.spec import ModelSettings, ModelSpec, parse_model
from relaykit.runs import (
    ApprovalDecision,
    PendingApproval,
    RunEvent,
    RunInput,
    RunResult,
    RunSnapshot,
    RunStatus,
)
from relaykit.streaming import StreamCursor, StreamEvent
from relaykit.subagents import Subagents
from relaykit.tools import Tool, ToolContext, tool
from relaykit.worker import DEFAULT_TASK_QUEUE, Worker
from relaykit.workflows.loop import run_agent

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "Agent",
    "AgentTool",
    "ApprovalDecision",
    "Budget",
    "ConfigurationError",
    "ContextPolicy",
    "Handoff",
    "HandoffArgs",
    "HandoffCallbackInput",
    "HandoffInputData",
    "Message",
    "ModelSettings",
    "ModelSpec",
    "PendingApproval",
    "RelaykitError",
    "RunContext",
    "RunEvent",
    "RunFailed",
    "RunHandle",
    "RunInput",
    "RunResult",
    "RunSnapshot",
    "RunStatus",
    "StreamCursor",
    "StreamEvent",
    "Subagents",
    "Tool",
    "ToolCall",
    "ToolContext",
    "Usage",
    "Worker",
    "connect",
    "default_context_policy",
    "for_context_rewrite",
    "get_run",
    "parse_model",
    "remove_tool_calls",
    "run",
    "run_agent",
    "start_run",
    "tool",
]
