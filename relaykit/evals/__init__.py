"""Replay evaluations: a changed agent answers recorded runs again, and no side effect repeats.

``relaykit eval CANDIDATE_MODULE`` (docs/evals.md) picks recorded runs (a visibility query, run
ids, or history files), and for each one the candidate module's agent of the same name answers
the recorded input on Temporal, its tool calls answered from the recording
(:mod:`relaykit.eval_context`, :mod:`relaykit.workflows.eval_calls`); then a report per run and
in total (:mod:`relaykit.evals.compare`, :mod:`relaykit.evals.formats`).

The modules: :mod:`~relaykit.evals.recording` reads a recorded run, :mod:`~relaykit.evals.workflow`
is the ``RelayEval`` workflow, :mod:`~relaykit.evals.activities` its activities,
:mod:`~relaykit.evals.runner` starts, serves and waits for an evaluation.
"""

from __future__ import annotations

from relaykit.evals.formats import junit_xml, markdown
from relaykit.evals.models import Divergence, EvalReport, EvalSource, EvalTotals, RunReport
from relaykit.evals.runner import (
    eval_task_queue,
    eval_worker,
    evaluate,
    select_runs,
    start_eval,
)

__all__ = [
    "Divergence",
    "EvalReport",
    "EvalSource",
    "EvalTotals",
    "RunReport",
    "eval_task_queue",
    "eval_worker",
    "evaluate",
    "junit_xml",
    "markdown",
    "select_runs",
    "start_eval",
]
