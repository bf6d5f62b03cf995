"""Reading the web from a tool: ``fetch_url`` returns a page as readable text.

The tool is an ordinary :func:`relaykit.tool` (its own activity type, named ``fetch_url``). It
fetches one URL with httpx and turns what came back into text a model can read: HTML becomes
the page title plus its headings, paragraphs and list items (scripts, styles and navigation
dropped, whitespace collapsed); plain text, JSON and XML pass through; binaries are refused.
HTML is parsed by selectolax (:mod:`relaykit.web.text`); the network side, address checks and
bounded reading included, is :mod:`relaykit.web.fetch`.

Safety limits, all set with :func:`make_fetch_url`:

- **No private-network targets.** The host is resolved first (``socket.getaddrinfo`` in a
  thread) and the fetch is refused when any address is loopback, private, link-local, shared,
  multicast, reserved or unspecified, so a model cannot be talked into reading a cloud metadata
  endpoint or an intranet service. The connection then goes to the address that was checked
  (the name still travels in ``Host`` and TLS SNI), so a second DNS answer cannot swap in
  another target. Every redirect hop is checked the same way. ``allow_private=True``, the
  ``allowed_hosts`` list, or the worker's environment (``RELAYKIT_FETCH_ALLOW_PRIVATE=1``,
  ``RELAYKIT_FETCH_ALLOWED_HOSTS=a.example,10.0.0.0/8``) lift the rule. The environment is
  read when the tool runs, i.e. on the worker. Proxy variables (``HTTP_PROXY`` …) are ignored:
  a proxy would resolve the name again, out of reach of the check.
- **Size:** at most ``max_bytes`` of (decoded) body are read; the text is cut to ``max_chars``
  with a marker saying so. Compressed bodies (gzip, deflate) are decompressed step by step up to
  that limit, so a decompression bomb costs no more memory than an ordinary page.
- **Time:** ``connect_timeout`` for each connection, and ``timeout`` for the whole fetch,
  redirects included (a server that trickles bytes cannot hold the tool).
- **Redirects:** at most ``max_redirects`` hops, each one checked.

What the model sees, and what is retried:

- A result it can act on (HTTP 404 and other client errors, a refused host, a timeout, a binary
  file, a name that does not resolve, too many redirects) raises :class:`FetchError`, which
  relaykit turns into an error tool result at once: retrying would give the same answer, and a
  timeout retried three times only triples the wait. The model may try again or choose another
  source.
- A failure a retry may well fix (HTTP 408, 425, 429, 500, 502, 503, 504; a connection refused,
  reset or dropped mid-response; a temporary DNS failure) raises a retryable
  :class:`temporalio.exceptions.ApplicationError` of type ``FetchTransientError``, so Temporal
  retries the activity with backoff (``Retry-After`` is honoured, up to a minute). After the
  last attempt of the tool's retry policy (3 by default) the model gets an error result.
"""

from __future__ import annotations

import ssl
from collections.abc import Sequence

from temporalio.common import RetryPolicy

from relaykit.errors import ConfigurationError
from relaykit.tools import Tool, tool
from relaykit.web.fetch import (
    DEFAULT_CONNECT_TIMEOUT,
    DEFAULT_FETCH_RETRY,
    DEFAULT_MAX_BYTES,
    DEFAULT_MAX_CHARS,
    DEFAULT_MAX_REDIRECTS,
    DEFAULT_TIMEOUT,
    DEFAULT_USER_AGENT,
    ENV_ALLOW_PRIVATE,
    ENV_ALLOWED_HOSTS,
    TRANSIENT_ERROR_TYPE,
    FetchConfig,
    FetchedPage,
    FetchError,
    FetchRefused,
    _HostRules,
    fetch_page,
    is_public_address,
)
from relaykit.web.text import html_to_text, render_page

# --------------------------------------------------------------------------------------------
# The tool
# --------------------------------------------------------------------------------------------


def make_fetch_url(
    *,
    allow_private: bool = False,
    allowed_hosts: Sequence[str] = (),
    max_bytes: int = DEFAULT_MAX_BYTES,
    max_chars: int = DEFAULT_MAX_CHARS,
    timeout: float = DEFAULT_TIMEOUT,
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT,
    max_redirects: int = DEFAULT_MAX_REDIRECTS,
    heartbeat_timeout: float | None = None,
    retry: RetryPolicy | None = DEFAULT_FETCH_RETRY,
    task_queue: str | None = None,
    user_agent: str = DEFAULT_USER_AGENT,
    verify: bool | ssl.SSLContext = True,
    name: str = "fetch_url",
) -> Tool:
    """A ``fetch_url`` tool with its own limits.

    Args:
        allow_private: Also fetch loopback, private, link-local and reserved addresses.
        allowed_hosts: Hosts fetched even when they resolve to such addresses: names
            (``"wiki.internal"``; ``".internal"`` for every subdomain) or IP addresses and
            networks (``"10.1.2.3"``, ``"10.0.0.0/8"``). Public hosts are always allowed.
        max_bytes: Stop reading a body after this many (decoded) bytes.
        max_chars: Cut the text the model reads to this many characters (with a marker).
        timeout: Seconds for the whole fetch, redirects included.
        connect_timeout: Seconds to open each connection.
        max_redirects: Redirect hops followed (each is checked like the first URL).
        heartbeat_timeout: How long a fetch may go without a heartbeat before it is retried
            elsewhere (the tool heartbeats on its own while it runs; ``None`` is the tools'
            default, :data:`relaykit.tools.DEFAULT_TOOL_HEARTBEAT_TIMEOUT`).
        retry: Temporal retry policy for transient failures (HTTP 429/5xx, dropped connections).
        task_queue: Run fetches on workers of another task queue (e.g. machines with egress).
        user_agent: The ``User-Agent`` header sent.
        verify: TLS certificate verification: ``True`` (the default CA bundle), an
            ``ssl.SSLContext`` (e.g. trusting a private CA), or ``False`` (not recommended).
        name: The tool's name (and activity type); tool names are unique in an agent graph,
            so two differently configured fetch tools need two names.
    """
    if max_bytes < 1 or max_chars < 1 or timeout <= 0 or connect_timeout <= 0:
        raise ConfigurationError("make_fetch_url: limits and timeouts must be positive")
    if max_redirects < 0:
        raise ConfigurationError("make_fetch_url: max_redirects must be 0 or more")
    config = FetchConfig(
        allow_private=allow_private,
        allowed_hosts=tuple(allowed_hosts),
        max_bytes=max_bytes,
        max_chars=max_chars,
        timeout=timeout,
        connect_timeout=connect_timeout,
        max_redirects=max_redirects,
        user_agent=user_agent,
        verify=verify,
    )
    _HostRules.build(config, env={})  # reject malformed allowed_hosts entries now

    async def fetch_url(url: str) -> str:
        """Fetch a web page (or a plain-text or JSON document) and return its readable text:
        the final URL, the page title, then headings, paragraphs and list items. Binary files
        (images, PDFs, archives) are refused. Cite the URL shown in the result.

        Args:
            url: The absolute http:// or https:// URL to read.
        """
        page = await fetch_page(url, config)
        return render_page(page, config.max_chars)

    built: Tool = tool(
        fetch_url,
        name=name,
        timeout=timeout + 30,
        heartbeat_timeout=heartbeat_timeout,
        retry=retry,
        task_queue=task_queue,
        max_output_chars=max_chars + 200,  # room for the truncation marker
        effect="read",  # a GET: fetching a page again changes nothing
    )
    built.extra["fetch_config"] = config
    return built


fetch_url = make_fetch_url()
"""The default ``fetch_url``: public web only (unless the worker's environment allows more),
2 MB per body, 20,000 characters of text, 30 s per fetch, 5 redirects."""


__all__ = [
    "DEFAULT_FETCH_RETRY",
    "ENV_ALLOWED_HOSTS",
    "ENV_ALLOW_PRIVATE",
    "TRANSIENT_ERROR_TYPE",
    "FetchConfig",
    "FetchError",
    "FetchRefused",
    "FetchedPage",
    "fetch_page",
    "fetch_url",
    "html_to_text",
    "is_public_address",
    "make_fetch_url",
    "render_page",
]
