"""Background subagents: fire-and-forget child workflows whose reports arrive at turn boundaries.

Declared here; the turn loop (:mod:`relaykit.workflows.loop`) owns their bookkeeping.

The arguments a model writes for the four subagent tools are parsed by the pydantic models below
before any workflow code acts on them, and the JSON schemas the model sees are generated from
the same models, so the bounds it is told about are the bounds that are enforced. Whatever a
model writes (wrong types, NaN, ``1e300``, ``"soon"``, objects where ids belong) ends as an error
tool result it can read and correct, never as a failed workflow task.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StringConstraints

if TYPE_CHECKING:
    from relaykit.agent import Agent, Budget


@dataclass(eq=False)
class Subagents:
    """Gives an agent ``spawn_subagent``, ``wait_subagents``, ``cancel_subagent`` and
    ``send_to_subagent`` tools.

    With no ``agents``, the current agent is cloned without its subagents and handoffs (so a
    subagent cannot spawn recursively).

    lovia's semantics: a spawn beyond ``max_concurrent`` is refused with the running tasks
    named; each report reaches the model once (at a turn boundary, or in a ``wait_subagents``
    result), truncated to ``max_result_chars`` by keeping its beginning and its end; one wait
    lasts at most :data:`MAX_WAIT_SECONDS`; while tasks run, each request carries their status
    and elapsed time. Unfinished tasks are cancelled when the run ends, unless ``detached``.
    """

    agents: tuple[Agent, ...] | list[Agent] = field(default_factory=tuple)
    max_concurrent: int = 4
    max_turns: int = 50
    budget: Budget | None = None
    max_result_chars: int = 16_000
    detached: bool = False
    """Subagents keep running after the parent ends (parent-close policy ABANDON); their reports
    go to ``deliver_to_workflow`` (a signal) and/or ``deliver_url`` (an HTTP POST)."""
    deliver_to_workflow: str | None = None
    deliver_url: str | None = None
    instructions: str | None = None
    """Replaces the built-in guidance added to the agent's system prompt
    (:data:`DEFAULT_INSTRUCTIONS`, or :data:`DETACHED_INSTRUCTIONS` when detached)."""
    approvals: Literal["reject", "parent"] = "reject"
    """Background tasks run unattended: a tool needing approval is rejected at once
    (``"reject"``), unless approvals should surface in the parent run for a person to answer
    there (``"parent"``; not available to detached tasks, whose parent may be gone)."""

    def __post_init__(self) -> None:
        from relaykit.errors import ConfigurationError

        if self.max_concurrent < 1:
            raise ConfigurationError("Subagents(max_concurrent=...) must be at least 1")
        if self.detached and self.approvals == "parent":
            raise ConfigurationError(
                "detached subagents cannot send approvals to their parent (it may be gone)"
            )
        if self.detached and not (self.deliver_to_workflow or self.deliver_url):
            raise ConfigurationError(
                "detached subagents need somewhere to deliver their reports",
                hint="set deliver_to_workflow=... or deliver_url=...",
            )


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

    prompt: Text = Field(
        description="A complete task; the subagent cannot see this conversation."
    )
    agent: str | None = Field(
        default=None, max_length=200, description="Which subagent runs the task (default: the first)."
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
