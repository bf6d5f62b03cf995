"""Background subagents: fire-and-forget child workflows whose reports arrive at turn boundaries.

The :class:`Subagents` configuration lives with the agents (:mod:`relaykit.agent`) and the tools'
argument models in :mod:`relaykit.tool_args` (both re-exported here); the workflow side is
:mod:`relaykit.workflows.subagent_tools` and :mod:`relaykit.workflows.subagent_tasks`.

The arguments a model writes for the four subagent tools are parsed by the pydantic models below
before any workflow code acts on them, and the JSON schemas the model sees are generated from
the same models, so the bounds it is told about are the bounds that are enforced. Whatever a
model writes (wrong types, NaN, ``1e300``, ``"soon"``, objects where ids belong) ends as an error
tool result it can read and correct, never as a failed workflow task.
"""

from __future__ import annotations

from relaykit.agent import Subagents
from relaykit.tool_args import (
    DEFAULT_WAIT_SECONDS,
    MAX_PROMPT_CHARS,
    MAX_TASK_IDS,
    MAX_WAIT_SECONDS,
    SUBAGENT_ARGUMENTS,
    SUBAGENT_TOOLS,
    AgentToolArgs,
    CancelSubagentArgs,
    SendToSubagentArgs,
    SpawnSubagentArgs,
    WaitSubagentsArgs,
)

__all__ = [
    "DEFAULT_INSTRUCTIONS",
    "DEFAULT_WAIT_SECONDS",
    "DETACHED_INSTRUCTIONS",
    "MAX_PROMPT_CHARS",
    "MAX_TASK_IDS",
    "MAX_WAIT_SECONDS",
    "SUBAGENT_ARGUMENTS",
    "SUBAGENT_TOOLS",
    "AgentToolArgs",
    "CancelSubagentArgs",
    "SendToSubagentArgs",
    "SpawnSubagentArgs",
    "Subagents",
    "WaitSubagentsArgs",
]

DEFAULT_INSTRUCTIONS = (
    "You can run background tasks with spawn_subagent: give each a complete, self-contained "
    "prompt (the subagent cannot see this conversation). Keep working while they run; their "
    "reports arrive as messages. Before you give your final answer, wait for your tasks with "
    "wait_subagents or cancel the ones you no longer need."
)

DETACHED_INSTRUCTIONS = (
    "You can start background tasks with spawn_subagent: give each a complete, self-contained "
    "prompt (the subagent cannot see this conversation). The tasks run on their own and their "
    "reports are delivered elsewhere, not to you: do not wait for them. Give your final answer "
    "as soon as your own work is done."
)
"""Built-in guidance for ``Subagents(detached=True)``: detached reports never come back to this
run, so telling the model to wait for them would contradict how it works."""
