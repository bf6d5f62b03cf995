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

What stays with httpx: cookies, redirects (not followed), content decoding, the JSON body and
the response's parsing. A worker whose environment names an HTTP proxy keeps httpx's own
transport (see :func:`model_http_client`), which honours ``HTTPS_PROXY`` and ``NO_PROXY``.
"""

from __future__ import annotations

import os
import ssl

import httpx

PROXY_VARIABLES = (
    "http_proxy",
    "https_proxy",
    "all_proxy",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "ALL_PROXY",
)
"""Any of these set makes a worker's model client httpx's own transport (it honours them)."""


def model_http_client(
    *, timeout: httpx.Timeout, max_connections: int, verify: ssl.SSLContext
) -> httpx.AsyncClient:
    """The HTTP client a worker's model calls share."""
    if _environment_names_a_proxy():
        return httpx.AsyncClient(
            timeout=timeout,
            limits=httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            ),
            verify=verify,
        )
    from relaykit.models.aiohttp_transport import AiohttpTransport  # a worker's, not the CLI's

    return httpx.AsyncClient(
        timeout=timeout,
        transport=AiohttpTransport(ssl_context=verify, max_connections=max_connections),
    )


def _environment_names_a_proxy() -> bool:
    return any(os.environ.get(name) for name in PROXY_VARIABLES)
