"""The ``RelayEval`` workflow: one child candidate run per recorded run, bounded, resumable.

For each recorded run, in the order given: the ``relaykit.eval_prepare`` activity reads it (and
says whether the candidate module has its agent), a child ``AgentRun`` of the candidate's agent
answers its input with the recorded tool results (:mod:`relaykit.eval_context`), and the
``relaykit.eval_score`` activity compares the two. At most ``concurrency`` recorded runs are in
progress at once. Candidates' ids are ``<eval id>/<recorded run id>`` and, when the namespace has
it, they carry ``RelayEvalOf`` naming the recorded run, which keeps them out of ``relaykit runs``
and the inbox.

Everything the evaluation did is in this workflow's history, so a worker that dies (or the
command that waits for it) costs nothing done: another worker replays it and goes on, with the
same candidates and the same report. The workflow runs on the evaluation's own task queue, with
its candidates, served by a worker that has the candidate module's agents
(:func:`relaykit.evals.eval_worker`).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy, SearchAttributePair, TypedSearchAttributes
from temporalio.exceptions import ActivityError, ChildWorkflowError

with workflow.unsafe.imports_passed_through():
    from relaykit.evals.compare import skipped, totals
    from relaykit.evals.models import (
        EVAL_WORKFLOW,
        PREPARE_ACTIVITY,
        SCORE_ACTIVITY,
        EvalInput,
        EvalReport,
        EvalSource,
        RunReport,
        ScoreInput,
    )
    from relaykit.evals.recording import RecordedRun
    from relaykit.run_ids import child_run_id, run_id_fits, too_long
    from relaykit.runs import AGENT_RUN_WORKFLOW, RunResult
    from relaykit.search_attributes import RELAY_EVAL_OF, keyword

_ACTIVITY_TIMEOUT = timedelta(minutes=5)
#: Both activities heartbeat while they run: a dead worker's attempt is retried after this long.
_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
_RETRY = RetryPolicy(maximum_attempts=5)


@workflow.defn(name=EVAL_WORKFLOW)
class EvalWorkflow:
    """See the module docstring."""

    def __init__(self) -> None:
        self._done = 0
        self._total = 0

    @workflow.query
    def progress(self) -> tuple[int, int]:
        """Recorded runs evaluated so far, and in all."""
        return self._done, self._total

    @workflow.run
    async def run(self, input: EvalInput) -> EvalReport:
        eval_id = workflow.info().workflow_id
        self._total = len(input.sources)
        reports: list[RunReport | None] = [None] * len(input.sources)
        waiting = list(enumerate(input.sources))

        async def lane() -> None:
            # One of ``concurrency`` lanes, each taking the next recorded run when its last
            # one is done: never more in progress (a condition woken for all would let every
            # waiting run through at once).
            while waiting:
                index, source = waiting.pop(0)
                reports[index] = await self._evaluate(eval_id, input, source)
                self._done += 1

        await asyncio.gather(*(lane() for _ in range(min(input.concurrency, len(waiting)))))
        return totals(eval_id, [r for r in reports if r is not None])

    async def _evaluate(self, eval_id: str, input: EvalInput, source: EvalSource) -> RunReport:
        try:
            recorded: RecordedRun = await workflow.execute_activity(
                PREPARE_ACTIVITY,
                source,
                result_type=RecordedRun,
                start_to_close_timeout=_ACTIVITY_TIMEOUT,
                heartbeat_timeout=_HEARTBEAT_TIMEOUT,
                retry_policy=_RETRY,
                summary=source.label,
            )
        except ActivityError as exc:  # the server kept refusing: this run is reported, not lost
            return RunReport(
                recorded_run=source.label,
                verdict="skipped",
                reason=f"not evaluated: it could not be read: {exc.cause or exc}",
            )
        if recorded.problem is not None:
            return skipped(recorded, f"not evaluated: {recorded.problem}")
        child_id = child_run_id(eval_id, recorded.run_id)
        if not run_id_fits(child_id):  # the server would refuse the start, at every retry
            return skipped(
                recorded, f"not evaluated: the candidate could not start: {too_long(child_id)}"
            )
        attributes = None
        if input.eval_attribute:
            attributes = TypedSearchAttributes(
                [SearchAttributePair(RELAY_EVAL_OF, keyword(recorded.run_id))]
            )
        candidate: RunResult | None = None
        failure = None
        try:
            candidate = await workflow.execute_child_workflow(
                AGENT_RUN_WORKFLOW,
                recorded.candidate_input(input.live_reads, input.eval_attribute),
                id=child_id,
                result_type=RunResult,
                search_attributes=attributes,
                static_summary=f"{recorded.agent}: evaluation of {recorded.run_id}",
            )
        except ChildWorkflowError as exc:
            failure = str(exc.cause) if exc.cause is not None else str(exc)
        try:
            score: RunReport = await workflow.execute_activity(
                SCORE_ACTIVITY,
                ScoreInput(
                    recorded=recorded,
                    candidate_run=child_id,
                    failure=failure,
                    pass_score=input.pass_score,
                    candidate=candidate,
                ),
                result_type=RunReport,
                start_to_close_timeout=_ACTIVITY_TIMEOUT,
                heartbeat_timeout=_HEARTBEAT_TIMEOUT,
                retry_policy=_RETRY,
                summary=recorded.run_id,
            )
        except ActivityError as exc:
            return RunReport(
                recorded_run=recorded.run_id,
                agent=recorded.agent,
                candidate_run=child_id,
                reason=f"scoring failed: {exc.cause or exc}",
            )
        return score
