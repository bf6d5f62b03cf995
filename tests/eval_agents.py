"""Agents for the evaluation tests: a triage agent that looks a ticket up (a ``"read"``) and may
refund it (a ``"write"``), and a desk agent with an agent tool and a subagent.

Every tool execution appends ``tool ticket`` to the file ``EVAL_TOOL_LOG`` names, so a test
counts executions across worker processes. The top-level agents (for
``relaykit eval tests.eval_agents`` in a worker process of its own) take their model from
``EVAL_MODEL_URL`` and ``EVAL_MODEL_NAME``; tests in the same process build theirs with
:func:`triage_agent` and :func:`desk_agents`.

The scripted models are responders (:func:`recorded_model`, :func:`candidate_model`): what they
answer depends only on the request, so runs of several tickets at once never share a script.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection

from relaykit import Agent, ModelSpec, Subagents, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text


def _log(tool_name: str, ticket: int) -> None:
    path = os.environ.get("EVAL_TOOL_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{tool_name} {ticket}\n")


@tool(effect="read")
def lookup(ticket: int) -> str:
    """Look a ticket up."""
    _log("lookup", ticket)
    return f"ticket {ticket}: charged twice"


@tool  # a write: it must never run during an evaluation
def refund(ticket: int, amount: int) -> str:
    """Refund a ticket."""
    _log("refund", ticket)
    return f"refunded {amount} on ticket {ticket}"


def triage_agent(model: ModelSpec) -> Agent:
    return Agent(
        name="triage", instructions="Resolve the ticket.", model=model, tools=[lookup, refund]
    )


def ticket_of(req: ScriptedRequest) -> int:
    return int(req.last_user_text.split()[-1])


def recorded_model(req: ScriptedRequest) -> Step:
    """Looks the ticket up; refunds even tickets; answers."""
    ticket, results = ticket_of(req), req.tool_results
    if not results:
        return call("lookup", ticket=ticket)
    if len(results) == 1 and ticket % 2 == 0:
        return call("refund", ticket=ticket, amount=10)
    return text(f"ticket {ticket}: {'refunded 10' if ticket % 2 == 0 else 'no refund'}")


def candidate_model(
    diverging: Collection[int] = (), extra_lookup: Collection[int] = ()
) -> Callable[[ScriptedRequest], Step]:
    """As :func:`recorded_model`, but refunds the ``diverging`` (odd) tickets too, and looks
    the ``extra_lookup`` tickets up a second time (ticket + 100) before answering."""

    def respond(req: ScriptedRequest) -> Step:
        ticket, results = ticket_of(req), req.tool_results
        if ticket in extra_lookup:
            if len(results) == 1:
                return call("lookup", ticket=ticket + 100)
            if len(results) == 2:
                return text(f"ticket {ticket}: {results[1]}")
        if ticket in diverging:
            if len(results) == 1:
                return call("refund", ticket=ticket, amount=20)
            if len(results) == 2:
                return text(f"ticket {ticket}: {results[1]}")
        return recorded_model(req)

    return respond


def desk_agents(desk_model: ModelSpec, child_model: ModelSpec) -> Agent:
    """``desk`` asks ``researcher`` (an agent tool, which looks ticket 7 up), spawns ``clerk``
    (a subagent, which looks ticket 8 up), waits for it and answers with what both said."""
    researcher = Agent(
        name="researcher", instructions="Research.", model=child_model, tools=[lookup, refund]
    )
    clerk = Agent(name="clerk", instructions="Check.", model=child_model, tools=[lookup, refund])
    return Agent(
        name="desk",
        instructions="Delegate.",
        model=desk_model,
        tools=[researcher.as_tool()],
        subagents=Subagents([clerk]),
    )


def desk_model(req: ScriptedRequest) -> Step:
    results = req.tool_results
    asker = next(name for name in req.tool_names if "researcher" in name)
    if not results:
        return call(asker, input="what happened?")
    if len(results) == 1:
        return call("spawn_subagent", agent="clerk", prompt="check the ledger")
    if len(results) == 2:
        return call("wait_subagents")
    return text("desk: " + " | ".join(results[0:1] + results[2:3]))


def _is_clerk(req: ScriptedRequest) -> bool:
    return "ledger" in req.last_user_text


def child_model(req: ScriptedRequest) -> Step:
    """The researcher looks ticket 7 up, the clerk ticket 8; then each answers."""
    results = req.tool_results
    if "lookup" in req.tool_names and not results:
        return call("lookup", ticket=8 if _is_clerk(req) else 7)
    return text(f"child says: {req.last_user_text} {' '.join(results)}".strip())


def child_model_refunding(req: ScriptedRequest) -> Step:
    """As :func:`child_model`, but the researcher also refunds ticket 7."""
    if not _is_clerk(req) and len(req.tool_results) == 1:
        return call("refund", ticket=7, amount=5)
    return child_model(req)


def clerk_refunding(req: ScriptedRequest) -> Step:
    """As :func:`child_model`, but the clerk (the subagent) also refunds ticket 8."""
    if _is_clerk(req) and len(req.tool_results) == 1:
        return call("refund", ticket=8, amount=5)
    return child_model(req)


_MODEL = ModelSpec(
    provider="openai",
    name=os.environ.get("EVAL_MODEL_NAME", "eval-model"),
    base_url=f"{os.environ.get('EVAL_MODEL_URL', 'http://127.0.0.1:9')}/v1",
    heartbeat_timeout_seconds=5.0,
    timeout_seconds=30,
)

triage = triage_agent(_MODEL)
