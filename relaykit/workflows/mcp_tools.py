"""The workflow side of MCP servers: list each server's tools once per workflow run, show them to
the model under normalised names, and run each call as an activity (:class:`MCPTool`, one kind of
tool of the tool path, which asks a person first when the server's rule says so).

Everything here is deterministic: names and collisions are resolved from the recorded listing,
in the order the agent lists its servers and the server lists its tools.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import workflow
from temporalio.exceptions import ActivityError, is_cancelled_exception

from relaykit import errors
from relaykit.agent import Agent
from relaykit.handoff import own_tool_names
from relaykit.mcp import (
    MCPCallRequest,
    MCPListing,
    MCPListRequest,
    MCPServer,
    MCPToolEntry,
    disambiguate,
)
from relaykit.messages import ToolCall, ToolSpec
from relaykit.tool_args import SUBAGENT_TOOLS
from relaykit.tools import ToolOutcome, summarize_call
from relaykit.workflows import tool_outcome
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.run_state import Run
from relaykit.workflows.tool_kind import Prepared, ToolKind, ToolResult


class MCPTools:
    """MCP tools of the agents of one workflow run (listings live as long as the run)."""

    def __init__(self, loop: Any = None) -> None:
        # ``loop`` is accepted (and unused) for callers of the earlier signature.
        self._listings: dict[str, MCPListing] = {}
        self._entries: dict[str, dict[str, MCPToolEntry]] = {}

    @staticmethod
    def servers(agent: Agent) -> list[MCPServer]:
        return list(getattr(agent, "mcp_servers", None) or [])

    async def prepare(self, run: Run, agent: Agent) -> bool:
        """List the tools of the agent's servers not listed yet in this workflow run (before the
        model call that must show them); ``True`` when the agent's tools changed."""
        missing = [s for s in self.servers(agent) if s.name not in self._listings]
        if not missing:
            return False
        listings = await asyncio.gather(*(self._list(run, agent, server) for server in missing))
        for listing in listings:
            self._listings[listing.server] = listing
        self._entries.pop(agent.name, None)
        return True

    async def _list(self, run: Run, agent: Agent, server: MCPServer) -> MCPListing:
        try:
            listing: MCPListing = await workflow.execute_activity(
                server.list_activity,
                MCPListRequest(server=server.name),
                result_type=MCPListing,
                start_to_close_timeout=server.list_timeout,
                # a worker lost while it lists is noticed within seconds, as for a call
                heartbeat_timeout=server.heartbeat_timeout or None,  # timedelta(0): off
                retry_policy=server.retry,
                task_queue=server.task_queue,
                summary=f"list tools of {server.name}",
            )
            return listing
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            run.fail(
                f"MCP server {server.name!r} (used by agent {agent.name!r}) could not list its "
                f"tools: {detail}",
                errors.MCP_SERVER_UNAVAILABLE,
            )

    def entries(self, agent: Agent, lovia_names: bool = True) -> dict[str, MCPToolEntry]:
        """The agent's MCP tools by the name the model sees. ``lovia_names``: the handoff and
        agent-tool names the run uses (``RunSetup.lovia_tool_names``; outside a run, today's)."""
        known = self._entries.get(agent.name)
        if known is not None:
            return known
        taken = own_tool_names(agent, lovia_names)
        if agent.subagents is not None:
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

    def kinds(self, run: Run, approvals: Approvals, agent: Agent) -> list[MCPTool]:
        if not self.servers(agent):
            return []
        entries = self.entries(agent, run.setup_flag("lovia_tool_names"))
        return [MCPTool(run, approvals, agent, entry) for entry in entries.values()]


class MCPTool(ToolKind):
    """One listed tool of an MCP server, called as the activity ``mcp:<server>/<tool>``."""

    def __init__(self, run: Run, approvals: Approvals, agent: Agent, entry: MCPToolEntry) -> None:
        self.run = run
        self.approvals = approvals
        self.agent = agent
        self.entry = entry
        self.name = entry.name
        self.approval_timeout = entry.approval_timeout
        self.max_output_chars = entry.server.max_output_chars
        self.effect = entry.info.effect

    def spec(self) -> ToolSpec:
        info = self.entry.info
        return ToolSpec(name=self.name, description=info.description, parameters=info.input_schema)

    def approval_hint(self, call: ToolCall) -> bool:
        try:
            arguments = json.loads(call.arguments or "{}")
        except Exception:  # noqa: BLE001 - prepare() turns this into an error result
            return False
        if not isinstance(arguments, dict):
            return False
        # user code (a callable rule): the tool path guards it
        return bool(self.entry.server.requires_approval(self.entry.info.name, arguments))

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        try:
            arguments = json.loads(call.arguments or "{}")
        except ValueError as exc:
            return ToolResult(
                f"Invalid JSON arguments for tool {call.name!r}: {exc}. "
                "Fix them and call it again.",
                is_error=True,
            )
        if not isinstance(arguments, dict):
            return ToolResult(
                f"Arguments for tool {call.name!r} must be a JSON object.", is_error=True
            )
        return Prepared(call, arguments)

    async def execute(self, prepared: Prepared) -> ToolResult:
        entry, call = self.entry, prepared.call
        server = entry.server
        request = MCPCallRequest(
            server=server.name,
            tool=entry.info.name,
            call_id=call.id,
            arguments=call.arguments,
            agent=self.agent.name,
            run_path=self.run.state.run_path,
            # [tool effects] the effect recorded with the listing (relaykit.workflows.tool_outcome)
            **tool_outcome.invocation_fields(self.run, call, entry.info.effect, server.on_unknown),
        )

        async def execute(sent: MCPCallRequest) -> ToolOutcome:
            outcome: ToolOutcome = await workflow.execute_activity(
                server.call_activity(entry.info.name),
                sent,
                result_type=ToolOutcome,
                # One attempt may have to restart a dead server before sending the request.
                start_to_close_timeout=server.timeout + server.list_timeout,
                heartbeat_timeout=server.heartbeat_timeout or None,  # timedelta(0): off
                retry_policy=server.retry,
                task_queue=server.task_queue,
                summary=tool_outcome.summary(
                    summarize_call(f"{server.name}.{entry.info.name}", call.arguments), sent
                ),
            )
            return outcome

        try:
            # [tool effects] a "write" call lost in flight is reported or asked about, not rerun
            outcome = await tool_outcome.run_guarded(
                self.run,
                self.approvals,
                self.agent,
                self,
                call,
                request,
                execute,
                what=f"MCP tool {server.name}/{entry.info.name}",
            )
        except ActivityError as exc:
            if is_cancelled_exception(exc):
                raise
            detail = getattr(exc.cause, "message", None) or str(exc)
            return ToolResult(
                f"Tool {call.name!r} (MCP server {server.name!r}) failed and was not retried "
                f"further: {detail}",
                is_error=True,
            )
        return ToolResult(outcome.content, is_error=outcome.is_error)


__all__ = ["MCPTool", "MCPTools"]
