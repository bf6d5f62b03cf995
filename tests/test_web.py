"""The ``fetch_url`` tool against a real HTTP server on 127.0.0.1.

127.0.0.1 is a loopback address, which ``fetch_url`` refuses by default; so most tests build the
tool with ``allowed_hosts=["127.0.0.1"]`` and others check the refusal itself.
"""

from __future__ import annotations

import gzip
import json
import sys
import threading
import tracemalloc
import zlib
from collections.abc import Callable, Iterator
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.exceptions import ApplicationError

from relaykit import Agent, start_run
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, call, text
from relaykit.tools import Tool, ToolInvocation
from relaykit.web import (
    ENV_ALLOW_PRIVATE,
    ENV_ALLOWED_HOSTS,
    TRANSIENT_ERROR_TYPE,
    FetchError,
    FetchRefused,
    html_to_text,
    make_fetch_url,
)
from tests.support import scheduled_activities, scripted_model, serving

ARTICLE = """<!DOCTYPE html>
<html><head>
  <meta charset="utf-8"><title>Durable  Runs &amp; You</title>
  <style>body { color: red }</style>
  <script>window.secret = "SCRIPT-CONTENT";</script>
</head>
<body>
  <nav><a href="/">Home</a> <ul><li>NAV-ITEM</li></ul></nav>
  <h1>Durable execution</h1>
  <p>Workflows   survive
     crashes. They replay their history.</p>
  <h2>Why it matters</h2>
  <ul><li>No lost work</li><li>Retries with <b>backoff</b></li></ul>
  <div hidden>HIDDEN-CONTENT</div>
  <p>See also&nbsp;the docs.</p>
  <script type="module">console.log("SCRIPT-TWO")</script>
</body></html>"""

Route = Callable[[BaseHTTPRequestHandler], None]


class PageServer:
    """A threaded HTTP server with routes set per test, recording the paths it was asked for."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[str] = []
        self.release = threading.Event()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                owner.seen.append(self.path)
                route = owner.routes.get(self.path.split("?", 1)[0])
                if route is None:
                    send(self, 404, "text/html", b"<h1>Not here</h1>")
                else:
                    route(self)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    def url(self, path: str, host: str = "127.0.0.1") -> str:
        return f"http://{host}:{self.port}{path}"


class _QuietServer(ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        # A browser or client that closes a kept-alive connection is not a site fault: no
        # traceback in the test output for it.
        if isinstance(sys.exc_info()[1], (BrokenPipeError, ConnectionResetError)):
            return
        super().handle_error(request, client_address)


def send(
    handler: BaseHTTPRequestHandler,
    status: int,
    content_type: str | None,
    body: bytes,
    headers: dict[str, str] | None = None,
) -> None:
    handler.send_response(status)
    if content_type:
        handler.send_header("content-type", content_type)
    handler.send_header("content-length", str(len(body)))
    for key, value in (headers or {}).items():
        handler.send_header(key, value)
    handler.end_headers()
    handler.wfile.write(body)


def page(content_type: str | None, body: bytes | str, status: int = 200, **headers: str) -> Route:
    data = body.encode() if isinstance(body, str) else body
    extra = {key.replace("_", "-"): value for key, value in headers.items()}
    return lambda h: send(h, status, content_type, data, extra)


def redirect(location: str) -> Route:
    return lambda h: send(h, 302, "text/plain", b"moved", {"location": location})


@pytest.fixture(scope="module")
def pages() -> Iterator[PageServer]:
    server = PageServer()
    big_paragraph = "<p>" + "All work and no play. " * 40 + "</p>\n"

    def slow(handler: BaseHTTPRequestHandler) -> None:
        server.release.wait(5)
        send(handler, 200, "text/html", b"<p>late</p>")

    def trickle(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(200)
        handler.send_header("content-type", "text/plain")
        handler.send_header("content-length", "1000")
        handler.end_headers()
        for _ in range(50):
            handler.wfile.write(b"x")
            handler.wfile.flush()
            if server.release.wait(0.1):
                return

    server.routes.update(
        {
            "/article.html": page("text/html; charset=utf-8", ARTICLE),
            "/big.html": page("text/html", "<title>Big</title>" + big_paragraph * 500),
            "/notes.txt": page("text/plain", "line one\r\n\r\n\r\n\r\nline two  \n"),
            "/data.json": page("application/json", json.dumps({"answer": 42})),
            "/latin1.html": page("text/html; charset=iso-8859-1", "<p>café</p>".encode("latin1")),
            "/image.png": page("image/png", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR"),
            "/mystery": page(None, b"\x00\x01\x02\x03binary"),
            "/slow": slow,
            "/trickle": trickle,
            "/busy": page("text/plain", "try later", status=503, retry_after="2"),
            "/gone": page("text/plain", "gone", status=410),
            "/to-article": redirect("/article.html"),
            "/to-metadata": redirect("http://169.254.169.254/latest/meta-data/"),
            "/to-ftp": redirect("ftp://example.com/file"),
            "/loop": redirect("/loop"),
        }
    )
    server.routes["/to-loopback-ip"] = redirect(server.url("/article.html"))
    server.thread.start()
    yield server
    server.release.set()
    server.httpd.shutdown()
    server.httpd.server_close()


def local_fetch(**options: Any) -> Tool:
    options.setdefault("allowed_hosts", ["127.0.0.1"])
    return make_fetch_url(**options)


async def fetch(tool: Tool, url: str) -> str:
    invocation = ToolInvocation(call_id="call-1", arguments=json.dumps({"url": url}))
    outcome = await tool.invoke(invocation)
    assert not outcome.is_error
    return outcome.content


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ENV_ALLOW_PRIVATE, raising=False)
    monkeypatch.delenv(ENV_ALLOWED_HOSTS, raising=False)


# --- reading pages ----------------------------------------------------------------------------


async def test_html_becomes_title_headings_paragraphs_and_list_items(pages: PageServer) -> None:
    content = await fetch(local_fetch(), pages.url("/article.html"))
    assert content == (
        f"URL: {pages.url('/article.html')}\n"
        "Title: Durable Runs & You\n"
        "\n"
        "# Durable execution\n"
        "\n"
        "Workflows survive crashes. They replay their history.\n"
        "\n"
        "## Why it matters\n"
        "\n"
        "- No lost work\n"
        "- Retries with backoff\n"
        "\n"
        "See also the docs."
    )
    for hidden in ("SCRIPT-CONTENT", "SCRIPT-TWO", "color: red", "NAV-ITEM", "HIDDEN-CONTENT"):
        assert hidden not in content


def test_html_to_text_survives_sloppy_markup() -> None:
    title, body = html_to_text("<html><head><title>T</title><body><p>one<br>two<p>three<nav>menu")
    assert title == "T"
    assert body == "one\ntwo\n\nthree"


async def test_plain_text_and_json_pass_through(pages: PageServer) -> None:
    tool = local_fetch()
    assert (await fetch(tool, pages.url("/notes.txt"))).endswith(
        "Content-Type: text/plain\n\nline one\n\nline two"
    )
    assert (await fetch(tool, pages.url("/data.json"))).endswith('\n\n{"answer": 42}')
    assert (await fetch(tool, pages.url("/latin1.html"))).endswith("\n\ncafé")


async def test_redirects_are_followed_and_reported(pages: PageServer) -> None:
    content = await fetch(local_fetch(), pages.url("/to-article"))
    assert content.startswith(
        f"URL: {pages.url('/article.html')} (redirected from {pages.url('/to-article')})\n"
    )
    with pytest.raises(FetchError, match="too many redirects"):
        await fetch(local_fetch(max_redirects=3), pages.url("/loop"))
    with pytest.raises(FetchRefused, match="only http:// and https://"):
        await fetch(local_fetch(), pages.url("/to-ftp"))


# --- limits -----------------------------------------------------------------------------------


async def test_long_pages_are_truncated_with_a_marker(pages: PageServer) -> None:
    # Body limit: only the first max_bytes are read (the page is ~440 KB).
    tool = local_fetch(max_bytes=50_000, max_chars=1_000_000)
    content = await fetch(tool, pages.url("/big.html"))
    assert content.endswith(
        "[… page truncated by fetch_url: only its first 50,000 bytes were read]"
    )
    assert 40_000 < len(content) < 51_000
    # Text limit: the model reads max_chars characters and is told how much it does not see.
    content = await fetch(local_fetch(max_chars=500), pages.url("/big.html"))
    head, marker = content.split("\n\n[… truncated by fetch_url: ")
    assert len(head) == 500 and head.startswith("URL: ")
    assert marker.endswith(" more characters not shown]")


async def test_a_slow_server_times_out_with_a_message_for_the_model(pages: PageServer) -> None:
    with pytest.raises(FetchError, match=r"timed out after 0.3 s fetching .*/slow"):
        await fetch(local_fetch(timeout=0.3), pages.url("/slow"))
    # The deadline covers the whole fetch: a server sending a byte every 0.1 s cannot hold it.
    with pytest.raises(FetchError, match=r"timed out after 0\.5 s"):
        await fetch(local_fetch(timeout=0.5), pages.url("/trickle"))


# --- errors -----------------------------------------------------------------------------------


async def test_client_errors_are_plain_errors_and_server_overload_is_retried(
    pages: PageServer,
) -> None:
    tool = local_fetch()
    with pytest.raises(FetchError, match=r"HTTP 404 Not Found for http://127\.0\.0\.1:\d+/nowhere"):
        await fetch(tool, pages.url("/nowhere"))
    with pytest.raises(FetchError, match="HTTP 410 Gone"):
        await fetch(tool, pages.url("/gone"))
    with pytest.raises(ApplicationError) as busy:
        await fetch(tool, pages.url("/busy"))
    assert busy.value.type == TRANSIENT_ERROR_TYPE and not busy.value.non_retryable
    assert busy.value.next_retry_delay == timedelta(seconds=2)  # Retry-After honoured
    assert "HTTP 503" in busy.value.message
    with pytest.raises(FetchError, match="not a valid URL"):
        await fetch(tool, "http://")


async def test_nothing_listening_is_a_transient_error(pages: PageServer) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        closed_port = sock.getsockname()[1]
    with pytest.raises(ApplicationError, match="could not connect") as refused:
        await fetch(local_fetch(), f"http://127.0.0.1:{closed_port}/")
    assert refused.value.type == TRANSIENT_ERROR_TYPE


async def test_binaries_are_refused(pages: PageServer) -> None:
    tool = local_fetch()
    with pytest.raises(FetchRefused, match="content type is image/png, not text"):
        await fetch(tool, pages.url("/image.png"))
    with pytest.raises(FetchRefused, match="looks binary"):
        await fetch(tool, pages.url("/mystery"))


def _gzip_of_zeros(size: int) -> bytes:
    packer = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    block = bytes(1 << 20)
    parts = [packer.compress(block) for _ in range(size >> 20)]
    return b"".join([*parts, packer.flush()])


async def test_a_gzip_bomb_costs_no_more_memory_than_the_byte_limit(pages: PageServer) -> None:
    # 256 MiB of zeros in ~250 KiB of gzip: decoding it whole would allocate 64 MiB per chunk.
    bomb = _gzip_of_zeros(256 << 20)
    pages.routes["/bomb.txt"] = page("text/plain", bomb, content_encoding="gzip")
    tool = local_fetch(max_bytes=1_000_000)
    tracemalloc.start()
    try:
        with pytest.raises(FetchRefused, match="looks binary"):  # zeros are not text
            await fetch(tool, pages.url("/bomb.txt"))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 12_000_000, f"decoding allocated {peak:,} bytes"


async def test_compressed_pages_are_read_and_cut_at_the_decoded_limit(pages: PageServer) -> None:
    text = "durable " * 30_000  # 240 KB
    raw_deflate = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    pages.routes.update(
        {
            "/gz.txt": page("text/plain", gzip.compress(text.encode()), content_encoding="gzip"),
            "/zlib.txt": page(
                "text/plain", zlib.compress(text.encode()), content_encoding="deflate"
            ),
            "/raw.txt": page(
                "text/plain",
                raw_deflate.compress(text.encode()) + raw_deflate.flush(),
                content_encoding="deflate",
            ),
            "/corrupt.txt": page(
                "text/plain", b"\x1f\x8b\x08garbage" * 10, content_encoding="gzip"
            ),
            "/brotli.txt": page("text/plain", b"whatever", content_encoding="br"),
        }
    )
    tool = local_fetch(max_bytes=100_000, max_chars=1_000_000)
    for path in ("/gz.txt", "/zlib.txt", "/raw.txt"):
        out = await fetch(tool, pages.url(path))
        assert "\n\ndurable durable" in out
        assert "only its first 100,000 bytes were read" in out
    whole = await fetch(local_fetch(max_chars=1_000_000), pages.url("/gz.txt"))
    assert whole.count("durable") == 30_000
    with pytest.raises(FetchError, match="corrupt"):
        await fetch(tool, pages.url("/corrupt.txt"))
    with pytest.raises(FetchRefused, match="unsupported content encoding"):
        await fetch(tool, pages.url("/brotli.txt"))


# --- private networks -------------------------------------------------------------------------


async def test_private_addresses_are_refused_by_default(
    pages: PageServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = make_fetch_url()
    before = len(pages.seen)
    for url in (
        pages.url("/article.html"),
        pages.url("/article.html", host="localhost"),
        pages.url("/article.html", host="[::ffff:127.0.0.1]"),
        "http://169.254.169.254/latest/meta-data/",
        "http://10.1.2.3/",
    ):
        with pytest.raises(FetchRefused, match="non-public address"):
            await fetch(default, url)
    assert len(pages.seen) == before  # refused before any connection
    # Configuration lifts the rule: the factory, or the worker's environment.
    assert "Durable" in await fetch(make_fetch_url(allow_private=True), pages.url("/article.html"))
    monkeypatch.setenv(ENV_ALLOWED_HOSTS, "127.0.0.0/8")
    assert "Durable" in await fetch(default, pages.url("/article.html"))
    monkeypatch.delenv(ENV_ALLOWED_HOSTS)
    monkeypatch.setenv(ENV_ALLOW_PRIVATE, "1")
    assert "Durable" in await fetch(default, pages.url("/article.html"))


async def test_redirects_to_private_addresses_are_refused(pages: PageServer) -> None:
    # 127.0.0.1 itself is allowed, the metadata address it redirects to is not.
    with pytest.raises(FetchRefused, match=r"169\.254\.169\.254"):
        await fetch(local_fetch(), pages.url("/to-metadata"))
    # Allowing a host by name allows that name only, not the address a redirect names.
    by_name = make_fetch_url(allowed_hosts=["localhost"])
    assert "Durable" in await fetch(by_name, pages.url("/article.html", host="localhost"))
    with pytest.raises(FetchRefused, match=r"host 127\.0\.0\.1 resolves to the non-public"):
        await fetch(by_name, pages.url("/to-loopback-ip", host="localhost"))


# --- in a run ---------------------------------------------------------------------------------


async def test_fetch_url_in_a_real_run(
    client: Client, model_server: ScriptedModelServer, pages: PageServer
) -> None:
    reader_tool = local_fetch(heartbeat_timeout=5)
    model = scripted_model(model_server)

    def respond(request: ScriptedRequest) -> Step:
        if len(request.tool_results) == 0:
            return call("fetch_url", url=pages.url("/article.html"))
        if len(request.tool_results) == 1:
            return call("fetch_url", url="http://169.254.169.254/latest/meta-data/")
        return text("read it")

    model_server.respond(model.name, respond)
    reader = Agent(name="reader", model=model, tools=[reader_tool])
    async with serving(client, reader) as worker:
        handle = await start_run(client, reader, "read the article", task_queue=worker.task_queue)
        result = await handle.result()
        activities = await scheduled_activities(handle.workflow)
    assert result.output == "read it"
    article, refused = [m for m in result.transcript if m.role == "tool"]
    assert not article.is_error and "Title: Durable Runs & You" in article.content
    assert refused.is_error and "FetchRefused" in refused.content
    assert "non-public address 169.254.169.254" in refused.content
    assert activities.count("fetch_url") == 2  # refused at once, not retried
