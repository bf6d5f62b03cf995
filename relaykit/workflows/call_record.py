"""What the live path decided about each tool call, read back when the run is replayed.

Whether a call runs depends on the agent definitions of the worker that first decided it: is
there a tool of that name, do the arguments fit its schema, does the loop guard refuse it, does
it need a person's approval, does its kind accept it (a subagent of that name). A worker with
edited definitions can decide otherwise. If it did so while replaying, it would issue other
commands than the history holds, and the run would fail its workflow task forever
(non-determinism). So a decision is made once, on the live path, and replay reads it back.

**How it is recorded** (runs with ``RunSetup.recorded_decisions``, docs/architecture.md): by the
local activity ``relaykit.record_decisions``, which returns its input. The workflow decides with
today's definitions, passes the codes of what it decided, and goes on with what the activity
returns: live that is what it passed; on replay Temporal returns the result recorded in the
activity's marker, whatever today's definitions decided, so the same code serves both. Temporal
matches local activities by their order, and a marker the code does not schedule, or a
schedule without a marker, fails the workflow task (non-determinism), so *whether* a recording
is scheduled never depends on the definitions, only on what history already holds:

- one per turn with tool calls (the calls come from the model call's recorded result), made
  before any call of the turn starts: per call position, ``u`` unknown tool, ``a``/``t`` waits
  for a person (without, with a time limit), ``w`` waits for an earlier call's approval
  decision before it is admitted, ``r`` refused (loop guard, arguments, its kind's own check,
  a second handoff) for every call admitted then;
- one per call that waits for an earlier call's approval decision (``w``, itself recorded), when
  it is admitted: ``r`` or nothing;
- one per final answer of a model call that asked for a structured answer (recorded in its
  result, ``ModelResponse.output_checked``): ``x`` rejected or nothing
  (:mod:`relaykit.workflows.final_answer`).

That is one marker event per recording, no search attribute, a few bytes of codes, and no
branching on replay state. Where a replay's own decisions differ from the recorded ones, the
recorded ones stand: a call recorded as run runs again as the kind of tool it was when the model
was offered it, read from the model call's recorded result (``ModelResponse.routes``, see
:func:`relaykit.workflows.tool_table.stand_in`), so a renamed or removed tool replays as its
recorded activity; one recorded as refused is refused (:data:`REFUSED_ON_REPLAY`). An agent a
run switched to that today's code no longer defines is replayed with a stand-in agent
(:func:`stand_in_agent`); at its next live turn the run fails with ``UnknownAgent``.

**Since ``relaykit.run-setup.v6``** (``RunSetup.bounded_decision_markers``) a plain turn, whose
calls all run, records nothing: the local activity was the largest cost a tool turn added
under load. A decision that is not "run it" is recorded by a patch marker at the point where
the live path makes it (the scheme below, with ``relaykit.call.<turn>.waited`` for a turn whose
later calls wait for an earlier call's approval decision), and a replay reads it back with
``patched``, which is what tells it whether a recording follows. Each marker makes Core upsert
``TemporalChangeVersion`` with every patch id so far, so a run writes at most
:data:`MARKER_BOUND` of them (``RunState.decision_markers``, counted from history live and on
replay alike); every tool turn after the one that reached the bound is recorded by the local
activity as above (a turn that reaches the bound finishes with markers, so each turn is
recorded one way).

Runs recorded before ``relaykit.run-setup.v2`` (``RunSetup.recorded_calls`` without
``recorded_decisions``) keep the
earlier scheme to their end: a patch marker per decision, named after the call's turn and
position (``relaykit.call.<turn>.<position>.unknown``, ``.refused``, ``.asked``,
``.asked-timed``; ``relaykit.answer.<turn>.rejected``), each with Temporal's upsert of its
``TemporalChangeVersion`` search attribute, asked for at the point where the live path wrote it
(:meth:`CallRecord.mode` tells the two apart by replay state). Runs started before either
(``recorded_calls`` is ``False``) decide from today's definitions, as they always did.

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
from relaykit.runs import RECORD_DECISIONS_ACTIVITY, RunState
from relaykit.tools import Tool

PATCH_RECORDED_CALLS = "relaykit.recorded-call-decisions"
"""``RunSetup.recorded_calls``: call decisions are recorded and replayed (compatibility data)."""

# The codes of recorded decisions (compatibility data: recorded in history).
UNKNOWN = "u"
REFUSED = "r"
ASKED = "a"
ASKED_TIMED = "t"
WAITS = "w"
REJECTED = "x"

MARKER_BOUND = 16
"""Runs with ``RunSetup.bounded_decision_markers`` record this many decisions by a patch
marker each; every tool turn after the one that reached it is recorded by the local activity.
Each marker also makes Core upsert ``TemporalChangeVersion`` with every patch id the run has
used, so the bound keeps that attribute small (compatibility data: never lower it)."""

RECORD_TIMEOUT = timedelta(seconds=10)
"""The recording local activity returns its input; it never takes long."""

Ask = Literal["untimed", "timed"]
"""A call that waits for a person: without a time limit, or with one (``approval_timeout``)."""

Mode = Literal["today", "recorded", "live", "replay"]
"""How a call is decided: from today's definitions without recording (runs started before),
recorded by the local activity (one path, live or replayed), or by a patch marker each: on the
live path and recorded, or read back from what was recorded."""

TIMEOUT_ON_REPLAY = timedelta(days=1)
"""The time limit of a replayed wait that had one when today's tool has none: the timer's
duration is the server's, as first recorded; only its presence must match."""

REFUSED_ON_REPLAY = (
    "The call was not run: it was refused when it was made (the tool did not exist, its "
    "arguments were invalid, or it repeated an earlier call)."
)
"""The result of a call recorded as refused that today's checks would accept (its original
error text is in the transcript the model saw, not in history)."""


async def recorded(codes: list[str]) -> list[str]:
    """Record ``codes`` (what today's definitions decided) and return the codes that stand:
    the same, live; those recorded then, on replay. Call it only where history decides that a
    recording is made (see the module docstring). Every decision a run records this way goes
    through here: its calls' and, in :mod:`relaykit.workflows.budget_stops`, its budget's."""
    result: list[str] = await workflow.execute_local_activity(
        RECORD_DECISIONS_ACTIVITY,
        codes,
        result_type=list[str],
        start_to_close_timeout=RECORD_TIMEOUT,
    )
    return result


def recorded_calls() -> dict[str, bool]:
    """The ``RunSetup`` field, for the first workflow task of a run recorded before
    ``relaykit.run-setup.v2`` (new runs have it on, and ``recorded_decisions`` too:
    :data:`relaykit.workflows.run_setup.NEW_RUN_CHOICES`): ``True`` when it holds the marker."""
    return {"recorded_calls": workflow.patched(PATCH_RECORDED_CALLS)}


def asked(code: str) -> Ask | None:
    """A call's recorded wait for a person, from its codes."""
    if ASKED in code:
        return "untimed"
    return "timed" if ASKED_TIMED in code else None


def ask_code(ask: Ask | None) -> str:
    return "" if ask is None else ASKED if ask == "untimed" else ASKED_TIMED


@dataclass(frozen=True)
class Slot:
    """Where a call sits: its turn and its position in that turn's message."""

    turn: int
    position: int

    def marker(self, outcome: str) -> str:
        return f"relaykit.call.{self.turn}.{self.position}.{outcome}"


class CallRecord:
    """The recorded decisions of one run's calls."""

    def __init__(
        self, enabled: bool, by_activity: bool = False, bounded: RunState | None = None
    ) -> None:
        self.enabled = enabled
        self.by_activity = by_activity
        self.state = bounded
        """The run's state, in runs with ``RunSetup.bounded_decision_markers`` (this module
        writes its ``decision_markers``)."""

    def mode(self) -> Mode:
        """Asked at the moment of each decision: a workflow task is replayed or live as a whole
        (only runs recorded with a marker per decision tell the two apart). A run with bounded
        markers records a turn by the local activity once an earlier turn reached the bound:
        every call of a turn is decided the same way, live and on replay."""
        if not self.enabled:
            return "today"
        if self.by_activity or self._bound_reached():
            return "recorded"
        return "replay" if workflow.unsafe.is_replaying() else "live"

    @property
    def bounded(self) -> bool:
        """Whether the run records by bounded markers (``RunSetup.bounded_decision_markers``)."""
        return self.state is not None

    def _bound_reached(self) -> bool:
        """Whether a turn before this one wrote the run's last marker (the marker ids name
        their turn: ``relaykit.call.<turn>.…``, ``relaykit.answer.<turn>.…``)."""
        if self.state is None:
            return False
        markers = self.state.decision_markers
        return len(markers) >= MARKER_BOUND and int(markers[-1].split(".")[2]) < self.state.turn

    def _patched(self, marker: str) -> bool:
        """A decision's marker: written live, read back on replay; counted either way."""
        written = workflow.patched(marker)
        if written and self.state is not None:
            markers = self.state.decision_markers
            if len(markers) < MARKER_BOUND and marker not in markers:
                self.state.decision_markers.append(marker)
        return written

    async def record(self, codes: list[str]) -> list[str]:
        """:func:`recorded`, for the decisions of this run's calls."""
        return await recorded(codes)

    def unknown(self, slot: Slot) -> bool:
        """Replay: whether the call named a tool the agent did not have when it was made."""
        return self._patched(slot.marker("unknown"))

    def record_unknown(self, slot: Slot) -> None:
        self._patched(slot.marker("unknown"))

    def refused(self, slot: Slot) -> bool:
        """Replay: whether the call was refused when it was made."""
        return self._patched(slot.marker("refused"))

    def record_refused(self, slot: Slot) -> None:
        self._patched(slot.marker("refused"))

    def asked(self, slot: Slot) -> Ask | None:
        """Replay: whether the call was to wait for a person when it was made (decided before
        the turn's calls start: later calls of the turn may wait for its decision), and whether
        that wait had a time limit (a timer in history)."""
        if self._patched(slot.marker("asked")):
            return "untimed"
        if self._patched(slot.marker("asked-timed")):
            return "timed"
        return None

    def record_asked(self, slot: Slot, ask: Ask) -> None:
        self._patched(slot.marker("asked" if ask == "untimed" else "asked-timed"))

    def waited(self, turn: int) -> bool:
        """Replay, runs with bounded markers: whether the calls of ``turn`` after one that
        waited for a person waited for its decision (the agent's ``approval_order`` then)."""
        return self._patched(f"relaykit.call.{turn}.waited")

    def record_waited(self, turn: int) -> None:
        self._patched(f"relaykit.call.{turn}.waited")

    def rejected(self, turn: int) -> bool:
        """Replay: whether the final answer of ``turn`` was rejected (its output type)."""
        return self._patched(f"relaykit.answer.{turn}.rejected")

    def record_rejected(self, turn: int) -> None:
        self._patched(f"relaykit.answer.{turn}.rejected")


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
