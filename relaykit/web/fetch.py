"""Fetching one URL for ``fetch_url``: which addresses may be read, the HTTP exchange, and
the bounded reading and decoding of the body (see :mod:`relaykit.web` for the rules)."""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import ipaddress
import os
import re
import socket
import ssl
import zlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from datetime import timedelta
from email.utils import parsedate_to_datetime
from typing import Any

import httpx
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit.errors import ConfigurationError

DEFAULT_MAX_BYTES = 2_000_000
DEFAULT_MAX_CHARS = 20_000
DEFAULT_TIMEOUT = 30.0
DEFAULT_CONNECT_TIMEOUT = 10.0
DEFAULT_MAX_REDIRECTS = 5
DEFAULT_USER_AGENT = "relaykit-fetch/0.1 (an LLM agent's fetch_url tool)"
DEFAULT_FETCH_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=3,
)
"""Retries of transient failures (``FetchTransientError``); nothing else is retried."""

ENV_ALLOW_PRIVATE = "RELAYKIT_FETCH_ALLOW_PRIVATE"
ENV_ALLOWED_HOSTS = "RELAYKIT_FETCH_ALLOWED_HOSTS"
TRANSIENT_ERROR_TYPE = "FetchTransientError"

TRANSIENT_STATUSES = frozenset({408, 425, 429, 500, 502, 503, 504})
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
MAX_RETRY_AFTER = 60.0
_SNIFF_BYTES = 1024
_READ_CHUNK = 65_536

TEXT_TYPES = frozenset(
    {
        "application/json",
        "application/ld+json",
        "application/xml",
        "application/xhtml+xml",
        "application/rss+xml",
        "application/atom+xml",
        "application/javascript",
        "application/x-javascript",
        "application/x-ndjson",
        "application/yaml",
        "application/x-yaml",
        "application/toml",
        "application/csv",
    }
)
HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})


class FetchError(Exception):
    """A fetch failed in a way the model should hear about (becomes an error tool result)."""


class FetchRefused(FetchError):
    """The URL, its address or its content is not something ``fetch_url`` may read."""


@dataclass(frozen=True)
class FetchConfig:
    """The limits of one ``fetch_url`` tool (see :func:`make_fetch_url`)."""

    allow_private: bool = False
    allowed_hosts: tuple[str, ...] = ()
    max_bytes: int = DEFAULT_MAX_BYTES
    max_chars: int = DEFAULT_MAX_CHARS
    timeout: float = DEFAULT_TIMEOUT
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT
    max_redirects: int = DEFAULT_MAX_REDIRECTS
    user_agent: str = DEFAULT_USER_AGENT
    verify: bool | ssl.SSLContext = True
    """TLS certificate verification (an ``ssl.SSLContext`` for a private CA)."""


# --------------------------------------------------------------------------------------------
# Which addresses may be fetched
# --------------------------------------------------------------------------------------------

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True)
class _HostRules:
    allow_private: bool
    names: tuple[str, ...]
    """Lower-case host names; a leading dot also admits every subdomain."""
    networks: tuple[IPNetwork, ...]

    @classmethod
    def build(cls, config: FetchConfig, env: dict[str, str] | None = None) -> _HostRules:
        env = dict(os.environ) if env is None else env
        allow = config.allow_private or env.get(ENV_ALLOW_PRIVATE, "").strip().lower() in (
            "1",
            "true",
            "yes",
            "on",
        )
        entries = list(config.allowed_hosts)
        entries += [e for e in env.get(ENV_ALLOWED_HOSTS, "").split(",") if e.strip()]
        names: list[str] = []
        networks: list[IPNetwork] = []
        for entry in entries:
            network = _parse_network(entry)
            if network is not None:
                networks.append(network)
            else:
                names.append(_normalise_host_entry(entry))
        return cls(allow, tuple(names), tuple(networks))

    def host_allowed(self, host: str) -> bool:
        host = host.lower().rstrip(".")
        return any(
            host == name or (name.startswith(".") and (host.endswith(name) or host == name[1:]))
            for name in self.names
        )

    def address_allowed(self, address: IPAddress) -> bool:
        return any(address in network for network in self.networks)


def _parse_network(entry: str) -> IPNetwork | None:
    text = entry.strip().strip("[]")
    try:
        return ipaddress.ip_network(text, strict=False)
    except ValueError:
        return None


def _normalise_host_entry(entry: str) -> str:
    name = entry.strip().lower().rstrip(".")
    if name.startswith("*."):
        name = name[1:]
    if not name or "/" in name or ":" in name:
        raise ConfigurationError(
            f"allowed_hosts entry {entry!r} is neither a host name nor an IP address/network",
            hint='use names ("intranet.example", ".example" for subdomains) or networks '
            '("10.0.0.0/8")',
        )
    return name


def is_public_address(address: IPAddress) -> bool:
    """Whether ``address`` is an ordinary public Internet address (the only kind ``fetch_url``
    reads unless configured otherwise)."""
    if isinstance(address, ipaddress.IPv6Address):
        embedded = address.ipv4_mapped or address.sixtofour
        if embedded is None and address in _NAT64:
            embedded = ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
        if embedded is not None and not is_public_address(embedded):
            return False
    return not (
        not address.is_global
        or address.is_private
        or address.is_loopback
        or address.is_link_local
        or address.is_multicast
        or address.is_reserved
        or address.is_unspecified
    )


_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


async def _resolve(host: str, port: int) -> list[IPAddress]:
    try:
        infos = await asyncio.to_thread(
            socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM, socket.IPPROTO_TCP
        )
    except socket.gaierror as exc:
        if exc.errno == socket.EAI_AGAIN:
            raise ApplicationError(
                f"temporary DNS failure resolving {host}: {exc.strerror}",
                type=TRANSIENT_ERROR_TYPE,
            ) from None
        raise FetchError(f"cannot resolve host {host!r}: {exc.strerror or exc}") from None
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _canon, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise FetchError(f"cannot resolve host {host!r}: no addresses")
    return addresses


async def _checked_addresses(url: httpx.URL, rules: _HostRules) -> list[IPAddress]:
    """Resolve the URL's host; refuse it when it reaches a non-public address it may not."""
    host = url.raw_host.decode("ascii")
    addresses = await _resolve(host, url.port or _default_port(url))
    if rules.allow_private or rules.host_allowed(url.host):
        return addresses
    blocked = [a for a in addresses if not is_public_address(a) and not rules.address_allowed(a)]
    if blocked:
        raise FetchRefused(
            f"refused to fetch {url}: host {url.host} resolves to the non-public address "
            f"{blocked[0]} (loopback, private, link-local or reserved networks are not "
            "fetched unless the tool is configured to allow them)"
        )
    return addresses


def _default_port(url: httpx.URL) -> int:
    return 443 if url.scheme == "https" else 80


def _check_url(raw: str | httpx.URL) -> httpx.URL:
    try:
        url = raw if isinstance(raw, httpx.URL) else httpx.URL(raw.strip())
    except (httpx.InvalidURL, TypeError, ValueError) as exc:
        raise FetchError(f"not a valid URL: {raw!r} ({exc})") from None
    if url.scheme not in ("http", "https"):
        raise FetchRefused(f"refused to fetch {raw!r}: only http:// and https:// URLs are fetched")
    if not url.host:
        raise FetchError(f"not a valid URL: {raw!r} (no host)")
    return url.copy_with(fragment=None)


# --------------------------------------------------------------------------------------------
# Fetching
# --------------------------------------------------------------------------------------------


@dataclass
class FetchedPage:
    """What one fetch produced (the body already decoded to text)."""

    url: str
    """The final URL, after redirects."""
    requested_url: str
    status: int
    content_type: str
    body: str
    truncated_bytes: bool
    """The body was longer than ``max_bytes`` and only its first ``max_bytes`` were read."""
    max_bytes: int = DEFAULT_MAX_BYTES


async def fetch_page(url: str, config: FetchConfig) -> FetchedPage:
    """Fetch ``url`` under ``config``'s rules (raises :class:`FetchError` or a retryable
    ``ApplicationError``, see the module docstring)."""
    current = requested = _check_url(url)
    rules = _HostRules.build(config)
    timeout = httpx.Timeout(config.timeout, connect=min(config.connect_timeout, config.timeout))
    try:
        async with (
            asyncio.timeout(config.timeout),
            httpx.AsyncClient(
                timeout=timeout, follow_redirects=False, trust_env=False, verify=config.verify
            ) as client,
        ):
            for _hop in range(config.max_redirects + 1):
                addresses = await _checked_addresses(current, rules)
                async with _open(client, current, addresses, config) as response:
                    if response.status_code in REDIRECT_STATUSES and "location" in response.headers:
                        current = _check_url(current.join(response.headers["location"]))
                        continue
                    _check_status(response, current)
                    content_type = _content_type(response)
                    _refuse_binary_type(content_type, current)
                    raw, truncated = await _read_limited(response, config.max_bytes)
                    if _looks_binary(raw):
                        raise FetchRefused(
                            f"refused {current}: the content looks binary, not text "
                            "(fetch_url reads HTML, plain text, JSON and XML)"
                        )
                    return FetchedPage(
                        url=str(current),
                        requested_url=str(requested),
                        status=response.status_code,
                        content_type=content_type,
                        body=_decode(raw, response, content_type),
                        truncated_bytes=truncated,
                        max_bytes=config.max_bytes,
                    )
            raise FetchError(
                f"too many redirects (more than {config.max_redirects}) from {requested}"
            )
    except TimeoutError:
        raise FetchError(
            f"timed out after {config.timeout:g} s fetching {current}: the site is slow or "
            "unreachable; try again later or use another source"
        ) from None


@contextlib.asynccontextmanager
async def _open(
    client: httpx.AsyncClient, url: httpx.URL, addresses: list[IPAddress], config: FetchConfig
) -> AsyncIterator[httpx.Response]:
    """Send the request to the checked addresses (the first that accepts a connection)."""
    headers = {
        "Host": _host_header(url),
        "User-Agent": config.user_agent,
        "Accept-Encoding": ACCEPT_ENCODING,
        "Accept": "text/html,application/xhtml+xml,text/plain;q=0.9,application/json;q=0.9,"
        "*/*;q=0.1",
    }
    extensions = {"sni_hostname": url.raw_host.decode("ascii")} if url.scheme == "https" else {}
    last_error: Exception | None = None
    for address in addresses:
        pinned = url.copy_with(host=str(address))
        request = client.build_request("GET", pinned, headers=headers, extensions=extensions)
        try:
            response = await client.send(request, stream=True)
        except httpx.ConnectError as exc:
            if _tls_failure(exc):
                message = f"TLS handshake with {url.host} failed: {_describe(exc)}"
                raise FetchError(message) from None
            last_error = exc
            continue
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.TransportError as exc:
            raise _transient(f"network error fetching {url}: {_describe(exc)}") from None
        try:
            yield response
        except httpx.TimeoutException:
            raise TimeoutError from None
        except httpx.TransportError as exc:
            raise _transient(f"connection lost while reading {url}: {_describe(exc)}") from None
        finally:
            await response.aclose()
        return
    raise _transient(f"could not connect to {url.host}: {_describe(last_error)}")


def _host_header(url: httpx.URL) -> str:
    host = url.raw_host.decode("ascii")
    if ":" in host:
        host = f"[{host}]"
    return host if url.port in (None, _default_port(url)) else f"{host}:{url.port}"


def _tls_failure(exc: BaseException) -> bool:
    """A certificate or TLS protocol error: retrying would fail the same way."""
    seen: BaseException | None = exc
    for _ in range(10):
        if seen is None:
            return False
        if isinstance(seen, ssl.SSLError):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def _describe(exc: BaseException | None) -> str:
    if exc is None:
        return "no address accepted the connection"
    return str(exc) or type(exc).__name__


def _transient(message: str, retry_after: float | None = None) -> ApplicationError:
    delay = timedelta(seconds=retry_after) if retry_after else None
    return ApplicationError(message, type=TRANSIENT_ERROR_TYPE, next_retry_delay=delay)


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if not value:
        return None
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = parsedate_to_datetime(value)
        except (TypeError, ValueError):
            return None
        date = response.headers.get("date")
        try:
            now = parsedate_to_datetime(date) if date else None
        except (TypeError, ValueError):
            now = None
        if now is None:
            return None
        seconds = (when - now).total_seconds()
    return min(max(seconds, 0.0), MAX_RETRY_AFTER) or None


def _check_status(response: httpx.Response, url: httpx.URL) -> None:
    status = response.status_code
    if 200 <= status < 300:
        return
    reason = response.reason_phrase or ""
    if status in TRANSIENT_STATUSES:
        raise _transient(f"HTTP {status} {reason} from {url}".strip(), _retry_after(response))
    if status in REDIRECT_STATUSES:
        raise FetchError(f"HTTP {status} {reason} from {url} without a Location header")
    raise FetchError(f"HTTP {status} {reason} for {url}".replace("  ", " "))


def _content_type(response: httpx.Response) -> str:
    header: str = response.headers.get("content-type", "")
    return header.split(";", 1)[0].strip().lower()


def _is_text_type(content_type: str) -> bool:
    return (
        content_type.startswith("text/")
        or content_type in TEXT_TYPES
        or content_type.endswith(("+json", "+xml"))
    )


def _refuse_binary_type(content_type: str, url: httpx.URL) -> None:
    if content_type and not _is_text_type(content_type):
        raise FetchRefused(
            f"refused {url}: its content type is {content_type}, not text (fetch_url reads "
            "HTML, plain text, JSON and XML; binary files such as images, PDFs and archives "
            "are not fetched)"
        )


def _looks_binary(raw: bytes) -> bool:
    head = raw[:_SNIFF_BYTES]
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return False
    return b"\x00" in head


#: The content codings fetch_url asks for and decodes itself (see :class:`_BoundedDecoder`).
ACCEPT_ENCODING = "gzip, deflate"


class _BoundedDecoder:
    """Decompresses a body without ever producing more than asked for.

    httpx decodes each network chunk whole: a 64 KiB gzip chunk of zeros becomes 64 MiB in one
    step, so a small compressed page can cost gigabytes before any size check runs. Here every
    step asks zlib for at most the bytes still allowed (``max_length``) and keeps the rest of the
    input (``unconsumed_tail``) for later, so memory stays within the limit whatever the ratio.
    """

    def __init__(self, coding: str, url: httpx.URL) -> None:
        codings = [c.strip().lower() for c in coding.split(",") if c.strip()]
        codings = [c for c in codings if c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise FetchRefused(
                f"refused {url}: unsupported content encoding {coding!r} (fetch_url accepts "
                f"{ACCEPT_ENCODING})"
            )
        self.coding = codings[0] if codings else None
        self._zlib: Any = None
        if self.coding in ("gzip", "x-gzip"):
            self._zlib = zlib.decompressobj(16 + zlib.MAX_WBITS)
        self._pending = b""

    def feed(self, data: bytes, limit: int) -> bytes:
        """Up to ``limit`` decoded bytes from ``data`` (and input held back earlier)."""
        if self.coding is None:
            return data[:limit]
        if self._zlib is None:  # deflate: zlib-wrapped as the RFC says, or raw as some send
            head = self._pending + data
            if len(head) < 2:
                self._pending = head
                return b""
            wrapped = (head[0] & 0x0F) == 8 and int.from_bytes(head[:2], "big") % 31 == 0
            self._zlib = zlib.decompressobj(zlib.MAX_WBITS if wrapped else -zlib.MAX_WBITS)
            data, self._pending = head, b""
        out = bytearray()
        try:
            out += self._zlib.decompress(data, limit)
            while len(out) < limit and self._zlib.unconsumed_tail:
                out += self._zlib.decompress(self._zlib.unconsumed_tail, limit - len(out))
        except zlib.error as exc:
            raise FetchError(f"the page's compressed body is corrupt ({exc})") from None
        return bytes(out)

    @property
    def has_more(self) -> bool:
        """Input is held back that may still decode to more output."""
        return bool(self._zlib is not None and self._zlib.unconsumed_tail)


async def _read_limited(response: httpx.Response, max_bytes: int) -> tuple[bytes, bool]:
    """Read at most ``max_bytes`` of the decoded body, decoding no more than that."""
    decoder = _BoundedDecoder(response.headers.get("content-encoding", ""), response.url)
    body = bytearray()
    async for chunk in response.aiter_raw(_READ_CHUNK):
        body += decoder.feed(chunk, max_bytes + 1 - len(body))
        if len(body) > max_bytes or decoder.has_more:
            return bytes(body[:max_bytes]), True
    return bytes(body), False


_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.I)


def _decode(raw: bytes, response: httpx.Response, content_type: str) -> str:
    for bom, encoding in (
        (codecs.BOM_UTF8, "utf-8-sig"),
        (codecs.BOM_UTF16_LE, "utf-16"),
        (codecs.BOM_UTF16_BE, "utf-16"),
    ):
        if raw.startswith(bom):
            return raw.decode(encoding, errors="replace")
    candidates = [response.charset_encoding]
    if content_type in HTML_TYPES or content_type.endswith("xml"):
        match = _META_CHARSET.search(raw[:4096])
        if match:
            candidates.append(match.group(1).decode("ascii", "replace"))
    for name in candidates:
        if not name:
            continue
        try:
            codecs.lookup(name)
        except LookupError:
            continue
        return raw.decode(name, errors="replace")
    return raw.decode("utf-8", errors="replace")
