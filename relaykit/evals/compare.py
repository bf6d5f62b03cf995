"""Comparing a candidate with its recording: same answer, score, first divergent step, totals.

Pure functions over data, so the report is the same whichever worker computes it, and again
after a crash.

- **Same answer**: the outputs are equal as text, or equal as JSON (key order and spacing do
  not count).
- **Score**: the candidate module's ``score(recorded, candidate) -> float`` in 0..1 when it
  defines one (outside 0..1 is clamped), else 1.0 for the same answer and 0.0 for another. A run
  passes when its score reaches the evaluation's pass score (default 1.0).
- **First divergence**: turn by turn, the first step where the candidate's calls (tool and
  canonical arguments, in order) or its final answer differ from the recording's.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from relaykit.evals.models import Divergence, EvalReport, EvalTotals, RunReport
from relaykit.evals.recording import RecordedRun, Step, steps_of
from relaykit.runs import RunResult

Scorer = Callable[[Any, Any], float]


def as_text(output: Any) -> str:
    return output if isinstance(output, str) else json.dumps(output, sort_keys=True)


def same_answer(recorded: Any, candidate: Any) -> bool:
    if as_text(recorded) == as_text(candidate):
        return True
    mine, theirs = _json(recorded), _json(candidate)
    return mine is not _NOT_JSON and bool(mine == theirs)


_NOT_JSON = object()


def _json(value: Any) -> Any:
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except ValueError:
        return _NOT_JSON


def _said(step: Step) -> str:
    if step.answer is not None:
        return f"answered {step.answer[:80]!r}"
    return "called " + ", ".join(f"{tool}({arguments})" for tool, arguments in step.calls)


def first_divergence(recorded: list[Step], candidate: list[Step]) -> Divergence | None:
    """The first step where ``candidate`` did not do what ``recorded`` did (``None``: none)."""
    for index in range(max(len(recorded), len(candidate))):
        mine = recorded[index] if index < len(recorded) else None
        theirs = candidate[index] if index < len(candidate) else None
        if mine is not None and theirs is not None:
            if mine.calls == theirs.calls and (mine.answer is None) == (theirs.answer is None):
                if mine.answer is None or same_answer(mine.answer, theirs.answer):
                    continue
        turn = index + 1
        done = "stopped" if mine is None else _said(mine)
        if theirs is None or not theirs.calls:
            return Divergence(turn=turn, recorded=done)
        differing = next(
            (c for i, c in enumerate(theirs.calls) if mine is None or mine.calls[i : i + 1] != [c]),
            theirs.calls[0],
        )
        return Divergence(turn=turn, tool=differing[0], arguments=differing[1], recorded=done)
    return None


def score_run(
    recorded: RecordedRun,
    candidate: RunResult | None,
    *,
    candidate_run: str | None,
    failure: str | None,
    scorer: Scorer | None,
    pass_score: float,
    candidate_seconds: float | None = None,
) -> RunReport:
    """One recorded run's report (see the module docstring)."""
    report = RunReport(
        recorded_run=recorded.run_id,
        agent=recorded.agent,
        candidate_run=candidate_run,
        recorded_output=as_text(recorded.output),
        recorded_usage=recorded.usage,
        recorded_seconds=recorded.seconds,
        candidate_seconds=candidate_seconds,
    )
    if candidate is None:
        report.reason = f"the candidate run failed: {failure or 'no result'}"
        report.divergence = Divergence(turn=0, recorded="the candidate did not finish")
        return report
    report.candidate_output = as_text(candidate.output)
    report.candidate_usage = candidate.usage
    report.same_answer = same_answer(recorded.output, candidate.output)
    if scorer is not None:
        try:
            report.score = min(1.0, max(0.0, float(scorer(recorded.output, candidate.output))))
        except Exception as exc:  # noqa: BLE001 - user code: the run's verdict, not the eval's
            report.reason = f"score() raised {type(exc).__name__}: {exc}"
            report.score = 0.0
    else:
        report.score = 1.0 if report.same_answer else 0.0
    report.divergence = first_divergence(recorded.steps, steps_of(candidate.transcript))
    calls = candidate.evaluation or []
    report.matched = sum(1 for c in calls if c.outcome == "matched")
    report.live = sum(1 for c in calls if c.outcome == "live")
    report.blocked = [c for c in calls if c.outcome == "blocked"]
    passed = report.score >= pass_score
    report.verdict = "passed" if passed else "failed"
    if not passed and not report.reason:
        report.reason = "a different answer" if not report.same_answer else "score below the bar"
    return report


def skipped(recorded: RecordedRun, reason: str) -> RunReport:
    return RunReport(
        recorded_run=recorded.run_id, agent=recorded.agent, verdict="skipped", reason=reason
    )


def totals(eval_id: str, runs: list[RunReport]) -> EvalReport:
    """The report in total: skipped runs count in no rate."""
    judged = [r for r in runs if r.verdict != "skipped"]
    total = EvalTotals(
        runs=len(runs),
        passed=sum(1 for r in judged if r.verdict == "passed"),
        failed=sum(1 for r in judged if r.verdict == "failed"),
        skipped=len(runs) - len(judged),
        recorded_tokens=sum(r.recorded_usage.total_tokens for r in judged),
        candidate_tokens=sum(r.candidate_usage.total_tokens for r in judged),
        recorded_cost_usd=sum(r.recorded_usage.cost_usd for r in judged),
        candidate_cost_usd=sum(r.candidate_usage.cost_usd for r in judged),
        blocked=sum(len(r.blocked) for r in judged),
    )
    if judged:
        total.pass_rate = total.passed / len(judged)
        total.mean_score = sum(r.score for r in judged) / len(judged)
    return EvalReport(eval_id=eval_id, runs=runs, totals=total)
