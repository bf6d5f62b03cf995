"""The model client's connections: httpx's API over aiohttp's connection pool.

relaykit's provider code speaks httpx (requests, responses, its error types, which decide whether
a failed call is retried). Under load, httpx's own pool is the largest cost relaykit adds to a
turn: its per-request bookkeeping grows with the number of open connections, and every read
passes through anyio's cancel scopes. A worker making 200 model calls at once spent about 2 ms of
CPU per request in it, against 0.3 ms for the same requests sent through aiohttp's pool (C
parser, one asyncio protocol per connection); see ``bench/README.md``, "The model client's
connections". So httpx keeps the API and aiohttp carries the bytes.

httpx-aiohttp offers the same adapter, but maps a refused connection and an untrusted
certificate to ``ConnectTimeout``, which relaykit would report as a model that "did not answer
within 120s"; :mod:`relaykit.models.aiohttp_transport` keeps each failure's kind. It is imported
when a worker builds its model client, so the CLI and the client side never load aiohttp.

A non-streaming call, the common case, skips httpx too (:func:`post`): it is sent on the same
aiohttp pool with httpx's default headers, and only a failure builds httpx's objects (its error
types, the error response the failure is classified from). That halves the CPU of a model
request again. Redirects are not followed on either path, and a worker's model client keeps no
cookies: a model API authenticates by its key, and a cookie one call set must not change what
the next call, for another run, sends.

A worker whose environment names an HTTP proxy keeps httpx's own transport (see
:func:`model_http_client`), which honours ``HTTPS_PROXY`` and ``NO_PROXY``.
"""

from __future__ import annotations

import http.cookiejar
import os
import ssl
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, NamedTuple

import httpx

if TYPE_CHECKING:
    from relaykit.models.aiohttp_transport import AiohttpTransport

PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)
"""Any of these set makes a worker's model client httpx's own transport (it honours them)."""


class Answer(NamedTuple):
    """A model endpoint's whole answer to a plain POST."""

    status_code: int
    content: bytes
    """The body, decoded as the response's ``content-encoding`` says."""
    response: Callable[[], httpx.Response]
    """The answer as an httpx response, built on demand: only a failure needs one."""


class ModelHttpClient(httpx.AsyncClient):
    """An httpx client whose plain POSTs can skip httpx (:func:`post`)."""

    def __init__(self, *, direct: AiohttpTransport | None = None, **kwargs: Any) -> None:
        super().__init__(cookies=_NO_COOKIES, **kwargs)
        self.direct = direct
        self.direct_headers = dict(self.headers)
        """What httpx would send besides a request's own headers (accept, accept-encoding,
        user-agent): both paths look alike to the server."""


def _refuse_every_cookie() -> http.cookiejar.CookieJar:
    return http.cookiejar.CookieJar(http.cookiejar.DefaultCookiePolicy(allowed_domains=[]))


_NO_COOKIES = _refuse_every_cookie()


def model_http_client(
    *, timeout: httpx.Timeout, max_connections: int, verify: ssl.SSLContext
) -> ModelHttpClient:
    """The HTTP client a worker's model calls share."""
    if _environment_names_a_proxy():
        return ModelHttpClient(
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            verify=verify,
        )
    from relaykit.models.aiohttp_transport import AiohttpTransport  # a worker's, not the CLI's

    transport = AiohttpTransport(ssl_context=verify, max_connections=max_connections)
    return ModelHttpClient(direct=transport, timeout=timeout, transport=transport)


async def post(
    http: httpx.AsyncClient,
    url: str,
    content: bytes,
    headers: Mapping[str, str],
    timeout: float,
) -> Answer:
    """POST ``content`` and read the whole answer: straight through aiohttp's pool when
    ``http`` is a worker's model client on it, else through httpx. Failures raise httpx's
    errors on both paths."""
    if isinstance(http, ModelHttpClient) and http.direct is not None:
        merged = http.direct_headers | {name.lower(): value for name, value in headers.items()}
        return await http.direct.post(url, content, merged, timeout)
    response = await http.post(
        url, content=content, headers=headers, timeout=httpx.Timeout(timeout)
    )
    return Answer(response.status_code, response.content, lambda: response)


def _environment_names_a_proxy() -> bool:
    return any(os.environ.get(name) for name in PROXY_VARIABLES)
