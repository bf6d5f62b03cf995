"""The interface every kind of tool implements, and the outcomes it returns.

A kind of tool (function tools, MCP tools, agents as tools, the subagent tools, handoffs) is
one module with one class per kind that answers four questions for the tool path
(:mod:`relaykit.workflows.tool_path`):

- :meth:`ToolKind.spec`: what the model is shown (``None``: answered, but not shown);
- :meth:`ToolKind.prepare`: are the arguments valid? It is synchronous and may not touch the
  world; it returns :class:`Prepared` or the :class:`ToolResult` the model reads instead;
- :meth:`ToolKind.execute`: run the prepared call (an activity, a child workflow, a signal, a
  wait) and return its :class:`ToolResult`;
- :meth:`ToolKind.approval_hint`: the tool's own rule (``needs_approval``), whether a call waits
  for a person. The rule is user code and may raise: only the tool path calls it, once per call
  and guarded, before the turn's calls start (a call that waits orders later calls behind it);
  a rule that raises gives the call an error result naming the tool and the exception.

Everything that applies to every call is the tool path's, never a kind's: the ``tool_call`` and
``tool_result`` events, the argument check (a JSON object), the unknown-tool answer, the loop
guard, the guard around the approval rule, the approval wait and its order, the cap on the
result's length (:attr:`ToolKind.max_output_chars`), the transcript message, and counting the
usage a :class:`ToolResult` carries towards the budget. A kind never writes a transcript
message and never asks for the approval its tool's rule requires; the one person it may ask is
about a ``"write"`` lost in flight, through :mod:`relaykit.workflows.tool_outcome` (the kinds
that run user code as activities: function tools, MCP tools, a handoff's ``on_handoff``).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from pydantic import ValidationError

from relaykit.agent import Handoff
from relaykit.messages import ToolCall, ToolSpec, Usage
from relaykit.tools import DEFAULT_MAX_OUTPUT_CHARS
from relaykit.workflows.loop_guard import PATCH_ID as GUARD_PATCH

PATCH_BAD_ARGUMENTS = "relaykit.reject-bad-arguments"
"""Patch id (docs/replay.md): arguments that are not a JSON object, and invalid handoff
arguments, get an error result and run nothing (before: read leniently)."""


@dataclass
class ToolResult:
    """What a call returned, as the model will read it."""

    content: str
    is_error: bool = False
    usage: Usage | None = None
    """Usage spent on the call's behalf (a child run's): counted towards this run's budget by
    the tool path before the result reaches the transcript. ``None``: nothing to count."""
    switch: tuple[Handoff, str | None] | None = None
    """A handoff that happened: the agent the conversation moves to (and why) at the end of
    the turn; the turn loop switches."""


@dataclass
class Prepared:
    """A call whose arguments were accepted: what :meth:`ToolKind.execute` runs."""

    call: ToolCall
    arguments: Any = None
    """The arguments as the kind parsed them (a pydantic model, a dict, …)."""
    needs_approval: bool = False
    """The call waits for a person's decision before it runs (set by the tool path from
    :meth:`ToolKind.approval_hint`)."""
    evaluation: Any = None
    """In a candidate run of an evaluation, an agent-tool or ``spawn_subagent`` call's recorded
    child (:class:`~relaykit.eval_context.EvalContext`): the child runs as a candidate against
    it."""


class ToolKind:
    """One tool the model may call, as the tool path sees it (see the module docstring)."""

    name: str
    """The name the model calls (compatibility data: recorded in history)."""
    barrier: bool = False
    """Runs after the turn's other calls, and only the first of a turn runs (handoffs)."""
    approval_timeout: timedelta | None = None
    """How long a person may take to decide (``None``: no limit)."""
    effect: str = "write"
    """What a call does to the world (``"read"``, ``"idempotent"``, ``"write"``), as far as the
    kind knows; an evaluation runs only unmatched ``"read"`` calls live
    (:mod:`relaykit.workflows.eval_calls`). Kinds that do not declare one count as writes."""
    evaluates_children: bool = False
    """In an evaluation, a matched call with a recorded child run starts the candidate's child
    as a candidate against it (agent tools, ``spawn_subagent``); other kinds, and these when no
    child was recorded, answer with the recorded result."""
    guard_patch: str = GUARD_PATCH
    """The patch id under which the loop guard refuses this kind's repeats (docs/replay.md)."""
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    """Results longer than this reach the model cut, with a marker saying how much was dropped
    (:func:`relaykit.tools.cap_output`, applied by the tool path to every kind's result)."""
    route: str | None = None
    """What a replay needs to run a call of this tool once today's code no longer defines it
    (:func:`relaykit.workflows.call_record.route`); ``None``: a function tool."""

    def spec(self) -> ToolSpec | None:
        raise NotImplementedError

    def call_event(self, call: ToolCall) -> dict[str, Any]:
        """Extra data of the call's ``tool_call`` event (e.g. the child run it starts)."""
        return {}

    def approval_hint(self, call: ToolCall) -> bool:
        """The tool's ``needs_approval`` rule for ``call`` (``False`` for arguments
        :meth:`prepare` refuses). User code: it may raise; the tool path guards it."""
        return False

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        raise NotImplementedError

    def refusal(self, prepared: Prepared) -> ToolResult | None:
        """A refusal that depends on the run's state and the kind's definition (no subagent of
        that name, too many tasks running), decided before anything runs; the tool path records
        it like every refusal (:mod:`relaykit.workflows.call_record`)."""
        return None

    async def execute(self, prepared: Prepared) -> ToolResult:
        raise NotImplementedError

    def replayed(self, call: ToolCall) -> Prepared:
        """A call the run recorded as run, replayed: its arguments as :meth:`prepare` reads
        them, or as they are when today's schema refuses them (the call ran under another)."""
        prepared = self.prepare(call)
        return Prepared(call) if isinstance(prepared, ToolResult) else prepared


def approval_rule(kind: ToolKind, call: ToolCall) -> bool | str:
    """Whether ``call`` waits for a person by its tool's rule, or the error text the model reads
    when the rule raised. The rule is user code run in workflow code: one that raises would
    raise again on every retry of the workflow task, so its failure is the call's, never the
    run's."""
    try:
        return bool(kind.approval_hint(call))
    except Exception as exc:  # noqa: BLE001 - any failure of user code: the call's result
        try:
            said = str(exc)[:500]
        except Exception:  # noqa: BLE001 - a broken __str__ is user code too
            said = "(its message could not be read)"
        return (
            f"The call was not run: deciding whether tool {call.name!r} needs approval failed: "
            f"its needs_approval rule raised {type(exc).__name__}: {said}"
        )


def invalid_arguments(tool_name: str, exc: ValidationError) -> str:
    """What the model reads when its arguments do not validate: each problem with its place."""
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
        for err in exc.errors(include_url=False)[:10]
    )
    return f"Invalid arguments for tool {tool_name!r}: {problems}. Fix them and call it again."
