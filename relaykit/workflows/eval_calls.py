"""Tool calls of a candidate run of an evaluation: answered from the recording, never by surprise.

A run whose input carries an :class:`~relaykit.eval_context.EvalContext` is a candidate: a
changed agent answering a recorded run's input again (:mod:`relaykit.evals`). The tool path asks
:meth:`RecordedTools.answer` before a call of any kind but a handoff runs (after its checks,
before an approval wait):

- a call whose tool and canonical arguments equal a recorded call of that tool not yet used
  (the first such, in the recording's order) gets that call's result, and nothing runs;
- an unmatched call of a ``"read"`` tool runs live when the evaluation allows live reads;
- any other call gets an error result saying it was not executed during evaluation.

Agent tools and ``spawn_subagent`` are matched the same way, and a matched one whose recorded
child run was read runs the candidate's child agent (or subagent) as a candidate itself, against
the recorded child's calls (recursively); without a recorded child its recorded result is the
result and no child starts. Once the candidate has subagents of its own, ``wait_subagents``,
``cancel_subagent`` and ``send_to_subagent`` act on them as in any run (they touch nothing but
the candidate's own tasks), so the parent reads its candidate subagents' real reports; before
that they are matched as calls. A ``"write"`` function or MCP tool is never executed. Handoffs
run as they do in any run: switching the agent touches nothing (an ``on_handoff`` callback still
runs; keep it free of effects in agents you evaluate).

Which recorded calls were used lives in this object only: a candidate that continued as new
would match from the start again (candidates are short runs; evaluations do not continue as new).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from relaykit.eval_context import (
    NOT_EXECUTED,
    EvalCall,
    EvalContext,
    RecordedCall,
    canonical_arguments,
)
from relaykit.messages import ToolCall
from relaykit.workflows.run_state import Run
from relaykit.workflows.tool_kind import ToolKind, ToolResult

TASK_TOOLS = ("wait_subagents", "cancel_subagent", "send_to_subagent")
"""The subagent tools that act on tasks the run started (not ``spawn_subagent``)."""


class RecordedTools:
    """The candidate's calls against the recording's (see the module docstring)."""

    def __init__(self, run: Run, context: EvalContext) -> None:
        self.run = run
        self.context = context
        self._used: dict[str, set[int]] = {}
        self.calls: list[EvalCall] = []
        """Every call answered here, in the order the tool path asked, for the run's result."""

    def answer(self, kind: ToolKind, call: ToolCall) -> ToolResult | EvalContext | None:
        """The call's result without running it; ``None`` when it runs live; for a matched
        agent-tool or ``spawn_subagent`` call whose recorded child was read, that child's calls:
        the kind runs the candidate's child agent against them."""
        arguments = canonical_arguments(call.arguments)
        if call.name in TASK_TOOLS and self.run.state.tasks:  # its own subagents: as in any run
            matched = self._match(call.name, arguments) is not None
            self._note(call, arguments, "matched" if matched else "live")
            return None
        candidate = self._match(call.name, arguments)
        if candidate is not None:
            self._note(call, arguments, "matched")
            if candidate.child is not None and kind.evaluates_children:
                return candidate.child.model_copy(
                    update={"live_reads": self.context.live_reads, "mark": self.context.mark}
                )
            return ToolResult(candidate.content, is_error=candidate.is_error)
        if kind.effect == "read" and self.context.live_reads:
            self._note(call, arguments, "live")
            return None
        self._note(call, arguments, "blocked")
        return ToolResult(NOT_EXECUTED.format(tool=call.name), is_error=True)

    def _match(self, tool: str, arguments: str) -> RecordedCall | None:
        """The first recorded call of ``tool`` with these arguments not used yet (now used)."""
        used = self._used.setdefault(tool, set())
        for index, recorded in enumerate(self.context.calls.get(tool, [])):
            if index not in used and recorded.arguments == arguments:
                used.add(index)
                return recorded
        return None

    def _note(self, call: ToolCall, arguments: str, outcome: str) -> None:
        self.calls.append(
            EvalCall.model_validate(
                {
                    "turn": self.run.state.turn,
                    "tool": call.name,
                    "arguments": arguments,
                    "outcome": outcome,
                }
            )
        )
