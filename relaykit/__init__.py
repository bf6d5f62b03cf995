"""relaykit: durable multi-agent LLM runs on Temporal.

An agent run is a Temporal workflow; every model call and every tool execution is an activity,
so a crash of a worker, a model server or a machine loses nothing.
"""

import importlib
from typing import TYPE_CHECKING, Any

import relaykit._lean  # noqa: F401  (first: decides how httpx is imported)

# isort: split
from relaykit.agent import Agent, AgentTool, ApprovalOrder, Budget, RunContext
from relaykit.budget_state import BudgetView
from relaykit.context_policy import ContextPolicy, default_context_policy
from relaykit.errors import (
    ApprovalNotWaiting,
    ConfigurationError,
    RelaykitError,
    RunFailed,
    TextTooLong,
)
from relaykit.eval_context import EvalContext
from relaykit.handoff import (
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    HandoffInputData,
    for_context_rewrite,
    remove_tool_calls,
)
from relaykit.mcp import MCPServer
from relaykit.messages import Message, ToolCall, Usage
from relaykit.models.spec import ModelSettings, ModelSpec, Price, parse_model
from relaykit.payload_storage import StoreDriver, with_external_storage
from relaykit.runs import (
    ApprovalDecision,
    ForkOrigin,
    PendingApproval,
    RunEvent,
    RunInput,
    RunResult,
    RunSetup,
    RunSnapshot,
    RunStatus,
)
from relaykit.storage import Store
from relaykit.streaming import StreamCursor, StreamEvent
from relaykit.subagents import (
    MAX_WAIT_SECONDS,
    AgentToolArgs,
    CancelSubagentArgs,
    SendToSubagentArgs,
    SpawnSubagentArgs,
    Subagents,
    WaitSubagentsArgs,
)
from relaykit.tools import (
    DEFAULT_TOOL_HEARTBEAT_TIMEOUT,
    DEFAULT_TOOL_RETRY,
    MAX_TOOL_RESULT_BYTES,
    OnUnknown,
    Tool,
    ToolContext,
    ToolEffect,
    tool,
)
from relaykit.worker import DEFAULT_TASK_QUEUE, Worker
from relaykit.workflows.loop import run_agent

if TYPE_CHECKING:
    from relaykit.bulk_approvals import BulkAnswer, answer_waiting
    from relaykit.client import (
        RunHandle,
        connect,
        get_run,
        run,
        start_run,
        task_queue_has_worker,
    )
    from relaykit.codec import PayloadDecodeError, compose_data_converter, load_codec
    from relaykit.evals import EvalReport, EvalSource, RunReport, eval_worker, evaluate, select_runs
    from relaykit.fork import ForkError, fork_run
    from relaykit.run_list import (
        RunFilter,
        RunPage,
        RunRow,
        RunWaiting,
        count_waiting,
        list_runs_page,
    )

_CLIENT_SIDE = {
    "BulkAnswer": "relaykit.bulk_approvals",
    "answer_waiting": "relaykit.bulk_approvals",
    "RunHandle": "relaykit.client",
    "connect": "relaykit.client",
    "get_run": "relaykit.client",
    "run": "relaykit.client",
    "start_run": "relaykit.client",
    "task_queue_has_worker": "relaykit.client",
    "PayloadDecodeError": "relaykit.codec",
    "compose_data_converter": "relaykit.codec",
    "load_codec": "relaykit.codec",
    "ForkError": "relaykit.fork",
    "fork_run": "relaykit.fork",
    "EvalReport": "relaykit.evals",
    "EvalSource": "relaykit.evals",
    "RunReport": "relaykit.evals",
    "eval_worker": "relaykit.evals",
    "evaluate": "relaykit.evals",
    "select_runs": "relaykit.evals",
    "RunFilter": "relaykit.run_list",
    "RunPage": "relaykit.run_list",
    "RunRow": "relaykit.run_list",
    "RunWaiting": "relaykit.run_list",
    "count_waiting": "relaykit.run_list",
    "list_runs_page": "relaykit.run_list",
}
"""Names whose modules a worker never uses: imported on first access (PEP 562), so a worker
process does not carry the client, the codec loader, forking and evaluations
(``tests/test_lean_imports.py``)."""


def __getattr__(name: str) -> Any:
    module = _CLIENT_SIDE.get(name)
    if module is None:
        raise AttributeError(f"module 'relaykit' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_CLIENT_SIDE})


__version__ = "0.1.0"

__all__ = [
    "DEFAULT_TASK_QUEUE",
    "DEFAULT_TOOL_HEARTBEAT_TIMEOUT",
    "DEFAULT_TOOL_RETRY",
    "MAX_TOOL_RESULT_BYTES",
    "MAX_WAIT_SECONDS",
    "Agent",
    "AgentTool",
    "AgentToolArgs",
    "ApprovalDecision",
    "ApprovalNotWaiting",
    "ApprovalOrder",
    "Budget",
    "BudgetView",
    "BulkAnswer",
    "CancelSubagentArgs",
    "ConfigurationError",
    "ContextPolicy",
    "EvalContext",
    "EvalReport",
    "EvalSource",
    "ForkError",
    "ForkOrigin",
    "Handoff",
    "HandoffArgs",
    "HandoffCallbackInput",
    "HandoffInputData",
    "MCPServer",
    "Message",
    "ModelSettings",
    "ModelSpec",
    "OnUnknown",
    "PayloadDecodeError",
    "PendingApproval",
    "Price",
    "RelaykitError",
    "RunContext",
    "RunEvent",
    "RunFailed",
    "RunFilter",
    "RunHandle",
    "RunInput",
    "RunPage",
    "RunReport",
    "RunResult",
    "RunRow",
    "RunSetup",
    "RunSnapshot",
    "RunStatus",
    "RunWaiting",
    "SendToSubagentArgs",
    "SpawnSubagentArgs",
    "Store",
    "StoreDriver",
    "StreamCursor",
    "StreamEvent",
    "Subagents",
    "TextTooLong",
    "Tool",
    "ToolCall",
    "ToolContext",
    "ToolEffect",
    "Usage",
    "WaitSubagentsArgs",
    "Worker",
    "answer_waiting",
    "compose_data_converter",
    "connect",
    "count_waiting",
    "default_context_policy",
    "eval_worker",
    "evaluate",
    "for_context_rewrite",
    "fork_run",
    "get_run",
    "list_runs_page",
    "load_codec",
    "parse_model",
    "remove_tool_calls",
    "run",
    "run_agent",
    "select_runs",
    "start_run",
    "task_queue_has_worker",
    "tool",
    "with_external_storage",
]
