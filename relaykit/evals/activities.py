"""The evaluation's activities: reading a recorded run, and scoring its candidate.

Both run on the evaluation's worker, which has the candidate module: reading a run also says
whether the candidate has the run's agent (a run it lacks is reported, not failed), and scoring
uses the module's ``score`` when it defines one.
"""

from __future__ import annotations

from typing import Any

from temporalio import activity
from temporalio.client import Client
from temporalio.service import RPCError

from relaykit.evals.compare import Scorer, score_run
from relaykit.evals.models import (
    PREPARE_ACTIVITY,
    SCORE_ACTIVITY,
    EvalSource,
    RunReport,
    ScoreInput,
)
from relaykit.evals.recording import RecordedRun, read_history_file, read_recorded
from relaykit.graph import AgentGraph
from relaykit.runs import RunInput


class EvalActivities:
    """The activities of one evaluation worker."""

    def __init__(self, client: Client, graph: AgentGraph | None, scorer: Scorer | None) -> None:
        self.client = client
        self.graph = graph
        self.scorer = scorer

    @activity.defn(name=PREPARE_ACTIVITY)
    async def prepare(self, source: EvalSource) -> RecordedRun:
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
                problem=f"its history cannot be read: {type(exc).__name__}: {exc}",
            )
        known = self.graph.agents if self.graph is not None else {}
        if recorded.problem is None and recorded.agent not in known:
            recorded.problem = f"the candidate has no agent named {recorded.agent!r}"
        return recorded

    @activity.defn(name=SCORE_ACTIVITY)
    async def score(self, input: ScoreInput) -> RunReport:
        seconds = None
        if input.candidate_run is not None and input.candidate is not None:
            described = await self.client.get_workflow_handle(input.candidate_run).describe()
            if described.close_time is not None:
                seconds = (described.close_time - described.start_time).total_seconds()
        return score_run(
            input.recorded,
            input.candidate,
            candidate_run=input.candidate_run,
            failure=input.failure,
            scorer=self.scorer,
            pass_score=input.pass_score,
            candidate_seconds=seconds,
        )

    def all(self) -> list[Any]:
        return [self.prepare, self.score]
