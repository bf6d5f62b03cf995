"""Which kind of tool answers a name: an agent's tool table, and the stand-ins of replay.

The table is built from the agent's definition (function tools, agents as tools, handoffs, the
subagent tools, the MCP tools its servers listed), once per agent. A run replaying a call of a
tool that today's code no longer defines gets a *stand-in*: the kind it was when the model was
offered it, read from the route the model call recorded (:mod:`relaykit.workflows.call_record`),
so that the replay issues the commands the history holds.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from relaykit.agent import Agent, AgentTool
from relaykit.handoff import as_handoff
from relaykit.messages import ToolCall, ToolSpec
from relaykit.tool_args import SUBAGENT_TOOLS
from relaykit.tools import Tool
from relaykit.workflows.agent_tools import AgentToolKind, ChildIds
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.call_record import (
    ROUTE_AGENT,
    ROUTE_HANDOFF,
    ROUTE_SUBAGENTS,
    parse_route,
    stand_in_agent_tool,
    stand_in_handoff,
    stand_in_tool,
)
from relaykit.workflows.function_tools import FunctionTool
from relaykit.workflows.handoffs import HandoffTool
from relaykit.workflows.mcp_tools import MCPTools
from relaykit.workflows.run_state import Run
from relaykit.workflows.subagent_tasks import SubagentTasks
from relaykit.workflows.subagent_tools import SubagentTool
from relaykit.workflows.tool_kind import ToolKind


@dataclass
class AgentTools:
    """What one agent may call: by name, and the specs the model is shown (in their order)."""

    kinds: dict[str, ToolKind] = field(default_factory=dict)
    specs: list[ToolSpec] = field(default_factory=list)


def build_table(
    run: Run,
    approvals: Approvals,
    tasks: SubagentTasks,
    mcp: MCPTools,
    child_ids: ChildIds,
    agent: Agent,
) -> AgentTools:
    """What ``agent`` may call; it depends only on code (and the run's recorded listings)."""
    lovia_names = run.setup_flag("lovia_tool_names")  # [lovia semantics] names, aliases
    kinds: list[ToolKind] = []
    aliases: list[ToolKind] = []
    for entry in agent.tools:
        if isinstance(entry, AgentTool):
            kinds.append(AgentToolKind(run, entry, child_ids, entry.run_name(lovia_names)))
            if lovia_names and entry.legacy_name != entry.name:  # a call recorded before
                aliases.append(AgentToolKind(run, entry, child_ids, entry.legacy_name))
        elif isinstance(entry, Tool):
            kinds.append(FunctionTool(run, approvals, agent, entry))
    handoffs: list[ToolKind] = []
    handoff_aliases: list[ToolKind] = []
    for handoff in map(as_handoff, agent.handoffs):
        own = handoff.run_name(lovia_names)
        handoffs.append(
            HandoffTool(run, agent.name, handoff, own, own, approvals=approvals, source=agent)
        )
        if lovia_names and handoff.legacy_name != own:
            handoff_aliases.append(
                HandoffTool(
                    run,
                    agent.name,
                    handoff,
                    handoff.legacy_name,
                    own,
                    approvals=approvals,
                    source=agent,
                )
            )
    subagents: list[ToolKind] = []
    if agent.subagents is not None:
        shown = {spec.name: spec for spec in tasks.tool_specs(agent)}
        subagents = [
            SubagentTool(run, tasks, agent, name, shown.get(name)) for name in SUBAGENT_TOOLS
        ]
    listed: list[ToolKind] = list(mcp.kinds(run, approvals, agent))
    table = AgentTools()
    for kind in [*kinds, *handoffs, *subagents, *listed]:
        spec = kind.spec()
        if spec is not None:
            if kind.route is not None and run.setup_flag("recorded_calls"):
                spec = spec.model_copy(update={"route": kind.route})
            table.specs.append(spec)
    # Which kind answers a name (a later one wins): MCP tools (whose names avoid all the
    # others), the subagent tools, agent tools by the name an earlier run used, function and
    # agent tools, handoffs by their earlier name, handoffs.
    for kind in [*listed, *subagents, *aliases, *kinds]:
        table.kinds[kind.name] = kind
    for kind in handoff_aliases:  # never in place of another handoff's own name
        if not (kind.name in table.kinds and table.kinds[kind.name].barrier):
            table.kinds[kind.name] = kind
    for kind in handoffs:
        table.kinds[kind.name] = kind
    return table


def stand_in(
    run: Run,
    approvals: Approvals,
    tasks: SubagentTasks,
    child_ids: ChildIds,
    agent: Agent,
    call: ToolCall,
    routes: dict[str, str],
) -> ToolKind:
    """The kind a call replays as when today's code no longer defines its tool: what the
    model was offered then, as the model call recorded it (``ModelResponse.routes``)."""
    found = parse_route(routes.get(call.name))
    if found.kind == ROUTE_HANDOFF:
        handoff = stand_in_handoff(call, found)
        return HandoffTool(
            run, agent.name, handoff, call.name, call.name, approvals=approvals, source=agent
        )
    if found.kind == ROUTE_AGENT:
        entry = stand_in_agent_tool(call, found.target)
        return AgentToolKind(run, entry, child_ids, call.name)
    if found.kind == ROUTE_SUBAGENTS and agent.subagents is not None:
        return SubagentTool(run, tasks, agent, call.name, None)
    # a function tool: its activity is named like the tool
    return FunctionTool(run, approvals, agent, stand_in_tool(call.name))
