"""Agents: a name, instructions, a model, tools, handoffs and an output type.

An :class:`Agent` is plain configuration. It never runs by itself: the turn loop
(:mod:`relaykit.workflows.loop`) reads it inside a Temporal workflow, and the worker registers its
tools as activities. Agents are looked up by name inside a run (a run records the current agent
by name so it can resume after a crash or a continue-as-new), so names are unique within the graph
of agents a worker serves.

Instructions may be a function of the :class:`RunContext`. That function runs in workflow code,
so it must be deterministic: no clock, no I/O, no randomness (use a tool for those).
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field

from relaykit.context_policy import ContextPolicy
from relaykit.errors import ConfigurationError
from relaykit.mcp import MCPServer
from relaykit.messages import ToolSpec
from relaykit.models.spec import ModelSettings, ModelSpec, parse_model
from relaykit.names import agent_tool_name, disambiguated, is_valid_tool_name, tool_name_for
from relaykit.runs import Budget
from relaykit.schedule_options import duration
from relaykit.tool_args import AgentToolArgs, HandoffArgs, HandoffCallbackInput, InputFilter
from relaykit.tools import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TOOL_HEARTBEAT_TIMEOUT,
    OnUnknown,
    Tool,
    ToolEffect,
    check_effect,
)


class RunContext(BaseModel):
    """What dynamic instructions may read: the run's identity and the application's context."""

    agent: str
    turn: int
    workflow_id: str
    run_path: list[str] = Field(default_factory=list)
    context: dict[str, Any] = Field(default_factory=dict)
    """Application data given when the run was started (``context=`` of the run)."""


Instructions = str | Callable[[RunContext], str]

ApprovalOrder = Literal["request_order", "parallel"]
"""How a turn's calls are ordered around a call that waits for approval
(``Agent.approval_order``)."""


@dataclass(eq=False)
class Agent:
    """An agent definition.

    ``model`` may be ``None``: the worker's default model (``RELAYKIT_MODEL``, or what
    ``relaykit dev`` picked) then serves it, which keeps examples free of provider choices.
    """

    name: str
    instructions: Instructions = ""
    model: str | ModelSpec | None = None
    tools: list[Tool | AgentTool | MCPServer] = field(default_factory=list)
    """Function tools, agents as tools, and MCP servers (moved to ``mcp_servers`` on init)."""
    handoffs: list[Agent | Handoff] = field(default_factory=list)
    output_type: Any = None
    """A type (pydantic model, dataclass, ``list[str]``…) the final answer must validate against."""
    model_settings: ModelSettings | None = None
    description: str = ""
    """What this agent is good at: used in default handoff and agent-tool descriptions."""
    subagents: Subagents | None = None
    """Background helpers this agent may spawn (see :class:`relaykit.Subagents`)."""
    context_policy: ContextPolicy | None = None
    """What to do when the transcript nears the context window (taken from the agent a run
    starts with; see :class:`relaykit.ContextPolicy`)."""
    mcp_servers: list[MCPServer] = field(default_factory=list)
    """MCP servers whose tools this agent may call (see :class:`relaykit.MCPServer`)."""
    approval_order: ApprovalOrder = "request_order"
    """When a call of a turn waits for a person, what happens to the calls the model asked for
    *after* it: ``"request_order"`` (lovia's, the default) starts them only once that approval
    is decided, since they may depend on the approved action; ``"parallel"`` runs them at once.
    Calls asked for *before* it run while it waits, either way (docs/approvals.md)."""
    max_repeated_calls: int | None = 3
    """How many times one tool call (same tool, same arguments) runs before the loop guard
    answers it with the earlier result instead of running it again; counts restart at each
    user-side message. ``None`` turns the guard off (a tool polled on purpose)."""
    answer_after_tool_turns: int | None = None
    """After this many of its own turns with tool calls since the last user-side message, the
    agent's next model call gets no tools, so it answers with what it found. Small models
    wander from tool to tool; this bounds them however high a run's ``max_turns`` is."""
    output_retries: int = 1
    """How many repair requests follow a final answer that does not match ``output_type``
    before the run fails with ``OutputValidationFailed`` (lovia's default: one; ``0`` fails at
    the first invalid answer). A run may override it for every agent it reaches
    (``start_run(..., output_retries=N)``)."""
    budget: Budget | None = None
    """The budget of runs that start with this agent and are given none (``start_run(...,
    budget=...)`` wins), e.g. ``Budget(max_usd=0.50)`` (docs/budgets.md)."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ConfigurationError("an Agent needs a non-empty name")
        if self.model is not None:
            self.model = parse_model(self.model)
        # MCP servers are tool *sources*: kept apart so code that walks ``tools`` sees tools only.
        servers = [entry for entry in self.tools if isinstance(entry, MCPServer)]
        if servers:
            self.tools = [entry for entry in self.tools if not isinstance(entry, MCPServer)]
            known = self.mcp_servers
            self.mcp_servers = [*known, *(s for s in servers if s not in known)]
        if self.approval_order not in ("request_order", "parallel"):
            raise ConfigurationError(
                f"agent {self.name!r}: approval_order must be 'request_order' or 'parallel', "
                f"not {self.approval_order!r}"
            )
        for option in ("max_repeated_calls", "answer_after_tool_turns"):
            value = getattr(self, option)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 1
            ):
                raise ConfigurationError(
                    f"agent {self.name!r}: {option} must be a positive int or None, got {value!r}"
                )
        for entry in self.tools:
            if not isinstance(entry, (Tool, AgentTool)):
                raise ConfigurationError(
                    f"agent {self.name!r}: {entry!r} is not a tool",
                    hint="decorate functions with @relaykit.tool, use other_agent.as_tool(), "
                    "or relaykit.MCPServer.stdio(...)/.http(...)",
                )
        if (
            isinstance(self.output_retries, bool)
            or not isinstance(self.output_retries, int)
            or self.output_retries < 0
        ):
            raise ConfigurationError(
                f"agent {self.name!r}: output_retries must be an int >= 0, "
                f"got {self.output_retries!r}"
            )
        self._disambiguate_tool_names()

    def _disambiguate_tool_names(self) -> None:
        """lovia's names add a digest only when they must, so two targets can share a default
        name (``Billing Team`` and ``billing-team``): such names get a digest of their agent's
        name, and names given explicitly stay as they are. Colliding entries are replaced by
        renamed copies (an ``AgentTool`` may be shared by several agents)."""
        handoffs = [as_handoff(entry) for entry in self.handoffs]
        taken = Counter([t.name for t in self.tools] + [h.tool_name for h in handoffs])
        if all(count == 1 for count in taken.values()):
            return
        self.tools = [
            dataclasses.replace(t, name=disambiguated(t.name, t.agent.name))
            if isinstance(t, AgentTool) and t.default_name and taken[t.name] > 1
            else t
            for t in self.tools
        ]
        renamed: list[Agent | Handoff] = []
        for entry, handoff in zip(self.handoffs, handoffs, strict=True):
            if handoff.default_name and taken[handoff.tool_name] > 1:
                copy = Handoff(
                    target=handoff.target,
                    name=disambiguated(handoff.tool_name, handoff.target.name),
                    description=handoff.description,
                    on_handoff=handoff.on_handoff,
                    input_filter=handoff.input_filter,
                )
                copy.legacy_name, copy.default_name = handoff.legacy_name, True
                entry = copy
            renamed.append(entry)
        self.handoffs = renamed

    def __repr__(self) -> str:
        return f"Agent(name={self.name!r})"

    def clone(self, **changes: Any) -> Agent:
        return dataclasses.replace(self, **changes)

    def render_instructions(self, ctx: RunContext) -> str:
        if callable(self.instructions):
            return str(self.instructions(ctx))
        return self.instructions

    def as_tool(
        self,
        *,
        name: str | None = None,
        description: str | None = None,
        max_turns: int = 50,
        budget: Budget | None = None,
        max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    ) -> AgentTool:
        """Delegate to this agent as a tool: it runs as a child workflow that sees only the prompt
        the model wrote, and its final output comes back as the tool result (cut to
        ``max_output_chars`` with a marker, like a function tool's)."""
        return AgentTool(
            agent=self,
            name=name or agent_tool_name("ask_", self.name),
            legacy_name=name or tool_name_for("ask_", self.name),
            default_name=name is None,
            description=description
            or (f"Ask the {self.name} agent. " + (self.description or "")).strip(),
            max_turns=max_turns,
            budget=budget,
            max_output_chars=max_output_chars,
        )


@dataclass(eq=False)
class AgentTool:
    """An agent exposed as a tool (``ask_<slug>``) whose call starts a child workflow."""

    agent: Agent
    name: str
    description: str
    max_turns: int = 50
    budget: Budget | None = None
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """The child's answer reaches the parent's model cut to this many characters, with a
    marker (the whole answer stays in the child's result)."""
    legacy_name: str = ""
    """The tool name runs started before lovia's naming rule use (``name`` when empty); calls
    by this name keep resolving."""
    default_name: bool = False
    """Whether ``name`` was derived from the agent's name (``as_tool()`` without ``name=``)."""

    def __post_init__(self) -> None:
        if not self.legacy_name:
            self.legacy_name = self.name

    def run_name(self, lovia_names: bool) -> str:
        """The tool name a run uses (``RunSetup.lovia_tool_names``)."""
        return self.name if lovia_names else self.legacy_name

    @property
    def spec(self) -> ToolSpec:
        return self.spec_named(self.name)

    def spec_named(self, name: str) -> ToolSpec:
        # the schema of the model that validates the call (relaykit.workflows.agent_tools)
        return ToolSpec(
            name=name, description=self.description, parameters=AgentToolArgs.parameters()
        )


# --- handoffs and subagents: configuration that refers to agents (and agents to it) -----------


@dataclass(eq=False)
class Handoff:
    """A customised handoff to ``target``."""

    target: Agent
    name: str | None = None
    """Tool name; default ``transfer_to_<slug of target name>``."""
    description: str | None = None
    """Routing hint for the model; the default names the target and its description."""
    on_handoff: Callable[[HandoffArgs, HandoffCallbackInput], Any] | None = None
    """Called (sync or async) as an activity when the handoff executes."""
    input_filter: InputFilter | None = None
    """Rewrites the history the target sees (pure function; runs in workflow code)."""
    effect: ToolEffect = "write"
    """What ``on_handoff`` does to the world, as for ``@tool(effect=...)``: a callback that says
    nothing is a write, never started again after an attempt whose outcome is unknown (its
    worker died while it ran); the handoff still happens and the run says the callback's
    outcome is unknown (docs/boundaries.md)."""
    on_unknown: OnUnknown = "report"
    """When a ``"write"`` callback's outcome is unknown: ``"report"`` it in the handoff's result
    and the run's events, or ``"ask"`` a person whether it runs again (the handoff waits)."""
    heartbeat_timeout: timedelta | float = DEFAULT_TOOL_HEARTBEAT_TIMEOUT
    """The callback heartbeats while it runs: a worker that dies under it is noticed after this
    long (a ``timedelta`` or seconds), not after the callback's one-minute timeout."""
    legacy_name: str = field(default="", init=False, repr=False)
    """The tool name runs started before lovia's naming rule use (the same as ``name`` when it
    was given, or when both rules agree); calls by this name keep resolving."""
    default_name: bool = field(default=False, init=False, repr=False)
    """Whether ``name`` was derived from the target's name (only those get a digest suffix when
    they collide with another tool of the agent)."""

    def __post_init__(self) -> None:
        if not isinstance(self.target, Agent):
            raise ConfigurationError(f"Handoff target must be an Agent, got {self.target!r}")
        check_effect(self.effect, self.on_unknown, f"on_handoff of handoff to {self.target.name!r}")
        self.heartbeat_timeout = duration(
            self.heartbeat_timeout,
            f"heartbeat_timeout of on_handoff of handoff to {self.target.name!r}",
        )
        if self.name is None:
            self.name = agent_tool_name("transfer_to_", self.target.name)
            self.legacy_name = tool_name_for("transfer_to_", self.target.name)
            self.default_name = True
        elif not is_valid_tool_name(self.name):
            raise ConfigurationError(
                f"invalid handoff tool name {self.name!r}",
                hint="1-64 characters of A-Z, a-z, 0-9, _ and -",
            )
        if not self.legacy_name:
            self.legacy_name = self.name

    @property
    def tool_name(self) -> str:
        assert self.name is not None
        return self.name

    def run_name(self, lovia_names: bool) -> str:
        """The tool name a run uses: lovia's, or the earlier one for runs started before it
        (``RunSetup.lovia_tool_names``)."""
        return self.tool_name if lovia_names else self.legacy_name

    @property
    def spec(self) -> ToolSpec:
        return self.spec_named(self.tool_name)

    def spec_named(self, name: str) -> ToolSpec:
        description = self.description or (
            f"Hand the conversation over to the {self.target.name} agent, which continues it"
            + (f": {self.target.description}" if self.target.description else ".")
        )
        return ToolSpec(
            name=name,
            description=description,
            parameters={
                "type": "object",
                "properties": {
                    "reason": {
                        "type": "string",
                        "description": "Why the conversation is handed over (optional).",
                    }
                },
                "additionalProperties": False,
            },
        )


def as_handoff(entry: Agent | Handoff) -> Handoff:
    return entry if isinstance(entry, Handoff) else Handoff(target=entry)


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
