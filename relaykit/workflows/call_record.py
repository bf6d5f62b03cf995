"""What the live path decided about each tool call, read back when the run is replayed.

Whether a call runs depends on the agent definitions of the worker that first decided it: is
there a tool of that name, do the arguments fit its schema, does the loop guard refuse it, does
it need a person's approval, does its kind accept it (a subagent of that name). A worker with
edited definitions can decide otherwise. If it did so while replaying, it would issue other
commands than the history holds, and the run would fail its workflow task forever
(non-determinism). So a decision is made once, on the live path, and replay reads it back:

- a call of a tool the agent did not have is recorded as **unknown**, one refused otherwise
  (loop guard, arguments, its kind's own check) as **refused**, and one that is to wait for a
  person as **asked**, each by a patch marker named after the call's turn and position
  (``relaykit.call.<turn>.<position>.refused``). These are the rare paths: the common call,
  which simply ran, costs no history event. (Temporal adds each patch id to the run's
  ``TemporalChangeVersion`` search attribute, with an upsert event, until that attribute reaches
  its size limit; after that the SDK skips the upsert and logs a warning.) A replay asks for
  each marker at the point where the live path wrote it, since markers must come back in the
  order they were written;
- on replay, a call without a marker *ran*, whatever today's checks say: it runs again as the
  kind of tool it was when the model was offered it, read from the model call's recorded result
  (``ModelResponse.routes``, see :func:`stand_in`), so a renamed or removed tool replays as its
  recorded activity;
- an agent a run switched to that today's code no longer defines is replayed with a stand-in
  agent (:func:`stand_in_agent`); at its next live turn the run fails with ``UnknownAgent``.

Runs started before this was recorded (``RunSetup.recorded_calls`` is ``False``) decide from
today's definitions, as they always did.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict
from temporalio import workflow

from relaykit.agent import Agent, AgentTool, Handoff
from relaykit.messages import ToolCall
from relaykit.models.spec import ModelSpec
from relaykit.tools import Tool

PATCH_RECORDED_CALLS = "relaykit.recorded-call-decisions"
"""``RunSetup.recorded_calls``: call decisions are recorded and replayed (compatibility data)."""

Ask = Literal["untimed", "timed"]
"""A call that waits for a person: without a time limit, or with one (``approval_timeout``)."""

Mode = Literal["today", "live", "replay"]
"""How a call is decided: from today's definitions without recording (runs started before),
on the live path and recorded, or read back from what was recorded."""

TIMEOUT_ON_REPLAY = timedelta(days=1)
"""The time limit of a replayed wait that had one when today's tool has none: the timer's
duration is the server's, as first recorded; only its presence must match."""

REFUSED_ON_REPLAY = (
    "The call was not run: it was refused when it was made (the tool did not exist, its "
    "arguments were invalid, or it repeated an earlier call)."
)
"""The result of a call recorded as refused that today's checks would accept (its original
error text is in the transcript the model saw, not in history)."""


def recorded_calls() -> dict[str, bool]:
    """The ``RunSetup`` field, for a run's first workflow task: ``True`` for a new run (a marker
    is written), ``False`` when replaying a run recorded before."""
    return {"recorded_calls": workflow.patched(PATCH_RECORDED_CALLS)}


@dataclass(frozen=True)
class Slot:
    """Where a call sits: its turn and its position in that turn's message."""

    turn: int
    position: int

    def marker(self, outcome: str) -> str:
        return f"relaykit.call.{self.turn}.{self.position}.{outcome}"


class CallRecord:
    """The recorded decisions of one run's calls."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def mode(self) -> Mode:
        """Asked at the moment of each decision: a workflow task is replayed or live as a whole."""
        if not self.enabled:
            return "today"
        return "replay" if workflow.unsafe.is_replaying() else "live"

    def unknown(self, slot: Slot) -> bool:
        """Replay: whether the call named a tool the agent did not have when it was made."""
        return workflow.patched(slot.marker("unknown"))

    def record_unknown(self, slot: Slot) -> None:
        workflow.patched(slot.marker("unknown"))

    def refused(self, slot: Slot) -> bool:
        """Replay: whether the call was refused when it was made."""
        return workflow.patched(slot.marker("refused"))

    def record_refused(self, slot: Slot) -> None:
        workflow.patched(slot.marker("refused"))

    def asked(self, slot: Slot) -> Ask | None:
        """Replay: whether the call was to wait for a person when it was made (decided before
        the turn's calls start: later calls of the turn may wait for its decision), and whether
        that wait had a time limit (a timer in history)."""
        if workflow.patched(slot.marker("asked")):
            return "untimed"
        if workflow.patched(slot.marker("asked-timed")):
            return "timed"
        return None

    def record_asked(self, slot: Slot, ask: Ask) -> None:
        workflow.patched(slot.marker("asked" if ask == "untimed" else "asked-timed"))


# --- what a call ran as, when today's code no longer knows its tool ----------------------------

ROUTE_HANDOFF = "handoff"
ROUTE_AGENT = "agent"
ROUTE_SUBAGENTS = "subagents"


def route(kind: str, *parts: str) -> str:
    """A tool's route as the model call's result records it: ``handoff:<target>[:callback]``,
    ``agent:<agent>``, ``subagents``; function tools have none (their activity is named after
    the tool), nor have MCP tools (their listing is recorded: they replay as listed)."""
    return ":".join([kind, *parts])


@dataclass(frozen=True)
class Route:
    kind: str
    target: str = ""
    callback: bool = False


def parse_route(text: str | None) -> Route:
    """``None`` (or anything unreadable) is a function tool: an activity named like the call."""
    if not text:
        return Route("function")
    kind, _, rest = text.partition(":")
    if kind == ROUTE_HANDOFF:
        target, _, flag = rest.partition(":")
        return Route(kind, target, flag == "callback")
    return Route(kind, rest)


def stand_in_agent(name: str) -> Agent:
    """An agent today's code no longer defines, as replay needs it: its name (the commands it
    issued are matched by type, not by content), no tools of its own, a model never called."""
    return Agent(name=name, instructions="", model=ModelSpec(name="stand-in"))


def _no_callback(*_: object) -> None:
    """A stand-in's ``on_handoff``: never called (its recorded activity's result is replayed)."""


class _AnyArguments(BaseModel):
    model_config = ConfigDict(extra="allow")


def _never_runs(**_: Any) -> str:  # pragma: no cover - a stand-in's activity is replayed
    raise RuntimeError("a stand-in tool never runs")


def stand_in_tool(name: str) -> Tool:
    """A function tool today's code no longer defines, as a replay of a run that called it
    needs it: its name, which is its activity's type. Its recorded result is replayed; a worker
    that gets such a call live answers it as gone (``relaykit.activities.gone_tools``)."""
    return Tool(name=name, description="", function=_never_runs, args_model=_AnyArguments)


def stand_in_handoff(call: ToolCall, found: Route) -> Handoff:
    return Handoff(
        target=stand_in_agent(found.target),
        name=call.name,
        on_handoff=_no_callback if found.callback else None,
    )


def stand_in_agent_tool(call: ToolCall, agent: str) -> AgentTool:
    return AgentTool(agent=stand_in_agent(agent), name=call.name, description="")
