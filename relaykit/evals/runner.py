"""Starting an evaluation, serving it, and waiting for its report.

An evaluation has an id (``--eval-id``, default one derived from the candidate and the time).
The ``RelayEval`` workflow takes that id, and the evaluation's task queue is derived from it
(:func:`eval_task_queue`), so that only workers of this candidate serve its candidates: another
module's agents of the same name never answer them. Starting again with the same id resumes
the evaluation (running: wait for it; finished: its report) instead of running it twice.
"""

from __future__ import annotations

import importlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from temporalio.client import Client
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError

from relaykit.agent import Agent
from relaykit.errors import ConfigurationError
from relaykit.evals.activities import EvalActivities
from relaykit.evals.compare import Scorer
from relaykit.evals.models import EVAL_WORKFLOW, EvalInput, EvalReport, EvalSource
from relaykit.evals.workflow import EvalWorkflow
from relaykit.loading import load_agents
from relaykit.models.spec import ModelSpec, parse_model
from relaykit.runs import AGENT_RUN_WORKFLOW
from relaykit.search_attributes import eval_registered
from relaykit.worker import Worker

EVAL_QUEUE_PREFIX = "relaykit-eval."


def eval_task_queue(eval_id: str) -> str:
    """The task queue of an evaluation and its candidates."""
    return EVAL_QUEUE_PREFIX + re.sub(r"[^A-Za-z0-9_.-]", "-", eval_id)


def default_eval_id(target: str) -> str:
    return f"eval-{target.replace(':', '.')}-{datetime.now(UTC):%Y%m%dT%H%M%S}"


def load_candidate(target: str) -> tuple[list[Agent], Scorer | None]:
    """The candidate module's agents, and its ``score(recorded, candidate)`` if it has one."""
    agents = load_agents(target)
    module = importlib.import_module(target.partition(":")[0])
    scorer = getattr(module, "score", None)
    if scorer is not None and not callable(scorer):
        raise ConfigurationError(f"{target!r}: `score` is not a function")
    return agents, scorer


def eval_worker(
    client: Client,
    target: str | Sequence[Agent],
    *,
    eval_id: str,
    model: str | ModelSpec | None = None,
    scorer: Scorer | None = None,
    **options: Any,
) -> Worker:
    """A worker for evaluation ``eval_id``: the candidate's agents (every one with ``model``
    when given), the ``RelayEval`` workflow and its activities, on the evaluation's queue."""
    if isinstance(target, str):
        agents, scorer = load_candidate(target)
    else:
        agents = list(target)
    activities = EvalActivities(client, None, scorer)
    worker = Worker(
        client,
        agents,
        task_queue=eval_task_queue(eval_id),
        workflows=[EvalWorkflow],
        activities=activities.all(),
        **options,
    )
    activities.client, activities.graph = worker.client, worker.graph
    if model is not None:  # only the model changes: every agent the candidate reaches uses it
        spec = parse_model(model)
        worker.graph.default_model = spec
        for agent in worker.graph.agents.values():
            agent.model = spec
    return worker


async def select_runs(
    client: Client,
    *,
    query: str | None = None,
    runs: Sequence[str] = (),
    histories: str | None = None,
    limit: int | None = None,
) -> list[EvalSource]:
    """The recorded runs to evaluate: closed runs a visibility query finds (never candidates of
    an evaluation, never child runs), run ids, or the ``*.json`` files of a folder."""
    sources = [EvalSource(run_id=run) for run in runs]
    if histories is not None:
        folder = Path(histories)
        if not folder.is_dir():
            raise ConfigurationError(f"--histories {histories!r} is not a folder")
        files = sorted(folder.glob("*.json"))
        if not files:
            raise ConfigurationError(f"no *.json history files in {histories!r}")
        sources += [EvalSource(history_file=str(path.resolve())) for path in files]
    if query is not None:
        parts = [
            f"WorkflowType = '{AGENT_RUN_WORKFLOW}'",
            "ExecutionStatus != 'Running'",
            "RelayParentRun IS NULL",
        ]
        if await eval_registered(client):
            parts.append("RelayEvalOf IS NULL")
        full = " AND ".join(parts) + (f" AND ({query})" if query.strip() else "")
        async for execution in client.list_workflows(full, limit=limit):
            sources.append(EvalSource(run_id=execution.id))
    if limit is not None:
        sources = sources[:limit]
    if not sources:
        raise ConfigurationError(
            "no recorded runs to evaluate", hint="give --query, --runs or --histories"
        )
    return sources


async def start_eval(
    client: Client,
    sources: Sequence[EvalSource],
    *,
    eval_id: str,
    concurrency: int = 4,
    live_reads: bool = False,
    pass_score: float = 1.0,
) -> Any:
    """Start evaluation ``eval_id`` (or find it, running or finished) and return its handle."""
    input = EvalInput(
        sources=list(sources),
        concurrency=concurrency,
        live_reads=live_reads,
        eval_attribute=await eval_registered(client),
        pass_score=pass_score,
    )
    try:
        return await client.start_workflow(
            EVAL_WORKFLOW,
            input,
            id=eval_id,
            task_queue=eval_task_queue(eval_id),
            result_type=EvalReport,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            id_reuse_policy=WorkflowIDReusePolicy.REJECT_DUPLICATE,
            static_summary=f"evaluation of {len(input.sources)} recorded runs",
        )
    except WorkflowAlreadyStartedError:  # finished before: its report, not a second run
        return client.get_workflow_handle(eval_id, result_type=EvalReport)


async def evaluate(
    client: Client,
    target: str | Sequence[Agent],
    sources: Sequence[EvalSource],
    *,
    eval_id: str,
    model: str | ModelSpec | None = None,
    scorer: Scorer | None = None,
    concurrency: int = 4,
    live_reads: bool = False,
    pass_score: float = 1.0,
    worker: bool = True,
    **worker_options: Any,
) -> EvalReport:
    """Run evaluation ``eval_id`` of ``target`` and return its report.

    ``target`` is ``MODULE`` or ``MODULE:ATTR`` (whose ``score`` is the scorer), or the
    candidate agents (and ``scorer``). With ``worker`` (the default) a worker in this process
    serves the evaluation while it runs; else workers started elsewhere
    (:func:`eval_worker`) must."""
    handle = await start_eval(
        client,
        sources,
        eval_id=eval_id,
        concurrency=concurrency,
        live_reads=live_reads,
        pass_score=pass_score,
    )
    if not worker:
        report: EvalReport = await handle.result()
        return report
    serving = eval_worker(
        client, target, eval_id=eval_id, model=model, scorer=scorer, **worker_options
    )
    async with serving:
        report = await handle.result()
    return report
