"""The transport of :mod:`relaykit.models.http_transport`: httpx requests sent through aiohttp's
connection pool, and a model call's plain request sent through it directly, each aiohttp failure
raised as the httpx error httpx's own transport raises for it (the kind decides whether a model
call is retried)."""

from __future__ import annotations

import asyncio
import functools
import ssl
from collections.abc import AsyncIterator, Mapping

import aiohttp
import httpx

from relaykit.models.http_transport import Answer


class AiohttpTransport(httpx.AsyncBaseTransport):
    """Sends httpx requests through one aiohttp session, created in the event loop that uses it
    (a session belongs to its loop; a worker has one, a test suite many)."""

    def __init__(self, *, ssl_context: ssl.SSLContext, max_connections: int = 200) -> None:
        self.ssl_context = ssl_context
        self.max_connections = max_connections
        self._session: aiohttp.ClientSession | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def _session_for_this_loop(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._session is None or self._loop is not loop or self._session.closed:
            self._loop = loop
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(
                    limit=self.max_connections, ssl=self.ssl_context, keepalive_timeout=5.0
                ),
                cookie_jar=aiohttp.DummyCookieJar(),  # a model client keeps no cookies
                auto_decompress=False,  # httpx decodes the body (a direct post asks aiohttp)
                trust_env=False,  # proxies: see model_http_client; no ~/.netrc credentials
            )
        return self._session

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        session = self._session_for_this_loop()
        timeout = request.extensions.get("timeout", {})
        try:
            response = await session.request(
                request.method,
                str(request.url),
                headers=list(request.headers.multi_items()),
                data=await request.aread() or None,
                allow_redirects=False,
                compress=False,
                timeout=aiohttp.ClientTimeout(
                    connect=timeout.get("pool"),
                    sock_connect=timeout.get("connect"),
                    sock_read=timeout.get("read"),
                ),
            )
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx_error(exc, request) from exc
        return httpx.Response(
            status_code=response.status,
            headers=response.raw_headers,
            stream=_ResponseBody(response, request),
            request=request,
            extensions={
                "http_version": b"HTTP/1.1",
                "reason_phrase": (response.reason or "").encode(),
            },
        )

    async def post(
        self, url: str, content: bytes, headers: Mapping[str, str], timeout: float
    ) -> Answer:
        """POST ``content`` and read the whole answer, without httpx's per-request work: the
        model call's common case (a non-streaming call), at about half the CPU of the same
        request through :meth:`handle_async_request` (``bench/README.md``, "A model call
        straight through aiohttp"). The URL is read as httpx reads it, so a bad base URL
        fails in the same words on both paths."""
        session = self._session_for_this_loop()
        try:
            async with session.post(
                _sendable(url),
                data=content,
                headers=headers,
                allow_redirects=False,
                compress=False,
                auto_decompress=True,
                timeout=_client_timeout(timeout),
            ) as response:
                body = await response.read()
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx_error(exc, httpx.Request("POST", url)) from exc
        headers_seen = [
            (name, value)
            for name, value in response.raw_headers
            if name.lower() not in _DECODED  # the body is decoded already
        ]
        return Answer(
            response.status,
            body,
            lambda: httpx.Response(
                status_code=response.status,
                headers=headers_seen,
                content=body,
                request=httpx.Request("POST", url),
                extensions={
                    "http_version": b"HTTP/1.1",
                    "reason_phrase": (response.reason or "").encode(),
                },
            ),
        )

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None


class _ResponseBody(httpx.AsyncByteStream):
    def __init__(self, response: aiohttp.ClientResponse, request: httpx.Request) -> None:
        self._response = response
        self._request = request

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.content.iter_any():
                yield chunk
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise _as_httpx_error(exc, self._request) from exc

    async def aclose(self) -> None:
        # A body read to its end has already returned the connection to the pool; one read
        # only in part closes it, so nothing half-read is reused.
        self._response.release()


_DECODED = (b"content-encoding", b"content-length")


@functools.lru_cache(maxsize=64)
def _client_timeout(seconds: float) -> aiohttp.ClientTimeout:
    """``httpx.Timeout(seconds)`` in aiohttp's terms, as :meth:`AiohttpTransport.
    handle_async_request` maps it (a worker's calls share a handful of timeouts)."""
    return aiohttp.ClientTimeout(connect=seconds, sock_connect=seconds, sock_read=seconds)


@functools.lru_cache(maxsize=256)
def _sendable(url: str) -> str:
    """``url`` as httpx sends it, or the error httpx raises for it (each endpoint's URL is
    parsed once): the same words on both paths for a base URL that cannot work."""
    parsed = httpx.URL(url)  # httpx.InvalidURL
    if not parsed.is_absolute_url:  # httpx sends it as a path without a scheme
        raise httpx.UnsupportedProtocol(_protocol_words(""), request=httpx.Request("POST", url))
    if parsed.scheme not in ("http", "https"):
        raise httpx.UnsupportedProtocol(
            _protocol_words(parsed.scheme), request=httpx.Request("POST", url)
        )
    return str(parsed)


def _protocol_words(scheme: str) -> str:
    """httpx's words for a URL it cannot send (aiohttp's name only the URL)."""
    if scheme:
        return f"Request URL has an unsupported protocol '{scheme}://'."
    return "Request URL is missing an 'http://' or 'https://' protocol."


def _as_httpx_error(exc: BaseException, request: httpx.Request) -> httpx.TransportError:
    """The httpx error httpx's own transport raises for the same failure."""
    message = str(exc) or type(exc).__name__
    kind: type[httpx.TransportError]
    if isinstance(exc, aiohttp.ConnectionTimeoutError):
        kind = httpx.ConnectTimeout
    elif isinstance(exc, aiohttp.SocketTimeoutError):
        kind = httpx.ReadTimeout
    elif isinstance(exc, TimeoutError):
        kind = httpx.PoolTimeout  # waited for a free connection (aiohttp's "connect" timeout)
    elif isinstance(exc, (aiohttp.NonHttpUrlClientError, aiohttp.InvalidUrlClientError)):
        kind = httpx.UnsupportedProtocol
        message = _protocol_words(request.url.scheme)
    elif isinstance(exc, aiohttp.ClientConnectorError):  # refused, DNS, TLS certificate
        kind = httpx.ConnectError
    elif isinstance(exc, aiohttp.ServerDisconnectedError):
        kind = httpx.RemoteProtocolError
    elif isinstance(exc, (aiohttp.ClientPayloadError, aiohttp.ClientOSError)):
        kind = httpx.ReadError
    elif isinstance(exc, aiohttp.ClientResponseError):  # a response aiohttp could not parse
        kind = httpx.RemoteProtocolError
    else:
        kind = httpx.NetworkError
    return kind(message, request=request)
