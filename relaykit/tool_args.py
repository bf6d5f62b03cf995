"""The arguments and inputs of relaykit's built-in tools: handoffs, agents as tools and the
subagent tools.

Plain data (pydantic models and their bounds), below every module that acts on them, so the
agent configuration (:mod:`relaykit.agent`), the behaviour (:mod:`relaykit.handoff`,
:mod:`relaykit.subagents`) and the workflow code share them without importing each other.

The arguments a model writes for these tools are parsed by the models below before any workflow
code acts on them, and the JSON schemas the model sees are generated from the same models, so
the bounds it is told about are the bounds that are enforced. Whatever a model writes (wrong
types, NaN, ``1e300``, ``"soon"``, objects where ids belong) ends as an error tool result it can
read and correct, never as a failed workflow task. ``HandoffCallbackInput`` is an activity input:
compatibility data (add fields with defaults, never rename or remove).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

from relaykit.messages import Message

# --- handoffs -----------------------------------------------------------------------------------


class HandoffArgs(BaseModel):
    """What the model passes to a handoff tool, and what ``on_handoff`` receives."""

    reason: str | None = None


class _StrictHandoffArgs(HandoffArgs):
    """The handoff tool's schema, enforced: only ``reason``, a string (or null)."""

    model_config = ConfigDict(extra="forbid", strict=True)


class HandoffCallbackInput(BaseModel):
    """Input of the ``on_handoff`` activity (persisted: compatibility data)."""

    source: str
    target: str
    reason: str | None = None
    turn: int
    workflow_id: str
    idempotency_key: str = ""
    """One key per handoff call, the same for every attempt (as a tool's
    ``ToolContext.idempotency_key``); empty in inputs recorded before callbacks had one."""
    effect: Literal["read", "idempotent", "write"] | None = None
    """The callback's effect as the workflow recorded it (``Handoff.effect``); ``None`` in inputs
    recorded before callbacks had effects (their attempts record nothing and always run)."""
    on_unknown: Literal["report", "ask"] = "report"
    rerun_approved: bool = False
    """A person approved running the callback again after an attempt whose outcome was unknown."""


class HandoffInputData(BaseModel):
    """What an ``input_filter`` gets: the history the target would see, and who hands off."""

    source: str
    target: str
    history: list[Message]


InputFilter = Callable[[HandoffInputData], list[Message]]


# --- tool arguments -----------------------------------------------------------------------------

MAX_WAIT_SECONDS = 600.0
"""The longest one ``wait_subagents`` call waits (10 minutes). A longer wait is several calls:
each result tells the model what is still running, and a runaway value from a model (``1e8``)
cannot become a timer that holds the run for years."""
DEFAULT_WAIT_SECONDS = 60.0
MAX_PROMPT_CHARS = 100_000
"""Bound on a task prompt or a message to a task: both travel in a child's workflow input or a
signal, whose payloads Temporal limits (2 MB)."""
MAX_TASK_IDS = 64


def _not_blank(value: str) -> str:
    if not value.strip():
        raise ValueError("must not be blank")
    return value


TaskId = Annotated[str, StringConstraints(min_length=1, max_length=200)]
Text = Annotated[
    str, StringConstraints(min_length=1, max_length=MAX_PROMPT_CHARS), AfterValidator(_not_blank)
]


class _Arguments(BaseModel):
    # strict: "60" is not a number and 1 is not an id; the model reads why and corrects itself
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)

    @classmethod
    def parameters(cls) -> dict[str, Any]:
        """The JSON schema the model is shown (the one validation enforces, minus titles)."""
        schema = cls.model_json_schema()
        schema.pop("title", None)
        schema.pop("description", None)
        for prop in schema.get("properties", {}).values():
            prop.pop("title", None)
        return schema


class SpawnSubagentArgs(_Arguments):
    """Arguments of ``spawn_subagent``."""

    prompt: Text = Field(description="A complete task; the subagent cannot see this conversation.")
    agent: str | None = Field(
        default=None,
        max_length=200,
        description="Which subagent runs the task (default: the first).",
    )


class WaitSubagentsArgs(_Arguments):
    """Arguments of ``wait_subagents``."""

    ids: list[TaskId] | None = Field(
        default=None,
        max_length=MAX_TASK_IDS,
        description="Task ids to wait for (default: every running task, and finished tasks "
        "whose report you have not read yet).",
    )
    timeout_seconds: float = Field(
        default=DEFAULT_WAIT_SECONDS,
        ge=0,
        le=MAX_WAIT_SECONDS,
        description=f"How long to wait at most, in seconds (0 = do not wait, just collect what "
        f"is ready; at most {MAX_WAIT_SECONDS:g}).",
    )


class CancelSubagentArgs(_Arguments):
    """Arguments of ``cancel_subagent``."""

    id: TaskId = Field(description="The id of the task to cancel, e.g. task-1.")


class SendToSubagentArgs(_Arguments):
    """Arguments of ``send_to_subagent``."""

    id: TaskId = Field(description="The id of a running task, e.g. task-1.")
    message: Text = Field(description="What to tell the task; it reads it at its next turn.")


class AgentToolArgs(_Arguments):
    """Arguments of an agent tool (``other.as_tool()``): the task for the child run."""

    input: Text = Field(
        description="The complete task for the agent; it cannot see this conversation."
    )


SUBAGENT_ARGUMENTS: dict[str, type[BaseModel]] = {
    "spawn_subagent": SpawnSubagentArgs,
    "wait_subagents": WaitSubagentsArgs,
    "cancel_subagent": CancelSubagentArgs,
    "send_to_subagent": SendToSubagentArgs,
}

SUBAGENT_TOOLS = ("spawn_subagent", "wait_subagents", "cancel_subagent", "send_to_subagent")
"""The subagent tools' names (all four are answered, also where a detached capability shows
only ``spawn_subagent``)."""
