"""MCP servers as a source of durable tools.

``Agent(tools=[MCPServer.stdio("docs", command=[...]), MCPServer.http("tracker", url=...)])``
gives the agent every tool the server lists. This module is configuration and the shapes that
travel through Temporal; it never imports the ``mcp`` SDK, so workflow code can read it. The
worker side (sessions, subprocesses, the activity) is :mod:`relaykit.activities.mcp_activities`,
the workflow side :mod:`relaykit.workflows.mcp_tools`.

How a run sees a server (see ``docs/mcp.md``):

- The tool list is an activity (``mcp:<server>:list_tools``) run before the first model call of
  each workflow run that needs it; its result is in history, so replay never asks the server.
  A new workflow run (continue-as-new) lists again, which is when a changed server shows up.
- Each call is an activity named ``mcp:<server>/<tool>`` (one dynamic activity serves them all,
  because tool names are only known at run time).
- The model sees ``<prefix><tool>`` (prefix defaults to the server name and ``_``), normalised
  like handoff tool names when the result is not a name every provider accepts.
- Each tool's effect (``"read"``, ``"idempotent"``, ``"write"``, as for ``@tool``) comes from the
  server's annotations (``readOnlyHint`` → read, ``idempotentHint`` → idempotent, otherwise
  write), overridden by ``effects={"tool": "read"}``; it is decided by the list activity, so it
  is recorded with the listing. A ``"write"`` call lost in flight is not run again
  (``on_unknown``, :mod:`relaykit.workflows.tool_outcome`).
"""

from __future__ import annotations

import hashlib
import os
import re
import string
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, Field
from temporalio.common import RetryPolicy

from relaykit.errors import ConfigurationError
from relaykit.messages import CompactModel
from relaykit.names import MAX_TOOL_NAME, is_valid_tool_name, slug, tool_name_for
from relaykit.schedule_options import check_call_options, duration, retry_policy
from relaykit.tools import (
    DEFAULT_MAX_OUTPUT_CHARS,
    DEFAULT_TOOL_HEARTBEAT_TIMEOUT,
    OnUnknown,
    ToolEffect,
    check_effect,
)

ACTIVITY_PREFIX = "mcp:"
LIST_SUFFIX = ":list_tools"
DEFAULT_MCP_TIMEOUT = timedelta(minutes=2)
DEFAULT_MCP_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=300),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=10),
    maximum_attempts=5,
)
"""A dead server is restarted on the next attempt; five attempts bound how long a server that
cannot start keeps a call (and so a run) waiting before the model gets an error result."""

_SERVER_NAME = re.compile(r"^[^/:\s][^/:]*$")

ApprovalRule = bool | Collection[str] | Callable[[str, dict[str, Any]], bool]
"""``True``/``False``, the names (as the server spells them) of tools that need approval, or a
predicate ``(tool_name, arguments) -> bool`` (it runs in workflow code: keep it deterministic)."""


@dataclass(eq=False)
class MCPServer:
    """An MCP server whose tools an agent may call. Build it with :meth:`stdio` or :meth:`http`.

    Only this configuration lives in the worker's code; nothing here enters workflow history
    except the server's name and the tools it lists. Secrets (HTTP headers, a stdio server's
    environment) are read from the worker's environment when the session opens.
    """

    name: str
    transport: Literal["stdio", "http"]
    command: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    """Fixed environment for a stdio server (not secrets: use ``env_from_env``)."""
    env_from_env: list[str] = field(default_factory=list)
    """Names of worker environment variables passed on to a stdio server."""
    cwd: str | None = None
    url: str | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """Fixed HTTP headers (not secrets: use ``headers_from_env``)."""
    headers_from_env: dict[str, str] = field(default_factory=dict)
    """HTTP header -> environment variable name (``{"X-Api-Key": "TRACKER_KEY"}``), or a template
    using ``$NAME`` (``{"Authorization": "Bearer $TRACKER_TOKEN"}``); read by the worker."""
    prefix: str | None = None
    """Put before every tool name the model sees (default: the server's name and ``_``)."""
    include: Collection[str] | None = None
    """Only these tools (server spelling) are offered to the model."""
    needs_approval: ApprovalRule = False
    approval_timeout: timedelta | None = None
    timeout: timedelta = DEFAULT_MCP_TIMEOUT
    """start-to-close timeout of one call attempt (also the MCP request's read timeout)."""
    list_timeout: timedelta = timedelta(seconds=60)
    """One attempt of listing the tools, including starting the server."""
    heartbeat_timeout: timedelta | None = None
    """The worker heartbeats while a call runs, so a dead worker is noticed after this long
    instead of after ``timeout`` (``None`` means :data:`relaykit.tools.DEFAULT_TOOL_HEARTBEAT_
    TIMEOUT`, 10 s, as for Python tools; ``timedelta(0)`` turns heartbeat timeouts off)."""
    retry: RetryPolicy = field(default_factory=lambda: DEFAULT_MCP_RETRY)
    task_queue: str | None = None
    """Run this server's activities (and so its process) on workers of another task queue."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    effects: Mapping[str, ToolEffect] = field(default_factory=dict)
    """Tool name (server spelling) -> effect, overriding what the server's annotations say."""
    on_unknown: OnUnknown = "report"
    """What happens to a ``"write"`` call of this server whose outcome is unknown (as for
    ``@tool``): ``"report"`` to the model, or ``"ask"`` a person whether it runs again."""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _SERVER_NAME.match(self.name.strip() or "/"):
            raise ConfigurationError(
                f"invalid MCP server name {self.name!r}",
                hint="a non-empty name without '/' or ':' (it names the server's activities)",
            )
        if self.transport == "stdio" and not self.command:
            raise ConfigurationError(f"MCP server {self.name!r} needs a command")
        if self.transport == "http" and not self.url:
            raise ConfigurationError(f"MCP server {self.name!r} needs a url")
        self.effects = dict(self.effects)
        for tool_name, effect in self.effects.items():
            check_effect(effect, self.on_unknown, f"tool {tool_name!r} of MCP server {self.name!r}")
        check_effect("write", self.on_unknown, f"MCP server {self.name!r}")
        if self.heartbeat_timeout is None:
            self.heartbeat_timeout = DEFAULT_TOOL_HEARTBEAT_TIMEOUT
        owner = f"MCP server {self.name!r}"
        check_call_options(self, owner)
        self.retry = retry_policy(self.retry, f"retry of {owner}")
        self.list_timeout = duration(self.list_timeout, f"list_timeout of {owner}")
        if self.prefix is not None and self.prefix and not is_valid_tool_name(self.prefix):
            raise ConfigurationError(
                f"invalid tool prefix {self.prefix!r} for MCP server {self.name!r}",
                hint="use A-Z, a-z, 0-9, _ and - only",
            )

    @classmethod
    def stdio(
        cls,
        name: str,
        command: Sequence[str],
        *,
        env: Mapping[str, str] | None = None,
        env_from_env: Sequence[str] = (),
        cwd: str | os.PathLike[str] | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server the worker runs as its own subprocess (started at the first request, stopped
        with the worker, restarted after it died)."""
        return cls(
            name=name,
            transport="stdio",
            command=[str(part) for part in command],
            env=dict(env or {}),
            env_from_env=list(env_from_env),
            cwd=os.fspath(cwd) if cwd is not None else None,
            **options,  # numbers for durations are seconds, as in @tool
        )

    @classmethod
    def http(
        cls,
        name: str,
        url: str,
        *,
        headers: Mapping[str, str] | None = None,
        headers_from_env: Mapping[str, str] | None = None,
        **options: Any,
    ) -> MCPServer:
        """A server reached over streamable HTTP; one session per worker."""
        return cls(
            name=name,
            transport="http",
            url=url,
            headers=dict(headers or {}),
            headers_from_env=dict(headers_from_env or {}),
            **options,  # numbers for durations are seconds, as in @tool
        )

    def __repr__(self) -> str:
        return f"MCPServer(name={self.name!r}, transport={self.transport!r})"

    # --- names ----------------------------------------------------------------------------------

    @property
    def tool_prefix(self) -> str:
        if self.prefix is not None:
            return self.prefix
        base = slug(self.name)
        return f"{base}_" if base else f"mcp_{_digest(self.name)}_"

    def exposed_name(self, tool: str) -> str:
        """The name the model sees for ``tool``: prefix + name when providers accept it, else the
        normalisation handoff tools use (slug plus a digest of the original)."""
        candidate = f"{self.tool_prefix}{tool}"
        if is_valid_tool_name(candidate):
            return candidate
        return tool_name_for(self.tool_prefix, tool, fallback="tool")

    def call_activity(self, tool: str) -> str:
        return f"{ACTIVITY_PREFIX}{self.name}/{tool}"

    @property
    def list_activity(self) -> str:
        return f"{ACTIVITY_PREFIX}{self.name}{LIST_SUFFIX}"

    # --- rules ----------------------------------------------------------------------------------

    def offers(self, tool: str) -> bool:
        return self.include is None or tool in self.include

    def effect_of(self, tool: str, annotations: Any = None) -> ToolEffect:
        """The effect of ``tool``: the override, else its annotations (worker side, at listing)."""
        if tool in self.effects:
            return self.effects[tool]
        if annotations is not None and getattr(annotations, "read_only_hint", None):
            return "read"
        if annotations is not None and getattr(annotations, "idempotent_hint", None):
            return "idempotent"
        return "write"

    def requires_approval(self, tool: str, arguments: dict[str, Any]) -> bool:
        rule = self.needs_approval
        if isinstance(rule, bool):
            return rule
        if callable(rule):
            return bool(rule(tool, arguments))
        return tool in rule

    # --- worker side (never called from workflow code) ------------------------------------------

    def resolved_headers(self) -> dict[str, str]:
        """Fixed headers plus those read from the environment (raises ``LookupError`` naming a
        missing variable, never showing a value)."""
        headers = dict(self.headers)
        for header, source in self.headers_from_env.items():
            headers[header] = _from_env(source, f"header {header!r} of MCP server {self.name!r}")
        return headers

    def resolved_env(self) -> dict[str, str]:
        env = dict(self.env)
        for name in self.env_from_env:
            env[name] = _from_env(name, f"the environment of MCP server {self.name!r}")
        return env


def _from_env(source: str, what: str) -> str:
    if "$" in source:
        template = string.Template(source)
        missing = [n for n in template.get_identifiers() if n not in os.environ]
        if missing:
            raise LookupError(f"environment variable {missing[0]} (for {what}) is not set")
        return template.substitute(os.environ)
    value = os.environ.get(source)
    if value is None:
        raise LookupError(f"environment variable {source} (for {what}) is not set")
    return value


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:8]


def disambiguate(name: str, server: str, tool: str) -> str:
    """A second name for a tool whose exposed name is taken (stable: a digest of its origin)."""
    suffix = _digest(f"{server}/{tool}")
    return f"{name[: MAX_TOOL_NAME - len(suffix) - 1].rstrip('_')}_{suffix}"


# --- activity payloads (persisted in history: compatibility data) --------------------------------


class MCPToolInfo(CompactModel):
    """One tool as the server listed it."""

    name: str
    description: str = ""
    input_schema: dict[str, Any] = Field(
        default_factory=lambda: {"type": "object", "properties": {}}
    )
    effect: ToolEffect = "write"
    """Decided when the tool was listed (annotations, then the server's ``effects``); listings
    recorded before tools had effects read as ``"write"``."""


class MCPListRequest(BaseModel):
    server: str


class MCPListing(BaseModel):
    """The result of the list activity: what the server offered when the run asked."""

    server: str
    tools: list[MCPToolInfo] = Field(default_factory=list)


class MCPCallRequest(CompactModel):
    """The input of a call activity."""

    server: str
    tool: str
    call_id: str
    arguments: str = "{}"
    agent: str = ""
    run_path: list[str] = Field(default_factory=list)
    idempotency_key: str = ""
    """As for function tools (:attr:`relaykit.ToolContext.idempotency_key`); MCP tools cannot
    read it, it shows in the Temporal UI input."""
    effect: ToolEffect | None = None
    """The recorded effect; ``None`` in requests recorded before tools had effects."""
    on_unknown: OnUnknown = "report"
    """The call's choice for an unknown outcome, recorded with its effect."""
    rerun_approved: bool = False
    """A person approved running the call again after an attempt whose outcome was unknown."""


@dataclass(eq=False)
class MCPToolEntry:
    """A listed tool as one agent sees it (workflow side; read by the approval path)."""

    server: MCPServer
    info: MCPToolInfo
    name: str

    @property
    def approval_timeout(self) -> timedelta | None:
        return self.server.approval_timeout


__all__ = [
    "MCPCallRequest",
    "MCPListRequest",
    "MCPListing",
    "MCPServer",
    "MCPToolEntry",
    "MCPToolInfo",
]
