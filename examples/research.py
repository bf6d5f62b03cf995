"""Research with both kinds of delegation: background researchers and an agent-as-tool helper.

The lead (``research_lead``) starts one ``topic_researcher`` per topic as a background subagent
(fire-and-forget child workflows whose reports come back at turn boundaries), keeps working while
they run, asks the ``editor`` agent — an agent-as-tool child workflow it waits for — to tighten
the notes, and answers once every report is in.

    relaykit worker examples.research            # or: relaykit dev examples.research
    relaykit run research_lead "Compare Temporal and Celery for long agent runs" --wait

The knowledge tool answers from a small built-in table so the example runs offline; swap it for
real search. :func:`scripted_research_lead` plays the model for all three agents when no model
is configured (no ``RELAYKIT_MODEL``, no provider key: ``relaykit dev``, ``relaykit worker``,
the tests).
"""

from __future__ import annotations

import json
import re

from relaykit import Agent, Subagents, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, batch, call, text

_NOTES = {
    "temporal": "Temporal persists every workflow step as history; crashed workers replay it and "
    "continue, and a workflow can wait for days at no cost.",
    "celery": "Celery queues tasks on a broker; a task retries on failure but long multi-step "
    "flows need their own state handling.",
}


@tool(effect="read")
def lookup_notes(topic: str) -> str:
    """Look up what the team knows about a topic.

    Args:
        topic: One word, e.g. "temporal".
    """
    return _NOTES.get(topic.strip().lower(), f"no notes on {topic}")


topic_researcher = Agent(
    name="topic_researcher",
    description="Researches one topic with lookup_notes and reports the facts.",
    instructions="Research the topic you are given with lookup_notes and report the facts.",
    tools=[lookup_notes],
)

editor = Agent(
    name="editor",
    description="Turns rough notes into two crisp sentences.",
    instructions="Rewrite the notes you are given as two crisp sentences.",
)

research_lead = Agent(
    name="research_lead",
    description="Plans research, delegates it, and writes the comparison.",
    instructions=(
        "Split the request into topics and start a topic_researcher for each with "
        "spawn_subagent. While they work, ask the editor to tighten anything you already know. "
        "Wait for every report, then answer with a short comparison."
    ),
    tools=[editor.as_tool(max_turns=3)],
    subagents=Subagents([topic_researcher], max_concurrent=4, max_turns=5),
)


def scripted_research_lead(request: ScriptedRequest) -> Step:
    """A deterministic stand-in for the model of all three agents. Which agent asks shows in
    the tools it was given, and each decides from its own conversation only (never from the
    order in which requests reach the server, which the concurrent children make arbitrary)."""
    if "spawn_subagent" in request.tool_names:
        return _lead(request)
    if "lookup_notes" in request.tool_names:
        if request.tool_results:
            return text(f"Report: {request.tool_results[-1]}")
        topic = request.last_user_text.split()[-1].strip(".")
        return call("lookup_notes", topic=topic)
    return text("Edited: " + request.last_user_text[:160])


def _lead(request: ScriptedRequest) -> Step:
    task = next(str(m["content"]) for m in request.messages if m["role"] == "user")
    topics = re.findall(r"\b(Temporal|Celery)\b", task, flags=re.IGNORECASE) or ["temporal"]
    everything = json.dumps(request.messages)
    reports = re.findall(r"Report: ([^\"\\\\]+)", everything)
    called = _called_tools(request)
    if "spawn_subagent" not in called:
        return batch(*(call("spawn_subagent", prompt=f"Research {t.lower()}") for t in topics))
    if "ask_editor" not in called:
        return call("ask_editor", input=f"Notes: comparing {', '.join(topics)} for agent runs.")
    if len(reports) < len(topics):
        return call("wait_subagents", timeout_seconds=30)
    return text("Comparison:\n" + "\n".join(f"- {r.strip()}" for r in reports))


def _called_tools(request: ScriptedRequest) -> set[str]:
    """Names of the tools this agent already called in its conversation (OpenAI wire format;
    Anthropic's ``tool_use`` blocks too)."""
    names: set[str] = set()
    for m in request.messages:
        for tc in m.get("tool_calls") or []:
            names.add(tc.get("function", {}).get("name", ""))
        if isinstance(m.get("content"), list):
            names.update(
                b.get("name", "")
                for b in m["content"]
                if isinstance(b, dict) and b.get("type") == "tool_use"
            )
    return names
