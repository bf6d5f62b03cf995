"""The evaluation's data: what the eval workflow takes and what it returns.

Compatibility data (the ``RelayEval`` workflow's input and result, its activities' payloads):
add fields with defaults; never rename or remove one.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field

from relaykit.eval_context import EvalCall
from relaykit.evals.recording import RecordedRun
from relaykit.messages import Usage
from relaykit.runs import RunResult

EVAL_WORKFLOW = "RelayEval"
"""Workflow type of an evaluation (compatibility data)."""
PREPARE_ACTIVITY = "relaykit.eval_prepare"
"""Reads one recorded run (compatibility data)."""
SCORE_ACTIVITY = "relaykit.eval_score"
"""Compares a candidate with its recording (compatibility data)."""

Verdict = Literal["passed", "failed", "skipped"]


class EvalSource(BaseModel):
    """One recorded run to evaluate: a workflow id on the server, or a history file."""

    run_id: str | None = None
    history_file: str | None = None

    @property
    def label(self) -> str:
        return self.run_id or self.history_file or "?"


class EvalInput(BaseModel):
    """The input of the ``RelayEval`` workflow."""

    sources: list[EvalSource]
    concurrency: int = Field(4, ge=1)
    """At most this many candidate runs at once."""
    live_reads: bool = False
    """Unmatched calls of ``"read"`` tools run live."""
    eval_attribute: bool = False
    """Candidates carry ``RelayEvalOf`` (the namespace has it registered)."""
    pass_score: float = Field(1.0, ge=0, le=1)
    """A run passes when its score reaches this."""


class Divergence(BaseModel):
    """The first step where the candidate did not do what the recording did."""

    turn: int
    tool: str | None = None
    """The candidate's call at that step (``None``: it answered instead, or stopped)."""
    arguments: str | None = None
    recorded: str = ""
    """What the recording did at that step, in a few words."""


class RunReport(BaseModel):
    """One recorded run against its candidate."""

    recorded_run: str
    agent: str = ""
    candidate_run: str | None = None
    verdict: Verdict = "failed"
    reason: str = ""
    """Why it failed or was skipped (a different answer, a failed candidate, a missing agent)."""
    same_answer: bool = False
    score: float = 0.0
    recorded_output: str = ""
    candidate_output: str = ""
    divergence: Divergence | None = None
    matched: int = 0
    live: int = 0
    blocked: list[EvalCall] = Field(default_factory=list)
    recorded_usage: Usage = Field(default_factory=Usage)
    candidate_usage: Usage = Field(default_factory=Usage)
    recorded_seconds: float | None = None
    candidate_seconds: float | None = None


class EvalTotals(BaseModel):
    """The evaluation in total (skipped runs count in none of the rates)."""

    runs: int = 0
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    pass_rate: float = 0.0
    mean_score: float = 0.0
    recorded_tokens: int = 0
    candidate_tokens: int = 0
    recorded_cost_usd: float = 0.0
    candidate_cost_usd: float = 0.0
    blocked: int = 0


class EvalReport(BaseModel):
    """What the ``RelayEval`` workflow returns."""

    eval_id: str
    runs: list[RunReport] = Field(default_factory=list)
    totals: EvalTotals = Field(default_factory=EvalTotals)


class ScoreInput(BaseModel):
    """Input of the ``relaykit.eval_score`` activity."""

    recorded: RecordedRun
    pass_score: float = 1.0
    candidate: RunResult | None = None
    candidate_run: str | None = None
    failure: str | None = None
    """The candidate run's failure, when it did not finish."""
