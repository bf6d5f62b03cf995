"""examples/deep_research.py end to end: a lead, three background researchers reading pages
from a local HTTP server with ``fetch_url``, and a cited report, all played by the example's
scripted model."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from examples.deep_research import deep_research, researcher, scripted_research
from relaykit import start_run
from relaykit.testing.scripted_server import ScriptedModelServer
from relaykit.web import ENV_ALLOW_PRIVATE
from tests.support import history_events, scripted_model, serving

PAGES = {
    "/replay.html": (
        "Replay",
        "Temporal replays a workflow's history to rebuild its state. Nothing runs twice.",
    ),
    "/activities.html": (
        "Activities",
        "Activities do the work that touches the world. They are retried with backoff.",
    ),
    "/signals.html": (
        "Signals",
        "Signals carry messages into a running workflow. They are durable.",
    ),
}


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            entry = PAGES.get(self.path)
            if entry is None:
                self.send_error(404)
                return
            title, paragraph = entry
            body = (
                f"<html><head><title>{title}</title><script>tracking()</script></head>"
                f"<body><nav>Home | Docs</nav><h1>{title}</h1><p>{paragraph}</p></body></html>"
            ).encode()
            self.send_response(200)
            self.send_header("content-type", "text/html; charset=utf-8")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    httpd.daemon_threads = True
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


async def test_deep_research_runs_three_researchers_and_cites_every_page(
    client: Client,
    model_server: ScriptedModelServer,
    site: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The pages are on 127.0.0.1, which fetch_url refuses unless the worker's environment
    # allows private targets (the worker runs in this process).
    monkeypatch.setenv(ENV_ALLOW_PRIVATE, "1")
    urls = [site + path for path in PAGES]
    prompt = "How does Temporal keep work durable? Use these sources: " + ", ".join(urls) + "."
    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_research)
    async with serving(client, deep_research, default_model=model) as worker:
        assert set(worker.graph.agents) == {"deep_research", "researcher"}
        handle = await start_run(client, deep_research, prompt, task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), timeout=60)
        events = await handle.events()
        history = await history_events(handle.workflow)

    report = result.output
    assert isinstance(report, str)
    # Every page is cited, with the page's title and first sentence as the finding.
    for n, (url, (title, paragraph)) in enumerate(zip(urls, PAGES.values(), strict=True), 1):
        assert f"[{n}] {url}" in report
        assert f"- {title}: {paragraph.split('. ')[0]}. [{n}]" in report
    assert "Not covered" not in report

    # Three researchers ran as child workflows of the lead (started concurrently, so in any
    # order).
    started = [e.data for e in events if e.kind == "subagent_started"]
    assert sorted(s["id"] for s in started) == ["task-1", "task-2", "task-3"]
    assert {s["agent"] for s in started} == {researcher.name}
    children = [
        e.start_child_workflow_execution_initiated_event_attributes
        for e in history
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert sorted(c.workflow_id for c in children) == [f"{handle.id}/task-{n}" for n in (1, 2, 3)]
    assert {c.workflow_type.name for c in children} == {"AgentRun"}
    finished = [e.data for e in events if e.kind == "subagent_finished"]
    assert sorted(f["id"] for f in finished) == ["task-1", "task-2", "task-3"]
    assert {f["status"] for f in finished} == {"finished"}

    # Each researcher's report reached the lead exactly once (a turn-boundary message or a
    # wait_subagents result), and each researcher really fetched its page.
    delivered = "\n".join(m.content for m in result.transcript if m.role in ("user", "tool"))
    for url, (title, _) in zip(urls, PAGES.values(), strict=True):
        assert delivered.count(f"Sources: {url}") == 1, url
        assert delivered.count(f"{title}: ") == 1, title
    researcher_requests = [
        r for r in model_server.requests(model.name) if "fetch_url" in r.tool_names
    ]
    fetched = [r.tool_results[0] for r in researcher_requests if r.tool_results]
    assert sorted(text.splitlines()[0] for text in fetched) == sorted(f"URL: {u}" for u in urls)
    assert not any("tracking()" in text or "Home | Docs" in text for text in fetched)
    assert result.usage.requests == model_server.request_count(model.name)


async def test_unreadable_sources_are_reported_not_cited(
    client: Client, model_server: ScriptedModelServer, site: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Without the environment switch the 127.0.0.1 pages are refused: the researchers say so,
    # and the report cites nothing it did not read.
    monkeypatch.delenv(ENV_ALLOW_PRIVATE, raising=False)
    url = site + "/replay.html"
    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_research)
    async with serving(client, deep_research, default_model=model) as worker:
        handle = await start_run(
            client, deep_research, f"Summarise {url}", task_queue=worker.task_queue
        )
        result = await asyncio.wait_for(handle.result(), timeout=60)
    report = result.output
    assert "## Not covered" in report and "non-public address" in report
    assert "## Sources\n\n(none)" in report
