"""The evaluation's activities: reading a recorded run, and scoring its candidate.

Both run on the evaluation's worker, which has the candidate module: reading a run also says
whether the candidate has the run's agent (a run it lacks is reported, not failed), and scoring
uses the module's ``score`` when it defines one.

Both heartbeat while they run (the workflow gives them a short heartbeat timeout): a worker
killed in the middle of reading or scoring hands the attempt to the next worker within seconds,
not at the end of the activity's whole time limit. The module's ``score`` runs in a thread, so a
slow scorer (a model as judge) neither stops those heartbeats nor the worker's other runs.
"""

from __future__ import annotations

import asyncio
from typing import Any

from temporalio import activity
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowFailureError
from temporalio.service import RPCError

from relaykit.activities.heartbeats import attempt_beats
from relaykit.errors import error_detail
from relaykit.eval_context import EvalCall
from relaykit.evals.compare import Scorer, score_run
from relaykit.evals.models import (
    PREPARE_ACTIVITY,
    SCORE_ACTIVITY,
    EvalSource,
    RunReport,
    ScoreInput,
)
from relaykit.evals.recording import (
    MAX_CHILD_DEPTH,
    RecordedRun,
    read_history_file,
    read_recorded,
)
from relaykit.fork import ForkError
from relaykit.graph import AgentGraph
from relaykit.runs import RunInput, RunResult


class EvalActivities:
    """The activities of one evaluation worker."""

    def __init__(self, client: Client, graph: AgentGraph | None, scorer: Scorer | None) -> None:
        self.client = client
        self.graph = graph
        self.scorer = scorer

    @activity.defn(name=PREPARE_ACTIVITY)
    async def prepare(self, source: EvalSource) -> RecordedRun:
        async with attempt_beats().automatic():
            return await self._prepare(source)

    @activity.defn(name=SCORE_ACTIVITY)
    async def score(self, input: ScoreInput) -> RunReport:
        async with attempt_beats().automatic():
            return await self._score(input)

    async def _prepare(self, source: EvalSource) -> RecordedRun:
        try:
            if source.history_file is not None:
                recorded = await read_history_file(self.client.data_converter, source.history_file)
            else:
                recorded = await read_recorded(self.client, source.run_id or "")
        except RPCError:
            raise  # the server: retried
        except Exception as exc:  # noqa: BLE001 - a history this code cannot read: reported
            return RecordedRun(
                run_id=source.label,
                agent="",
                input=RunInput(agent=""),
                problem=str(exc)
                if isinstance(exc, ForkError)  # says which part, in words
                else f"its history cannot be read: {error_detail(exc)}",
            )
        known = self.graph.agents if self.graph is not None else {}
        if recorded.problem is None and recorded.agent not in known:
            recorded.problem = f"the candidate has no agent named {recorded.agent!r}"
        return recorded

    async def _score(self, input: ScoreInput) -> RunReport:
        seconds = None
        candidate = input.candidate
        if input.candidate_run is not None and candidate is not None:
            handle = self.client.get_workflow_handle(input.candidate_run)
            described = await handle.describe()
            if described.close_time is not None:
                seconds = (described.close_time - described.start_time).total_seconds()
            children = await self._children_calls(input.candidate_run)
            if children:
                calls = [*(candidate.evaluation or []), *children]
                candidate = candidate.model_copy(update={"evaluation": calls})
        return await asyncio.to_thread(
            score_run,
            input.recorded,
            candidate,
            candidate_run=input.candidate_run,
            failure=input.failure,
            scorer=self.scorer,
            pass_score=input.pass_score,
            candidate_seconds=seconds,
        )

    async def _children_calls(self, run_id: str, depth: int = 0) -> list[EvalCall]:
        """The calls of a candidate's children (candidates themselves: agent-tool children and
        subagents), named ``<child>/<tool>``, down to the depth recorded children are read to."""
        calls: list[EvalCall] = []
        if depth >= MAX_CHILD_DEPTH:
            return calls
        convert = self.client.data_converter
        started: list[str] = []
        results: dict[str, RunResult] = {}
        async for event in self.client.get_workflow_handle(run_id).fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_STARTED:
                attrs = event.child_workflow_execution_started_event_attributes
                started.append(attrs.workflow_execution.workflow_id)
            elif event.event_type == EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED:
                done = event.child_workflow_execution_completed_event_attributes
                [result] = await convert.decode(done.result.payloads, [RunResult])
                results[done.workflow_execution.workflow_id] = result
        for child_id in started:
            result = results.get(child_id) or await self._subagent_result(child_id)
            if result is None:
                continue
            name = child_id.rpartition("/")[2]
            for call in result.evaluation or []:
                calls.append(call.model_copy(update={"tool": f"{name}/{call.tool}"}))
            if result.evaluation is not None:
                for call in await self._children_calls(child_id, depth + 1):
                    calls.append(call.model_copy(update={"tool": f"{name}/{call.tool}"}))
        return calls

    async def _subagent_result(self, child_id: str) -> RunResult | None:
        """A subagent's result: its parent does not wait for it to close (its report came by
        signal), so its end is read from the child itself; ``None`` when it did not complete."""
        handle = self.client.get_workflow_handle(child_id, result_type=RunResult)
        try:
            result: RunResult = await handle.result()
            return result
        except (WorkflowFailureError, RPCError):  # failed or cancelled: no calls to list
            return None

    def all(self) -> list[Any]:
        return [self.prepare, self.score]
