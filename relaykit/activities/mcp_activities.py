"""The worker side of MCP servers: one session per server per worker, and the activity that
lists tools and calls them.

Sessions are stateful and belong to the worker, not to a run: a stdio server is a subprocess
started by the first request that needs it and stopped when the worker stops; an HTTP server
gets one MCP session. Each session lives in a task of its own (the SDK's transports are anyio
task groups, which must be entered and left by the same task), and activities send requests
through it concurrently.

A session that broke (the process died, the HTTP server went away) is noticed in two ways: its
read stream ended, or a request failed with a connection error. A request that finds the session
already broken never reached the server, so it reconnects and sends in the same attempt; a
request that was in flight when the connection broke may or may not have run, so it fails the
attempt and Temporal retries it (at-least-once for that call, as for any activity whose worker
died). Calls that completed are in history and never run again. Before a ``"write"`` is sent, a
listing checks that its server is still there: a process killed a moment ago is noticed by that
probe, not by the call.

A ``"write"`` call records that its request is sent before it sends it, and an attempt that
finds an earlier one lost after sending does not send it again: the outcome is unknown
(:mod:`relaykit.activities.attempts`). A broken connection or a timeout during such a request is
itself an unknown outcome (the server may have run it): the attempt fails with
``ToolOutcomeUnknown`` at once; only a failure before the request was sent lets the next attempt
send it. A stdio server is started so that it dies with its worker (Linux:
``PR_SET_PDEATHSIG``, :mod:`relaykit.activities.mcp_launch`): a server orphaned by a killed worker
would otherwise finish its call after the worker is gone.

Classification, as for Python tools: an ``isError`` result or an error the server answered
(unknown tool, invalid arguments) becomes an error result the model reads; a broken connection,
a timeout or a server that cannot start raises, so Temporal retries with the server's policy and
after the last attempt the model reads an error result.
"""

from __future__ import annotations

import asyncio
import contextvars
import json
import logging
from collections.abc import Sequence
from typing import Any

# Imported when the worker starts (this module is imported only for graphs with MCP servers):
# importing the SDK takes seconds, which must not stall the event loop in the middle of a call.
import httpx2
import mcp
import mcp.client.stdio
import mcp.client.streamable_http
import mcp_types
from temporalio import activity
from temporalio.common import RawValue
from temporalio.exceptions import ApplicationError

from relaykit import errors
from relaykit.activities.attempts import AttemptGuard
from relaykit.activities.gone_tools import answer_gone
from relaykit.activities.heartbeats import attempt_beats
from relaykit.activities.mcp_launch import orphan_safe_command
from relaykit.mcp import (
    ACTIVITY_PREFIX,
    MCPCallRequest,
    MCPListing,
    MCPListRequest,
    MCPServer,
    MCPToolInfo,
)
from relaykit.tools import ToolOutcome, cap_output

logger = logging.getLogger(__name__)

MCP_CONNECTION_LOST = "MCPConnectionLost"
MCP_SERVER_UNAVAILABLE = errors.MCP_SERVER_UNAVAILABLE
MCP_CONFIGURATION = "MCPConfigurationError"
STOP_TIMEOUT_SECONDS = 10.0
_MAX_LIST_PAGES = 100


class _BrokenConnection(Exception):
    """The session broke before or during a request."""


class _StaleSession(Exception):
    """The session's server no longer answers, found before the request was sent."""


class _WatchedTransport:
    """Wraps an SDK transport to notice when the server's side of it ends (EOF on a stdio
    server's stdout), so the next request reconnects instead of failing."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.ended = False

    async def __aenter__(self) -> Any:
        read, write = await self._inner.__aenter__()
        return _WatchedStream(read, self), write

    async def __aexit__(self, *exc_info: Any) -> Any:
        self.ended = True
        return await self._inner.__aexit__(*exc_info)


class _WatchedStream:
    def __init__(self, inner: Any, owner: _WatchedTransport) -> None:
        self._inner = inner
        self._owner = owner

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def __aenter__(self) -> _WatchedStream:
        await self._inner.__aenter__()
        return self

    async def __aexit__(self, *exc_info: Any) -> Any:
        self._owner.ended = True
        return await self._inner.__aexit__(*exc_info)

    def __aiter__(self) -> _WatchedStream:
        return self

    async def __anext__(self) -> Any:
        try:
            return await self._inner.__anext__()
        except BaseException:
            self._owner.ended = True
            raise

    async def receive(self) -> Any:
        try:
            return await self._inner.receive()
        except BaseException:
            self._owner.ended = True
            raise

    async def aclose(self) -> None:
        self._owner.ended = True
        await self._inner.aclose()


class _Session:
    """One open MCP client session, owned by a task of its own."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server
        self.client: Any = None
        self.transport: _WatchedTransport | None = None
        self._stop = asyncio.Event()
        self._ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        # Read by open(), unless it gave up first: never leave an exception unretrieved.
        self._ready.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._task: asyncio.Task[None] | None = None
        self.failed = False

    @property
    def alive(self) -> bool:
        return (
            not self.failed
            and self._task is not None
            and not self._task.done()
            and self.transport is not None
            and not self.transport.ended
        )

    async def open(self, timeout: float) -> None:
        # A fresh context: the owner task must not inherit the activity that happened to start
        # it (it outlives that activity and serves others).
        self._task = asyncio.get_running_loop().create_task(
            self._own(), context=contextvars.Context()
        )
        try:
            await asyncio.wait_for(asyncio.shield(self._ready), timeout)
        except BaseException:
            await self.close()
            raise

    async def _own(self) -> None:
        try:
            self.transport = _WatchedTransport(_transport_for(self.server))
            async with mcp.Client(self.transport, cache=None) as client:
                self.client = client
                self._ready.set_result(None)
                await self._stop.wait()
        except BaseException as exc:  # noqa: BLE001 - the owner reports, never crashes the worker
            if not self._ready.done():
                self._ready.set_exception(_as_exception(exc))
            elif not self._stop.is_set():
                logger.info("MCP server %r: session ended: %s", self.server.name, _describe(exc))
        finally:
            self.failed = True
            if not self._ready.done():
                self._ready.set_exception(_BrokenConnection("the session ended while opening"))

    async def close(self) -> None:
        self._stop.set()
        task = self._task
        if task is not None and not task.done() and not self._ready.done():
            task.cancel()  # still starting: nothing to shut down politely
        if task is not None and not task.done():
            try:
                await asyncio.wait_for(asyncio.shield(task), STOP_TIMEOUT_SECONDS)
            except (TimeoutError, Exception):  # noqa: BLE001
                task.cancel()
        self.failed = True


def _transport_for(server: MCPServer) -> Any:
    if server.transport == "stdio":
        env = server.resolved_env() or None
        command = orphan_safe_command(server.command, env, server.cwd)
        params = mcp.StdioServerParameters(
            command=command[0],
            args=command[1:],
            env=env,
            cwd=server.cwd,
        )
        return mcp.client.stdio.stdio_client(params)
    # The SDK's own defaults: 30 s to connect and write, 5 min to read (a response may stream).
    http = httpx2.AsyncClient(
        headers=server.resolved_headers(), timeout=httpx2.Timeout(30, read=300)
    )
    transport = mcp.client.streamable_http.streamable_http_client(
        server.url or "", http_client=http
    )
    return _OwnedHTTP(transport, http)


class _OwnedHTTP:
    """The streamable HTTP transport plus the HTTP client carrying our headers (closed with it)."""

    def __init__(self, transport: Any, http: Any) -> None:
        self._transport = transport
        self._http = http

    async def __aenter__(self) -> Any:
        await self._http.__aenter__()
        try:
            return await self._transport.__aenter__()
        except BaseException:
            await self._http.__aexit__(None, None, None)
            raise

    async def __aexit__(self, *exc_info: Any) -> Any:
        try:
            return await self._transport.__aexit__(*exc_info)
        finally:
            await self._http.__aexit__(None, None, None)


def _as_exception(exc: BaseException) -> Exception:
    if isinstance(exc, Exception):
        return exc
    return _BrokenConnection(_describe(exc))


def _describe(exc: BaseException) -> str:
    """One line for an error, looking inside the exception groups anyio raises."""
    while isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        exc = exc.exceptions[0]
    text = str(exc) or type(exc).__name__
    return f"{type(exc).__name__}: {text}" if str(exc) else text


class MCPSessions:
    """The sessions of one worker, by server name; closed (processes stopped) with the worker."""

    def __init__(self, servers: dict[str, MCPServer]) -> None:
        self.servers = servers
        self._sessions: dict[str, _Session] = {}
        self._locks: dict[str, asyncio.Lock] = {}
        self.opened = 0
        """How many sessions this worker opened (a restarted server counts again)."""

    async def session(self, server: MCPServer, timeout: float) -> _Session:
        lock = self._locks.setdefault(server.name, asyncio.Lock())
        async with lock:
            current = self._sessions.get(server.name)
            if current is not None and current.alive:
                return current
            if current is not None:
                await current.close()
            try:
                server.resolved_headers() if server.transport == "http" else server.resolved_env()
            except LookupError as exc:  # a missing variable will not appear by retrying here
                raise ApplicationError(
                    str(exc), type=MCP_CONFIGURATION, non_retryable=True
                ) from None
            session = _Session(server)
            try:
                await session.open(timeout)
            except TimeoutError:
                raise ApplicationError(
                    f"MCP server {server.name!r} did not start within {timeout:.0f}s",
                    type=MCP_SERVER_UNAVAILABLE,
                ) from None
            except ApplicationError:
                raise
            except Exception as exc:  # noqa: BLE001
                raise ApplicationError(
                    f"MCP server {server.name!r} could not be reached: {_describe(exc)}",
                    type=MCP_SERVER_UNAVAILABLE,
                ) from None
            self._sessions[server.name] = session
            self.opened += 1
            return session

    def drop(self, server: MCPServer, session: _Session) -> None:
        if self._sessions.get(server.name) is session:
            del self._sessions[server.name]
        session.failed = True
        asyncio.get_running_loop().create_task(session.close(), context=contextvars.Context())

    async def aclose(self) -> None:
        sessions = list(self._sessions.values())
        self._sessions.clear()
        await asyncio.gather(*(s.close() for s in sessions), return_exceptions=True)

    # --- requests -------------------------------------------------------------------------------

    async def _request(self, server: MCPServer, send: Any, timeout: float) -> Any:
        """Send through a live session (opening one if there is none, or if the last one was
        seen to end). A connection that breaks during the request fails the attempt; a session
        the server no longer knows (an HTTP server that restarted answers 404, so the request did
        not run) is replaced and the request sent again, once."""
        for _ in range(2):
            session = await self.session(server, server.list_timeout.total_seconds())
            try:
                return await send(session.client)
            except _StaleSession:
                self.drop(server, session)
                continue
            except mcp.MCPError as exc:
                if exc.error.code == mcp_types.REQUEST_TIMEOUT:  # the session may be fine: keep it
                    raise ApplicationError(
                        f"MCP server {server.name!r} did not answer within {timeout:.0f}s",
                        type=MCP_SERVER_UNAVAILABLE,
                    ) from None
                if _session_unknown(exc):
                    self.drop(server, session)
                    continue
                if exc.error.code != mcp_types.CONNECTION_CLOSED:
                    raise  # the server answered with an error
                self.drop(server, session)
                raise ApplicationError(
                    f"MCP server {server.name!r}: the connection closed during the request",
                    type=MCP_CONNECTION_LOST,
                ) from None
            except Exception as exc:
                if not _is_transport_error(exc):
                    raise
                self.drop(server, session)
                raise ApplicationError(
                    f"MCP server {server.name!r}: the connection broke during the request "
                    f"({_describe(exc)})",
                    type=MCP_CONNECTION_LOST,
                ) from None
        raise ApplicationError(  # the request was not sent: a retry may send it
            f"MCP server {server.name!r} lost the session it had just opened before the request "
            "was sent",
            type=MCP_SERVER_UNAVAILABLE,
        )

    async def list_tools(self, server: MCPServer) -> MCPListing:
        timeout = server.list_timeout.total_seconds()

        async def send(client: Any) -> list[MCPToolInfo]:
            tools: list[MCPToolInfo] = []
            cursor = None
            for _ in range(_MAX_LIST_PAGES):
                page = await asyncio.wait_for(client.list_tools(cursor=cursor), timeout)
                for tool in page.tools:
                    schema = dict(tool.input_schema or {})
                    schema.setdefault("type", "object")
                    if schema.get("type") == "object":
                        schema.setdefault("properties", {})
                    tools.append(
                        MCPToolInfo(
                            name=tool.name,
                            description=tool.description or "",
                            input_schema=schema,
                            effect=server.effect_of(tool.name, tool.annotations),
                        )
                    )
                cursor = page.next_cursor
                if not cursor:
                    break
            return tools

        try:
            tools = await self._request(server, send, timeout)
        except ApplicationError:
            raise
        except Exception as exc:  # noqa: BLE001 - the server answered the list with an error
            raise ApplicationError(
                f"MCP server {server.name!r} could not list its tools: {_describe(exc)}",
                type=MCP_SERVER_UNAVAILABLE,
            ) from None
        return MCPListing(server=server.name, tools=[t for t in tools if server.offers(t.name)])

    async def call_tool(self, server: MCPServer, request: MCPCallRequest) -> ToolOutcome:
        timeout = server.timeout.total_seconds()
        try:
            arguments = json.loads(request.arguments or "{}")
        except ValueError as exc:
            return ToolOutcome(content=f"Invalid JSON arguments: {exc}", is_error=True)
        if not isinstance(arguments, dict):
            return ToolOutcome(content="Arguments must be a JSON object.", is_error=True)

        guard = await AttemptGuard.check(request.effect, f"MCP tool {server.name}/{request.tool}")

        async def send(client: Any) -> Any:
            if request.effect == "write":
                await _probe(client, server)
            await guard.claim()  # from here on the server may run it
            return await client.call_tool(request.tool, arguments, read_timeout_seconds=timeout)

        try:
            result = await self._with_heartbeat(self._request(server, send, timeout))
        except ApplicationError:
            if guard.claimed:  # a "write" sent, then no answer (broken, timed out): it may have run
                raise guard.lost(f"MCP tool {server.name}/{request.tool}") from None
            raise
        except Exception as exc:  # noqa: BLE001
            if isinstance(exc, mcp.MCPError):
                # The server answered with a protocol error: the model may fix its call.
                return ToolOutcome(
                    content=f"MCP server {server.name!r} rejected the call to {request.tool!r}: "
                    f"{exc.error.message} (code {exc.error.code})",
                    is_error=True,
                )
            if isinstance(exc, ValueError):  # e.g. a result that does not follow the protocol
                return ToolOutcome(
                    content=f"MCP server {server.name!r} answered the call to {request.tool!r} "
                    f"with something that is not a valid result: {_describe(exc)[:500]}",
                    is_error=True,
                )
            raise ApplicationError(
                f"MCP call {server.name}/{request.tool} failed: {_describe(exc)}",
                type=MCP_CONNECTION_LOST,
            ) from None
        text = render_result(result)
        return ToolOutcome(
            content=cap_output(text, server.max_output_chars), is_error=bool(result.is_error)
        )

    async def _with_heartbeat(self, coro: Any) -> Any:
        """Heartbeat while a call or a listing runs (each has a heartbeat timeout unless its
        server turned it off), repeating the attempt's start record, which a bare heartbeat
        would erase."""
        info = activity.info() if activity.in_activity() else None
        timeout = info.heartbeat_timeout if info is not None else None
        if not timeout:
            return await coro
        beats = attempt_beats()
        task = asyncio.ensure_future(coro)
        interval = max(timeout.total_seconds() / 3, 0.05)
        try:
            while True:
                done, _ = await asyncio.wait({task}, timeout=interval)
                if done:
                    return task.result()
                beats.beat()
        finally:
            if not task.done():  # the activity was cancelled: so is the request
                task.cancel()

    # --- the activity ---------------------------------------------------------------------------

    def activity(self) -> Any:
        """The dynamic activity serving ``mcp:<server>:list_tools`` and ``mcp:<server>/<tool>``."""
        sessions = self

        @activity.defn(dynamic=True)
        async def relaykit_mcp(args: Sequence[RawValue]) -> Any:
            kind = activity.info().activity_type
            if not kind.startswith(ACTIVITY_PREFIX) or not args:  # e.g. a tool renamed since
                return await answer_gone(kind, args)
            convert = activity.payload_converter()
            raw = convert.from_payload(args[0].payload, dict)
            server = sessions.servers.get(str(raw.get("server")))
            if server is None:
                raise ApplicationError(
                    f"this worker serves no MCP server named {raw.get('server')!r}",
                    type=MCP_CONFIGURATION,
                    non_retryable=True,
                )
            if "tool" in raw:
                request = MCPCallRequest.model_validate(raw)
                outcome = await sessions.call_tool(server, request)
                return outcome.model_dump(mode="json")
            MCPListRequest.model_validate(raw)
            listing = await sessions._with_heartbeat(sessions.list_tools(server))
            return listing.model_dump(mode="json")

        return relaykit_mcp


async def _probe(client: Any, server: MCPServer) -> None:
    """Ask the server for its tools before a ``"write"`` is claimed. A stdio server that died a
    moment ago looks alive until its session reads the end of the pipe, a few event-loop steps
    later, and a write claimed in between would end as an unknown outcome although no server
    ever had it. A probe that finds no server (:class:`_StaleSession`) sends the call to a new
    session in the same attempt. A listing, because every server answers it: ``ping`` is gone
    from the protocol since 2026-07-28."""
    timeout = server.list_timeout.total_seconds()
    try:
        await asyncio.wait_for(client.list_tools(), timeout)
    except TimeoutError:  # alive perhaps, but not answering: this attempt fails, unsent
        raise ApplicationError(
            f"MCP server {server.name!r} did not answer within {timeout:.0f}s",
            type=MCP_SERVER_UNAVAILABLE,
        ) from None
    except mcp.MCPError as exc:
        if exc.error.code == mcp_types.CONNECTION_CLOSED or _session_unknown(exc):
            raise _StaleSession from None
        raise
    except Exception as exc:
        if _is_transport_error(exc):
            raise _StaleSession from None
        raise


def _session_unknown(exc: mcp.MCPError) -> bool:
    """The streamable HTTP transport's answer to a 404 for a session the server does not know."""
    return exc.error.code == mcp_types.INVALID_REQUEST and exc.error.message == "Session terminated"


def _is_transport_error(exc: BaseException) -> bool:
    return isinstance(exc, (OSError, EOFError, _BrokenConnection)) or (
        type(exc).__module__.split(".")[0] in {"anyio", "httpx2", "httpx", "httpcore"}
    )


def render_result(result: Any) -> str:
    """The text the model reads for a ``CallToolResult``: text blocks as they are, embedded text
    resources inline, other media as a short marker; structured content when there is no text."""
    parts: list[str] = []
    for block in result.content or []:
        kind = getattr(block, "type", "")
        if kind == "text":
            parts.append(block.text)
        elif kind == "resource":
            resource = block.resource
            text = getattr(resource, "text", None)
            parts.append(
                text
                if text is not None
                else f"[resource {resource.uri} ({resource.mime_type or 'binary'})]"
            )
        elif kind == "resource_link":
            parts.append(f"[resource {block.uri}]")
        elif kind in ("image", "audio"):
            parts.append(f"[{kind} {block.mime_type}, {len(block.data) * 3 // 4} bytes]")
        else:
            parts.append(f"[{kind or 'content'}]")
    if not parts and result.structured_content is not None:
        return json.dumps(result.structured_content, ensure_ascii=False)
    return "\n".join(parts)
