"""The final answer: checked against the output type, and that check decided once.

An answer the agent's output type accepts ends the run; one it rejects makes the turn loop ask
for a repair (or fail the run once the repairs allowed are spent). The output type is part of
the agent's definition, which a deploy may change: a worker replaying a run must not accept an
answer the run's first worker rejected, or reject one it accepted, since the commands that
follow differ (another model call, or the end). So the verdict is decided once and recorded
(:mod:`relaykit.workflows.call_record`): by the recording local activity, for each answer of a
model call that asked for a structured answer (its recorded result says so,
``ModelResponse.output_checked``; an answer of one that did not is accepted as it is, on replay
too); in runs recorded before, a rejection as a patch marker (``relaykit.answer.<turn>.rejected``)
that a replay reads back.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from relaykit.agent import Agent
from relaykit.messages import ModelResponse
from relaykit.output import OutputType
from relaykit.workflows.call_record import REJECTED
from relaykit.workflows.run_state import Run

REJECTED_ON_REPLAY = "the answer did not match the output type when it was given"
"""Why a replayed answer that was rejected is rejected, when today's output type accepts it."""


@dataclass
class Verdict:
    """An answer accepted (``problem`` is ``None``, ``output`` the run's result), or not."""

    output: Any = None
    problem: str | None = None


class FinalAnswers:
    """The output types of one run's agents (or the run's override), and their verdicts."""

    def __init__(self, run: Run, output_type: Any = None) -> None:
        self.run = run
        self.override = OutputType(output_type) if output_type is not None else None
        self._types: dict[str, OutputType] = {}

    def output_type(self, agent: Agent) -> OutputType | None:
        if self.override is not None:
            return self.override
        if agent.output_type is None:
            return None
        if agent.name not in self._types:
            self._types[agent.name] = OutputType(agent.output_type)
        return self._types[agent.name]

    async def check(self, agent: Agent, text: str, response: ModelResponse) -> Verdict:
        """The verdict on ``text``, the answer of ``response``: today's, unless one was recorded."""
        mode = self.run.calls.mode()
        if mode == "recorded":
            if response.output_checked is False:  # no output type then
                return Verdict(output=text)
            verdict = self._check(agent, text)
            codes = await self.run.calls.record([REJECTED if verdict.problem else ""])
            return _as_recorded(verdict, text, codes == [REJECTED])
        verdict = self._check(agent, text)
        turn = self.run.state.turn
        if mode == "live" and verdict.problem is not None:
            self.run.calls.record_rejected(turn)
        elif mode == "replay":
            return _as_recorded(verdict, text, self.run.calls.rejected(turn))
        return verdict

    def _check(self, agent: Agent, text: str) -> Verdict:
        output_type = self.output_type(agent)
        if output_type is None:
            return Verdict(output=text)
        try:
            return Verdict(output=output_type.dump(output_type.parse(text)))
        except Exception as exc:  # noqa: BLE001 - a user validator may raise anything on model text
            return Verdict(problem=str(exc))


def _as_recorded(verdict: Verdict, text: str, rejected: bool) -> Verdict:
    """The verdict that stands: the recorded one, where today's output type decides otherwise."""
    if rejected and verdict.problem is None:
        return Verdict(problem=REJECTED_ON_REPLAY)
    if not rejected and verdict.problem is not None:  # accepted then
        return Verdict(output=text)
    return verdict
