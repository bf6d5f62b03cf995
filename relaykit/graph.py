"""The graph of agents a worker serves, checked once when the worker starts.

A run names its current agent by string (so it survives crashes and continue-as-new), which only
works if names are unique in the graph. Tools become activity types named after themselves, so
two different tools may not share a name anywhere in the graph. Both are checked here, at worker
start, so a mistake is a clear error before any run, never a stuck workflow.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from relaykit.agent import Agent, AgentTool
from relaykit.errors import ConfigurationError
from relaykit.handoff import Handoff, as_handoff
from relaykit.mcp import MCPServer
from relaykit.models.spec import ModelSpec
from relaykit.tools import Tool

#: Activity and tool names relaykit itself uses; user tools may not take them.
RESERVED_NAMES = frozenset(
    {
        "relaykit.model_call",
        "spawn_subagent",
        "wait_subagents",
        "cancel_subagent",
        "send_to_subagent",
    }
)


def clone_name(agent: Agent) -> str:
    return f"{agent.name}.subagent"


@dataclass
class AgentGraph:
    """Agents by name, function tools by name, handoffs by tool name (what the worker registers;
    a handoff with ``on_handoff`` is there under its earlier name too, see
    ``Handoff.legacy_name``)."""

    agents: dict[str, Agent] = field(default_factory=dict)
    tools: dict[str, Tool] = field(default_factory=dict)
    handoffs: dict[str, Handoff] = field(default_factory=dict)
    mcp_servers: dict[str, MCPServer] = field(default_factory=dict)
    """MCP servers by name (their activities are named after them)."""
    default_model: ModelSpec | None = None
    event_groups: bool = False
    """Whether each turn's commands are grouped for the Temporal UI (set by the worker)."""
    search_attributes: bool = False
    """Whether runs upsert relaykit's search attributes (set by the worker when the namespace
    has them registered; upserting an unregistered one would fail every workflow task). Only
    the runs this worker starts follow it: a run records the choice (``RunState.setup``)."""
    cost_attribute: bool = False
    """Whether runs with search attributes also upsert ``RelayCostUSD`` (set by the worker when
    the namespace has it; recorded by each run like the others)."""
    list_attributes: bool = False
    """Whether runs with search attributes also upsert ``RelayWaitingFor`` and
    ``RelayLastActivity`` (set by the worker when the namespace has both; recorded per run)."""
    waiting_calls_attribute: bool = False
    """Whether runs with search attributes also upsert ``RelayWaitingCalls`` (set by the worker
    when the namespace has it; recorded by each run with its other setup choices)."""
    upgrade_on_continue_as_new: bool = False
    """A versioned worker's choice: a run that continues as new starts its next execution on the
    deployment's current build instead of staying pinned (set by the worker). It only shapes
    the continue-as-new command's options, which replay does not compare."""

    @classmethod
    def build(cls, roots: Iterable[Agent], *, default_model: ModelSpec | None = None) -> AgentGraph:
        graph = cls(default_model=default_model)
        pending = list(roots)
        if not pending:
            raise ConfigurationError("no agents given", hint="pass at least one Agent")
        while pending:
            agent = pending.pop()
            if not isinstance(agent, Agent):
                raise ConfigurationError(f"{agent!r} is not an Agent")
            known = graph.agents.get(agent.name)
            if known is agent:
                continue
            if known is not None:
                raise ConfigurationError(
                    f"two different agents are named {agent.name!r}",
                    hint="agent names must be unique among the agents one worker serves "
                    "(runs look agents up by name)",
                )
            graph.agents[agent.name] = agent
            pending.extend(graph._add_agent(agent))
        for agent in graph.agents.values():
            if agent.model is None and default_model is None:
                raise ConfigurationError(
                    f"agent {agent.name!r} has no model and the worker has no default model",
                    hint='set Agent(model="openai:gpt-4.1-mini") or RELAYKIT_MODEL',
                )
        return graph

    def _add_agent(self, agent: Agent) -> list[Agent]:
        """Register the agent's tools and handoffs; return the agents it reaches."""
        reached: list[Agent] = []
        local_names: set[str] = set()

        def claim(name: str) -> None:
            if name in local_names:
                raise ConfigurationError(
                    f"agent {agent.name!r} has two tools named {name!r}",
                    hint="rename one (tool(name=...), Handoff(name=...), as_tool(name=...))",
                )
            local_names.add(name)

        for entry in agent.tools:
            claim(entry.name)
            if isinstance(entry, AgentTool):
                reached.append(entry.agent)
                continue
            if not isinstance(entry, Tool):  # Agent moved its MCP servers out; a later edit may not
                raise ConfigurationError(f"agent {agent.name!r}: {entry!r} is not a tool")
            if entry.name in RESERVED_NAMES:
                raise ConfigurationError(f"tool name {entry.name!r} is reserved by relaykit")
            if entry.name in self.handoffs:  # the handoff's agent may have been added first
                raise ConfigurationError(
                    f"handoff {entry.name!r} collides with a function tool of that name",
                    hint="give one of them another name (tool(name=...), Handoff(name=...))",
                )
            known = self.tools.get(entry.name)
            if known is not None and known is not entry:
                raise ConfigurationError(
                    f"two different tools are named {entry.name!r}",
                    hint="each tool is an activity type named after it; give one another name",
                )
            self.tools[entry.name] = entry
        for raw in agent.handoffs:
            handoff = as_handoff(raw)
            claim(handoff.tool_name)
            known_handoff = self.handoffs.get(handoff.tool_name)
            if known_handoff is not None and known_handoff.target is not handoff.target:
                raise ConfigurationError(
                    f"handoff tool {handoff.tool_name!r} leads to two different agents",
                    hint="give one of them another name with Handoff(name=...)",
                )
            if handoff.tool_name in self.tools:
                raise ConfigurationError(
                    f"handoff {handoff.tool_name!r} collides with a function tool of that name",
                    hint="give one of them another name (tool(name=...), Handoff(name=...))",
                )
            # The worker registers one on_handoff activity per tool name, so one name cannot
            # carry two different callbacks; a handoff without a callback schedules nothing.
            known_callback = known_handoff.on_handoff if known_handoff is not None else None
            if known_callback is not None and handoff.on_handoff not in (None, known_callback):
                raise ConfigurationError(
                    f"handoff tool {handoff.tool_name!r} has two different on_handoff callbacks",
                    hint="give one of them another name with Handoff(name=...)",
                )
            if known_callback is None:
                self.handoffs[handoff.tool_name] = handoff
            # Runs started before lovia's names call on_handoff by the earlier name: the worker
            # keeps that activity type registered too.
            if handoff.legacy_name != handoff.tool_name and handoff.on_handoff is not None:
                self.handoffs.setdefault(handoff.legacy_name, handoff)
            reached.append(handoff.target)
        self._add_mcp_servers(agent)
        if agent.subagents is not None:
            for name in RESERVED_NAMES - {"relaykit.model_call"}:
                claim(name)
            if agent.subagents.agents:
                reached.extend(agent.subagents.agents)
            else:
                reached.append(
                    agent.clone(
                        name=clone_name(agent),
                        subagents=None,
                        handoffs=[],
                        description=agent.description or f"a copy of {agent.name}",
                    )
                )
        return reached

    def _add_mcp_servers(self, agent: Agent) -> None:
        """Server names are unique in the graph (they name activities and sessions); the tools
        they list are only known at run time, where name collisions are resolved
        (:mod:`relaykit.workflows.mcp_tools`), so here only the prefixes of one agent's servers
        must differ."""
        prefixes: dict[str, str] = {}
        for server in agent.mcp_servers:
            if not isinstance(server, MCPServer):
                raise ConfigurationError(f"agent {agent.name!r}: {server!r} is not an MCPServer")
            known = self.mcp_servers.get(server.name)
            if known is not None and known is not server:
                raise ConfigurationError(
                    f"two different MCP servers are named {server.name!r}",
                    hint="server names name their activities and worker sessions; use one "
                    "MCPServer object for both agents, or give one another name",
                )
            self.mcp_servers[server.name] = server
            other = prefixes.get(server.tool_prefix)
            if other is not None and other != server.name and server.tool_prefix:
                raise ConfigurationError(
                    f"MCP servers {other!r} and {server.name!r} of agent {agent.name!r} both "
                    f"put {server.tool_prefix!r} before their tool names",
                    hint="give one of them another prefix with MCPServer.stdio(..., prefix=...)",
                )
            prefixes[server.tool_prefix] = server.name

    def subagent_clone(self, agent: Agent) -> Agent:
        """The agent ``Subagents()`` without agents spawns: ``agent`` without its subagents
        capability and handoffs (so it cannot spawn recursively)."""
        return self.agents[clone_name(agent)]

    def agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            raise KeyError(
                f"unknown agent {name!r}; this worker serves: {', '.join(sorted(self.agents))}"
            ) from None

    def model_for(self, agent: Agent) -> ModelSpec:
        spec = agent.model if isinstance(agent.model, ModelSpec) else self.default_model
        assert spec is not None  # checked in build()
        return spec
