"""Deep research: a lead agent runs background researchers and writes a cited report.

The lead (``deep_research``) splits the request into one task per source or topic and starts a
``researcher`` for each as a background subagent: a child workflow of its own, with its own
history, retries and budget. Researchers read pages with the ``fetch_url`` tool
(:mod:`relaykit.web`) and report what they found with the URLs they read; reports reach the lead
at turn boundaries or as the result of ``wait_subagents``. The lead then writes the report,
citing the URLs. A crash anywhere loses nothing: every model call and every fetch is an
activity, and a researcher's report is signalled to the lead by workflow id.

Serve the agents and start a run (it runs in the background; the command prints the run id)::

    RELAYKIT_MODEL=openai:gpt-4.1-mini relaykit worker examples.deep_research
    relaykit run deep_research "What do these pages say about durable execution? \\
        https://temporal.io/blog https://docs.temporal.io/workflows"
    relaykit events RUN_ID          # progress: subagents started and finished
    relaykit result RUN_ID          # the report, once it is written

``fetch_url`` reads the public web only. To research pages on your own network (or on
127.0.0.1, as the tests do), allow them on the worker: ``RELAYKIT_FETCH_ALLOW_PRIVATE=1`` or
``RELAYKIT_FETCH_ALLOWED_HOSTS=wiki.internal,10.0.0.0/8`` (see docs/research.md).

The agents have no model of their own, so the worker's default model serves both.
:func:`scripted_research` plays the model for both agents, deterministically, when no model is
configured (``relaykit dev``, ``relaykit worker``, the tests); it is also a compact picture of the
conversation a real model should have.
"""

from __future__ import annotations

import json
import re
from typing import Any

from relaykit import Agent, Subagents
from relaykit.testing.scripted_server import ScriptedRequest, Step, batch, call, text
from relaykit.web import fetch_url

MAX_RESEARCHERS = 4

researcher = Agent(
    name="researcher",
    description="Reads the web pages it is given with fetch_url and reports what they say, "
    "with the URLs it read.",
    instructions=(
        "You research one question for a lead researcher. Read the URL you were given with "
        "fetch_url (and, only if needed, a few pages it links to). Report what the pages say "
        "that answers the question, in a few factual sentences, without speculation. End with "
        "a line 'Sources:' followed by every URL you read. If a page cannot be read, say so and "
        "why."
    ),
    tools=[fetch_url],
)

deep_research = Agent(
    name="deep_research",
    description="Researches a question across several sources and writes a cited report.",
    instructions=(
        "You lead a research job. Plan first: split the request into independent tasks, one "
        "per source or sub-topic; every URL in the request gets its own researcher. Start a "
        "researcher for each task with spawn_subagent, with a complete prompt that states the "
        "question and the URL to read. While they work, outline the report; then wait for "
        "their reports with wait_subagents. Write the final report in Markdown: a short answer, "
        "the findings with numbered citations like [1], and a 'Sources' section listing the URL "
        "of each citation. Cite only URLs that a researcher actually read, and say which "
        "sources could not be read."
    ),
    subagents=Subagents(
        [researcher], max_concurrent=MAX_RESEARCHERS, max_turns=12, max_result_chars=6_000
    ),
)


# --------------------------------------------------------------------------------------------
# The scripted model
# --------------------------------------------------------------------------------------------

_URL = re.compile(r"https?://[^\s<>\"'()\[\]{}]+")
_REPORT_HEAD = re.compile(r"^\[(task-\d+) · [^\]]+\] (\w+):\n", re.MULTILINE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")
_REPORT_PREFIX = "Background task report "
WAIT_SECONDS = 300
MAX_WAITS = 10


def scripted_research(request: ScriptedRequest) -> Step:
    """A scripted stand-in for the model behind both agents; which one is asking shows in the
    tools it was given (only the lead can spawn, only researchers can fetch)."""
    if "spawn_subagent" in request.tool_names:
        return _scripted_lead(request)
    if "fetch_url" in request.tool_names:
        return _scripted_researcher(request)
    return text("I have no tools for this.")


def _scripted_lead(request: ScriptedRequest) -> Step:
    question = _first_user_text(request)
    targets = _urls(question) or _topics(question)
    calls = _tool_calls(request)
    started: dict[str, str] = {}  # task id -> the target its prompt names
    for name, arguments, result in calls:
        if name == "spawn_subagent" and result is not None:
            task_id = _spawned_id(result)
            if task_id is not None:
                started[task_id] = _target_of(str(arguments.get("prompt", "")), targets)
    reports = _reports(request)
    running = [t for t in started if t not in reports]
    pending = [t for t in targets if t not in started.values()]
    free = MAX_RESEARCHERS - len(running)
    if pending and free > 0:
        return batch(
            *(
                call("spawn_subagent", prompt=_research_prompt(question, t), agent="researcher")
                for t in pending[:free]
            )
        )
    waits = sum(1 for name, _, _ in calls if name == "wait_subagents")
    if running and waits < MAX_WAITS:
        return call("wait_subagents", ids=running, timeout_seconds=WAIT_SECONDS)
    return text(_compose(question, started, reports))


def _scripted_researcher(request: ScriptedRequest) -> Step:
    task = _first_user_text(request)
    urls = _urls(task)
    results = request.tool_results
    if not urls:
        return text(
            "I could not research this: the task names no URL to read, and I have no search "
            f"tool.\nTask: {task}"
        )
    if not results:
        return call("fetch_url", url=urls[0])
    fetched = results[-1]
    if fetched.startswith(("Error", "Tool 'fetch_url'")):
        return text(f"The page could not be read: {fetched}\nSources: {urls[0]} (unreadable)")
    title, first_sentence = _summary_of(fetched)
    summary = ": ".join(part for part in (title, first_sentence) if part) or "The page is empty."
    return text(f"{summary}\nSources: {urls[0]}")


def _research_prompt(question: str, target: str) -> str:
    what = f"Read {target}" if target.startswith("http") else f"Research: {target}"
    return f"{what}\nand report what it says that helps answer this request:\n{question}"


def _compose(question: str, started: dict[str, str], reports: dict[str, tuple[str, str]]) -> str:
    sources: list[str] = []
    findings: list[str] = []
    problems: list[str] = []
    for task_id, target in started.items():
        status, body = reports.get(task_id, ("missing", ""))
        if status != "finished":
            problems.append(f"- {target}: no report ({status}). {body[:200]}".rstrip())
            continue
        lines = [line for line in body.splitlines() if line.strip()]
        cited = _urls("\n".join(line for line in lines if line.startswith("Sources:")))
        if "(unreadable)" in body:
            cited = []
        claim = " ".join(line for line in lines if not line.startswith("Sources:")).strip()
        if not cited:
            problems.append(f"- {target}: {claim}")
            continue
        numbers = []
        for url in cited:
            if url not in sources:
                sources.append(url)
            numbers.append(sources.index(url) + 1)
        findings.append(f"- {claim} " + "".join(f"[{n}]" for n in numbers))
    out = ["# Research report", "", f"Question: {question.strip()}", "", "## Findings", ""]
    out += findings or ["- No source could be read."]
    if problems:
        out += ["", "## Not covered", "", *problems]
    out += ["", "## Sources", ""]
    out += [f"[{n}] {url}" for n, url in enumerate(sources, 1)] or ["(none)"]
    return "\n".join(out)


# helpers reading the conversation (both wire formats)


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(
            str(part.get("text", ""))
            for part in content
            if isinstance(part, dict) and part.get("type") == "text"
        )
    return ""


def _first_user_text(request: ScriptedRequest) -> str:
    for message in request.messages:
        if message.get("role") == "user" and (said := _content_text(message.get("content"))):
            return said
    return ""


def _tool_calls(request: ScriptedRequest) -> list[tuple[str, dict[str, Any], str | None]]:
    """``(name, arguments, result or None)`` of every tool call so far, oldest first."""
    calls: list[tuple[str, str, dict[str, Any]]] = []
    results: dict[str, str] = {}
    for message in request.messages:
        content = message.get("content")
        for entry in message.get("tool_calls") or []:  # OpenAI
            function = entry.get("function") or {}
            arguments = _json(function.get("arguments"))
            calls.append((entry.get("id", ""), function.get("name", ""), arguments))
        if message.get("role") == "tool":
            results[message.get("tool_call_id", "")] = _content_text(content)
        if isinstance(content, list):  # Anthropic
            for block in content:
                if not isinstance(block, dict):
                    continue
                if block.get("type") == "tool_use":
                    arguments = _json(block.get("input"))
                    calls.append((block.get("id", ""), block.get("name", ""), arguments))
                elif block.get("type") == "tool_result":
                    results[block.get("tool_use_id", "")] = _content_text(block.get("content"))
    return [(name, arguments, results.get(call_id)) for call_id, name, arguments in calls]


def _json(raw: Any) -> dict[str, Any]:
    if isinstance(raw, dict):
        return raw
    try:
        value = json.loads(raw or "{}")
    except (TypeError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}


def _spawned_id(result: str) -> str | None:
    try:
        value = json.loads(result)
    except ValueError:
        return None  # a refusal, not a started task
    return value.get("id") if isinstance(value, dict) else None


def _reports(request: ScriptedRequest) -> dict[str, tuple[str, str]]:
    """Reports by task id, as ``(status, text)``: from turn-boundary messages and from the
    results of ``wait_subagents``."""
    texts: list[str] = []
    for message in request.messages:
        said = _content_text(message.get("content"))
        if message.get("role") == "user" and said.startswith(_REPORT_PREFIX):
            texts.append(said[len(_REPORT_PREFIX) :])
    texts += [
        result for name, _, result in _tool_calls(request) if name == "wait_subagents" and result
    ]
    reports: dict[str, tuple[str, str]] = {}
    for said in texts:
        heads = list(_REPORT_HEAD.finditer(said))
        for head, following in zip(heads, [*heads[1:], None]):
            end = following.start() if following else len(said)
            reports[head.group(1)] = (head.group(2), said[head.end() : end].strip())
    return reports


def _urls(text_: str) -> list[str]:
    found: list[str] = []
    for url in _URL.findall(text_):
        url = url.rstrip(".,;:!?")
        if url not in found:
            found.append(url)
    return found


def _topics(question: str) -> list[str]:
    parts = [p.strip(" -*•\t") for p in re.split(r"[;\n]", question)]
    return [p for p in parts if p] or [question.strip()]


def _target_of(prompt: str, targets: list[str]) -> str:
    """Which target a spawn prompt was written for (its first line names it)."""
    first_line = prompt.split("\n", 1)[0]
    return next((t for t in targets if first_line.endswith(f" {t}")), first_line[:80])


def _summary_of(fetched: str) -> tuple[str, str]:
    """The title and the first sentence of a ``fetch_url`` result."""
    header, _, body = fetched.partition("\n\n")
    titles = [line[len("Title: ") :] for line in header.splitlines() if line.startswith("Title: ")]
    title = titles[0].strip() if titles else ""
    for line in body.splitlines():
        line = line.strip()
        if not line or line.startswith(("#", "[…")):
            continue
        line = line.removeprefix("- ")
        return title, _SENTENCE_END.split(line, maxsplit=1)[0]
    return title, ""


scripted_responder = scripted_research
"""The conventional name of a module's scripted model, so that an offline runner (such as
``relaykit dev`` without a configured model) can find it."""
