"""The workflow side of MCP servers: list each server's tools once per workflow run, show them to
the model under normalised names, and run each call as an activity (after an approval when the
server's rule asks for one).

Everything here is deterministic: names and collisions are resolved from the recorded listing,
in the order the agent lists its servers and the server lists its tools.
"""

from __future__ import annotations

import asyncio
import json
from typing import TYPE_CHECKING

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from relaykit import errors
from relaykit.handoff import own_tool_names
from relaykit.mcp import (
    MCPCallRequest,
    MCPListing,
    MCPListRequest,
    MCPServer,
    MCPToolEntry,
    disambiguate,
)
from relaykit.messages import Message, ToolCall, ToolSpec
from relaykit.tools import ToolOutcome, summarize_call
from relaykit.workflows import tool_outcome

if TYPE_CHECKING:
    from relaykit.agent import Agent
    from relaykit.workflows.loop import TurnLoop


class MCPTools:
    """MCP tools of the agents of one workflow run (listings live as long as the run)."""

    def __init__(self, loop: TurnLoop) -> None:
        self.loop = loop
        self._listings: dict[str, MCPListing] = {}
        self._entries: dict[str, dict[str, MCPToolEntry]] = {}

    @staticmethod
    def servers(agent: Agent) -> list[MCPServer]:
        return list(getattr(agent, "mcp_servers", None) or [])

    async def prepare(self, agent: Agent) -> None:
        """List the tools of the agent's servers not listed yet in this workflow run (before the
        model call that must show them)."""
        missing = [s for s in self.servers(agent) if s.name not in self._listings]
        if not missing:
            return
        listings = await asyncio.gather(*(self._list(agent, server) for server in missing))
        for listing in listings:
            self._listings[listing.server] = listing
        self._entries.pop(agent.name, None)
        self.loop._tool_specs.pop(agent.name, None)

    async def _list(self, agent: Agent, server: MCPServer) -> MCPListing:
        try:
            return await workflow.execute_activity(
                server.list_activity,
                MCPListRequest(server=server.name),
                result_type=MCPListing,
                start_to_close_timeout=server.list_timeout,
                retry_policy=server.retry,
                task_queue=server.task_queue,
                summary=f"list tools of {server.name}",
            )
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            self.loop._fail(
                f"MCP server {server.name!r} (used by agent {agent.name!r}) could not list its "
                f"tools: {detail}",
                errors.MCP_SERVER_UNAVAILABLE,
            )
            raise  # unreachable: _fail raises

    def entries(self, agent: Agent) -> dict[str, MCPToolEntry]:
        """The agent's MCP tools by the name the model sees."""
        known = self._entries.get(agent.name)
        if known is not None:
            return known
        # [lovia semantics] the handoff/agent-tool names this run uses (relaykit.handoff);
        # without a loop (outside a run) today's names
        lovia_names = self.loop is None or self.loop.setup_flag("lovia_tool_names")
        taken = own_tool_names(agent, lovia_names)
        if agent.subagents is not None:
            from relaykit.workflows.children import SUBAGENT_TOOLS

            taken.update(SUBAGENT_TOOLS)
        entries: dict[str, MCPToolEntry] = {}
        for server in self.servers(agent):
            listing = self._listings.get(server.name)
            if listing is None:
                continue
            for info in listing.tools:
                name = server.exposed_name(info.name)
                if name in taken or name in entries:
                    name = disambiguate(name, server.name, info.name)
                entries[name] = MCPToolEntry(server=server, info=info, name=name)
        self._entries[agent.name] = entries
        return entries

    def tool_specs(self, agent: Agent) -> list[ToolSpec]:
        return [
            ToolSpec(name=name, description=entry.info.description, parameters=entry.info.input_schema)
            for name, entry in self.entries(agent).items()
        ]

    def lookup(self, agent: Agent, name: str) -> MCPToolEntry | None:
        if not self.servers(agent):
            return None
        return self.entries(agent).get(name)

    async def run_call(self, agent: Agent, entry: MCPToolEntry, call: ToolCall) -> Message:
        loop = self.loop
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return loop.tool_message(
                call, f"Invalid JSON arguments for tool {call.name!r}: {exc}. Fix them and call it again.",
                is_error=True,
            )
        if not isinstance(arguments, dict):
            return loop.tool_message(
                call, f"Arguments for tool {call.name!r} must be a JSON object.", is_error=True
            )
        server = entry.server
        if server.requires_approval(entry.info.name, arguments):
            refusal = await loop.approve_or_refuse(agent, entry, call)
            if refusal is not None:
                return refusal
        request = MCPCallRequest(
            server=server.name,
            tool=entry.info.name,
            call_id=call.id,
            arguments=call.arguments,
            agent=agent.name,
            run_path=loop.state.run_path,
            # [tool effects] the effect recorded with the listing (relaykit.workflows.tool_outcome)
            **tool_outcome.invocation_fields(loop, call, entry.info.effect, server.on_unknown),
        )

        async def execute(sent: MCPCallRequest) -> ToolOutcome:
            return await workflow.execute_activity(
                server.call_activity(entry.info.name),
                sent,
                result_type=ToolOutcome,
                # One attempt may have to restart a dead server before sending the request.
                start_to_close_timeout=server.timeout + server.list_timeout,
                heartbeat_timeout=server.heartbeat_timeout,
                retry_policy=server.retry,
                task_queue=server.task_queue,
                summary=tool_outcome.summary(
                    summarize_call(f"{server.name}.{entry.info.name}", call.arguments), sent
                ),
            )

        try:
            # [tool effects] a "write" call lost in flight is reported or asked about, not rerun
            outcome = await tool_outcome.run_guarded(
                loop, agent, entry, call, request, execute,
                what=f"MCP tool {server.name}/{entry.info.name}",
            )
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            return loop.tool_message(
                call,
                f"Tool {call.name!r} (MCP server {server.name!r}) failed and was not retried "
                f"further: {detail}",
                is_error=True,
            )
        return loop.tool_message(call, outcome.content, is_error=outcome.is_error)


__all__ = ["MCPTools"]
