"""Answering many approvals at signal speed, each still checked and recorded.

An answer by the ``approve`` update waits for a worker to run its validator and handler: the
caller learns at once whether the call was waiting, but a thousand answers cost a thousand
workflow tasks in turn (tens of seconds on a loaded worker). A signal costs the server one
write, like bare Temporal's, and no worker time until the run's next task. This module keeps
what the update gives on top of the signal:

1. **checked first**: each answer is checked against the calls the run lists as waiting, from
   the server: the ``RelayWaitingCalls`` search attribute (in the visibility listing for a bulk
   answer, in ``describe`` for one run), or the run's ``pending_approvals`` query where the run
   does not keep it. A query needs the run's worker, which is busy when many runs go on at
   once; the attribute needs none. So the caller learns at once whether the call was waiting,
   and an answer to a call that is not is reported as such (:data:`NOT_WAITING`), never sent;
2. **signalled**: ``approve_signal`` carries the same :class:`~relaykit.runs.ApprovalDecision`
   (with ``by``, the author), and the run records it in its ``approval_answered`` event;
3. **the race, defined**: a call can stop waiting between the check and the signal (a person
   answered it by the update a moment before, or its ``approval_timeout`` ran out). Then the
   first answer stands, and the run records the late one as an ``approval_refused`` event
   saying why: it is in the run's events (``relaykit events``), not silently dropped.

Which runs: one visibility list (``RelayStatus = 'waiting_approval'``, root runs, and the
caller's own filter) names the runs and their waiting calls, page by page, so the cost is one
list request per page and one signal per waiting call, whatever the number of runs. A run's
signals go out as soon as its page is read, so the listing and the signals overlap.

Where the time goes (``bench/README.md``, "Many approvals at signal speed"): each signal costs the
server what the floor's bare signal costs it (the same time for 1,000 signals that change nothing
in either system); the listing of 1,000 waiting runs is one to three seconds on a loaded dev
server, which is why the first signals no longer wait for its last page. More signals in flight
shorten both systems' time alike (about half as long at 1,000 as at 100): that is the
``concurrency`` argument's choice, and its default stays at 100.
"""

from __future__ import annotations

import asyncio
from collections.abc import Collection
from typing import Literal

from pydantic import BaseModel
from temporalio.client import Client, WorkflowQueryFailedError
from temporalio.service import RPCError, RPCStatusCode

from relaykit.authors import author
from relaykit.client import check_text, get_run, signal_answer, waiting_call
from relaykit.runs import AGENT_RUN_WORKFLOW, ApprovalDecision
from relaykit.search_attributes import RELAY_WAITING_CALLS, eval_registered, listed_calls

ANSWERED = "answered"
NOT_WAITING = "not_waiting"
UNREADABLE = "unreadable"
BulkStatus = Literal["answered", "not_waiting", "unreadable"]

DEFAULT_CONCURRENCY = 100
"""Runs checked and signalled at once."""

LIST_PAGE_SIZE = 200
"""Runs per page of the listing: the signals to one page's runs go out while the next is
read."""


class BulkAnswer(BaseModel):
    """What happened to one answer of a bulk approval."""

    run_id: str
    call_id: str
    status: BulkStatus
    """``answered``: signalled to a call that was waiting; ``not_waiting``: not sent (the run
    listed no such call, or had closed by the time of the signal); ``unreadable``: the run did
    not answer its query (no worker, or a worker that could not read it), or the server refused
    the signal: ``detail`` says which."""
    tool: str = ""
    detail: str = ""


def waiting_runs_query(extra: str | None = None, *, exclude_evals: bool = False) -> str:
    """The visibility query naming root runs that wait for a person, narrowed by ``extra``
    (any Temporal visibility filter, e.g. ``RelayAgent = 'triage'``); ``exclude_evals`` leaves
    out candidate runs of evaluations (``RelayEvalOf``, where the namespace has it). The one
    query of the inbox, the console's approvals and ``relaykit approve --all``."""
    query = (
        f"WorkflowType = '{AGENT_RUN_WORKFLOW}' AND RelayStatus = 'waiting_approval' "
        "AND ExecutionStatus = 'Running' AND RelayParentRun IS NULL"
    )
    if exclude_evals:
        query += " AND RelayEvalOf IS NULL"
    return f"{query} AND ({extra})" if extra and extra.strip() else query


async def answer_waiting(
    client: Client,
    query: str | None = None,
    *,
    approved: bool = True,
    reason: str | None = None,
    by: str | None = None,
    run_ids: list[str] | None = None,
    call_ids: set[str] | None = None,
    picks: Collection[tuple[str, str]] | None = None,
    concurrency: int = DEFAULT_CONCURRENCY,
) -> list[BulkAnswer]:
    """Answer every call waiting in the runs ``query`` finds (or in ``run_ids``), or only the
    calls ``call_ids`` names, each checked and then signalled (see the module docstring).

    ``picks`` names ``(run_id, call_id)`` pairs, the calls a person ticked (the inbox's
    "approve selected"): only those are answered, each in its own run (call ids repeat across
    runs), and their runs are read one ``describe`` each unless ``run_ids`` says otherwise.

    ``by`` (default: this machine's user) is recorded with each answer, as
    :meth:`~relaykit.client.RunHandle.approve` records it. Returns one :class:`BulkAnswer` per
    answer, in no particular order; a call named in ``call_ids`` or ``picks`` that no run
    listed is reported as ``not_waiting``."""
    name = author(by)  # the author, the same for every answer (relaykit.authors)
    check_text(reason, "the reason")  # before any answer is sent
    wanted = set(picks) if picks is not None else None
    if wanted is not None and run_ids is None:
        run_ids = sorted({run_id for run_id, _ in wanted})
    limit = asyncio.Semaphore(max(1, concurrency))

    async def one(run_id: str, calls: list[str] | None) -> list[BulkAnswer]:
        async with limit:
            run = get_run(client, run_id)
            try:
                if calls is not None:  # listed by visibility: no worker asked
                    pending = [waiting_call(run_id, call_id) for call_id in calls]
                else:
                    pending = await run.waiting_calls()
            except (RPCError, WorkflowQueryFailedError) as exc:
                if isinstance(exc, RPCError) and exc.status == RPCStatusCode.NOT_FOUND:
                    why = f"no run with id {run_id!r}"
                    return [BulkAnswer(run_id=run_id, call_id="", status=NOT_WAITING, detail=why)]
                return [BulkAnswer(run_id=run_id, call_id="", status=UNREADABLE, detail=str(exc))]
            answers: list[BulkAnswer] = []
            for item in pending:
                if call_ids is not None and item.call_id not in call_ids:
                    continue
                if wanted is not None and (run_id, item.call_id) not in wanted:
                    continue
                decision = ApprovalDecision(
                    call_id=item.call_id, approved=approved, reason=reason, by=name
                )
                try:
                    await signal_answer(run, [item], decision)
                except RPCError as exc:  # closed since it was listed, or the server refused
                    closed = exc.status == RPCStatusCode.NOT_FOUND
                    answers.append(
                        BulkAnswer(
                            run_id=run_id,
                            call_id=item.call_id,
                            status=NOT_WAITING if closed else UNREADABLE,
                            detail=f"the signal failed: {exc.message}",
                        )
                    )
                    continue
                answers.append(
                    BulkAnswer(run_id=run_id, call_id=item.call_id, status=ANSWERED, tool=item.tool)
                )
            return answers

    # Each run is answered as soon as the listing names it: the first signals go out while
    # later pages are still being read.
    started: dict[str, asyncio.Task[list[BulkAnswer]]] = {}
    stopped: list[BulkAnswer] = []
    if run_ids is None:
        where = waiting_runs_query(query, exclude_evals=await eval_registered(client))
        try:
            async for execution in client.list_workflows(where, page_size=LIST_PAGE_SIZE):
                if execution.id in started:  # listed twice across pages as the set changed
                    continue
                calls = listed_calls(execution.typed_search_attributes.get(RELAY_WAITING_CALLS))
                started[execution.id] = asyncio.create_task(one(execution.id, calls))
        except RPCError as exc:
            if not started:
                raise
            # Answers already sent stand (a signal is not taken back): say the rest were not.
            why = f"the listing of waiting runs stopped: {exc.message}"
            stopped.append(BulkAnswer(run_id="", call_id="", status=UNREADABLE, detail=why))
    else:
        for run_id in dict.fromkeys(run_ids):
            started[run_id] = asyncio.create_task(one(run_id, None))
    try:
        runs = await asyncio.gather(*started.values())
    finally:
        for task in started.values():
            task.cancel()  # only those still running, when the caller was cancelled
    results = [answer for run in runs for answer in run] + stopped
    if call_ids is not None:
        seen = {answer.call_id for answer in results}
        results.extend(
            BulkAnswer(
                run_id="", call_id=call_id, status=NOT_WAITING, detail="no listed run waits for it"
            )
            for call_id in sorted(call_ids - seen)
        )
    if wanted is not None:  # one answer per pick, a run's failed read repeated for each
        whole_run = {answer.run_id: answer for answer in results if not answer.call_id}
        results = [answer for answer in results if answer.call_id]
        done = {(answer.run_id, answer.call_id) for answer in results}
        for run_id, call_id in sorted(wanted - done):
            failed = whole_run.get(run_id)
            results.append(
                failed.model_copy(update={"call_id": call_id})
                if failed is not None
                else BulkAnswer(
                    run_id=run_id,
                    call_id=call_id,
                    status=NOT_WAITING,
                    detail=f"run {run_id!r} does not wait for it",
                )
            )
    return results


__all__ = [
    "ANSWERED",
    "NOT_WAITING",
    "UNREADABLE",
    "BulkAnswer",
    "answer_waiting",
    "waiting_runs_query",
]
