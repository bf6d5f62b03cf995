"""``python -m bench.chaos``: a seeded fuzzer of operator actions and faults.

Each seed is one run (see :mod:`bench.chaos_model` for what a seed draws): a real ``relaykit
worker`` process of its own (``bench.chaos_agents``, on a task queue of its own), the scripted
model server over HTTP playing the model, and a driver that steers, sends, pauses and resumes,
approves and denies, forks at a random turn, cancels, SIGKILLs the worker and starts it again
(or, on a run with MCP, a fifth of the time SIGKILLs its MCP server alone), and deploys a
changed definition (the worker restarted with a new ``CHAOS_VERSION``: changed instructions and
one more tool, at once or rolling; half of the time another model's name, which a budgeted run
did not price at its start; half of the time other tools needing a person's approval), at
moments tied to the model's requests.
A run with the ``budget`` feature has a dollar limit and an ``on_limit``; the operator raises
or sets the limit, asks for the best answer so far or cancels it (an action due while the run
waits at its limit fires at once: a run that waits makes no requests). Approvals are answered
by the update, by signal, in bulk, two at once racing each other, and again once answered.
Then it stops acting, approves whatever still waits, resumes a paused run, asks a run waiting
at its limit for its best answer, and checks:

- every run (the original and its forks) ends, completed, failed with a type, or cancelled,
  within ``--settle`` seconds after the actions stop;
- no workflow task failed anywhere (children and continue-as-new runs included), except causes
  that are Temporal's own concurrency (:data:`bench.chaos_checks.BENIGN_TASK_FAILURES`);
- no write (the ``charge`` and ``work`` tools, the ``on_handoff`` callback, the MCP server's
  ``slow_write``) started twice;
- a fork's first model request is the original's request at that turn;
- an accepted steer or send reaches the model, and never twice in one request;
- a budgeted run's spend (its children's included) never passes the highest limit it had;
- every operator event (approval answered or refused, steer, message, pause, resume, cancel,
  budget change) names its author;
- no child run waits for its parent's budget once the run has ended;
- a call is answered once: one ``approval_answered`` per call, a late answer is refused (a
  typed error, or an ``approval_refused`` event naming its author), and an approved read that
  no fault interrupted starts once.

A failing seed prints what broke and ``python -m bench.chaos --runs 1 --seed SEED``, which runs
that seed alone. Seeds run ``--concurrency`` at a time; every process a run starts is killed when
it ends, whatever happened.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import random
import shutil
import sys
import tempfile
import time
import traceback
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from bench import chaos_checks as checks
from bench.chaos_checks import requests_of_run
from bench.chaos_model import (
    CHILD_PREFIX,
    Action,
    Plan,
    draw,
    first_text,
    is_summary,
    model_for,
    turn_of,
)
from bench.chaos_workers import Rig
from relaykit.search_attributes import RELAY_STATUS
from relaykit.testing.scripted_server import ScriptedModelServer

AGENT = "chaos"
SETTLE_SECONDS = 60.0
"""How long a run may take to end once the actions stopped: long enough for a killed worker's
sticky timeout, heartbeat timeouts and a new worker to start on a loaded machine."""
OPERATOR = "chaos-operator"
"""The author the driver names in every action (``by=``): the check reads it back from events."""
OPERATOR_EVENTS = (
    "approval_answered",
    "approval_refused",
    "message_injected",
    "steered",
    "paused",
    "resumed",
    "cancelled",
    "budget_changed",
)
"""Events of operator actions: each names who took it."""
CHILD_BUDGET_KNOB = 0.8
"""A budget action whose knob is at least this acts on a running child, if there is one."""
CALL_SECONDS = 20.0
"""Bound on one client call (an update waits for the workflow task that answers it)."""
TRIGGER_SECONDS = 30.0
SEED_SECONDS = 600.0
"""A seed's own bound: a driver still busy after it (a client call that ignored its own bound)
is a failure of its own, reported with the seed, and its worker processes are stopped."""


def reproduce_command(seed: int) -> str:
    return f"python -m bench.chaos --runs 1 --seed {seed}"


@dataclass
class Outcome:
    seed: int
    plan: Plan
    actions: collections.Counter[str] = field(default_factory=collections.Counter)
    ended: dict[str, str] = field(default_factory=dict)
    """Workflow id -> completed, cancelled, failed:<type>, or not ended."""
    wedges: list[str] = field(default_factory=list)
    benign_task_failures: list[str] = field(default_factory=list)
    repeated_writes: list[str] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    """Outcomes of actions that are allowed (a refused fork, a steer on a run that had ended)."""
    writes: int = 0
    mcp_writes: int = 0
    mcp_servers_killed: int = 0
    forks_compared: int = 0
    summaries: int = 0
    child_calls: int = 0
    other_model_calls: int = 0
    """Model calls made by another model's name, which a deploy gave the agents."""
    marks_checked: int = 0
    operator_events: int = 0
    late_answers: int = 0
    budget_runs: int = 0
    budget_stops: int = 0
    """Runs that stopped at their dollar limit (waited in ``budget_reached``, finished there, or
    failed with ``BudgetExceeded``)."""
    seconds: float = 0.0
    workdir: str = ""

    @property
    def not_ended(self) -> int:
        return sum(1 for s in self.ended.values() if s == "not ended")

    @property
    def failed(self) -> bool:
        return bool(self.wedges or self.repeated_writes or self.violations or self.not_ended)

    def report(self) -> str:
        lines = [
            f"seed {self.seed} {'FAILED' if self.failed else 'ok'} ({self.seconds:.0f}s): "
            f"{self.plan.describe()}",
            *(f"  run {wid}: {status}" for wid, status in self.ended.items()),
            *(f"  wedge: {w}" for w in self.wedges),
            *(f"  benign task failure: {b}" for b in self.benign_task_failures),
            *(f"  repeated write: {r}" for r in self.repeated_writes),
            *(f"  violation: {v}" for v in self.violations),
            *(f"  note: {n}" for n in self.notes),
            f"  worker logs (and the histories of wedged runs): {self.workdir}",
            f"  reproduce: {reproduce_command(self.seed)}",
        ]
        return "\n".join(lines)


# --- one run -------------------------------------------------------------------------------------


@dataclass
class Tracked:
    handle: Any
    fork_mark: str | None = None
    fork_turn: int = 0
    decided: set[str] = field(default_factory=set)
    first_seen: dict[str, float] = field(default_factory=dict)
    status: str = ""
    transcript_text: str = ""
    limits: list[float] = field(default_factory=list)
    """Every dollar limit the run had (the start's and each answer of ``set_budget``)."""
    signalled_late: set[str] = field(default_factory=set)
    """Calls answered again by signal once answered, whose late answer the run took."""
    finished_at_limit: bool = False


class Driver:
    def __init__(
        self,
        client: Client,
        server: ScriptedModelServer,
        address: str,
        seed: int,
        work: Path,
        settle: float,
    ) -> None:
        self.client = client
        self.server = server
        self.plan = draw(seed)
        self.model = f"chaos-{seed}-{uuid.uuid4().hex[:8]}"
        self.rig = Rig(address, server.base_url, self.model, self.plan, work)
        self.out = Outcome(seed=seed, plan=self.plan, workdir=str(work))
        self.rng = random.Random(seed * 7919 + 1)
        self.answers = random.Random(seed * 7919 + 2)
        """How each approval is answered (a stream of its own: the rest stays as it was)."""
        self.settle = settle
        self.settling = False
        self.runs: list[Tracked] = []
        self.marks: list[tuple[str, Tracked]] = []

    async def call(self, what: str, coro: Any) -> Any:
        """One client call with its own bound; an error becomes a note (the invariants judge
        the run, not whether each action was accepted)."""
        try:
            return await asyncio.wait_for(coro, CALL_SECONDS)
        except Exception as exc:  # noqa: BLE001 - recorded, not raised
            text = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            self.out.notes.append(f"{what}: {type(exc).__name__}: {text[:200]}")
            return exc

    async def go(self) -> Outcome:
        from relaykit import Budget, start_run

        began = time.monotonic()
        self.server.respond(self.model, model_for(self.plan))
        approver: asyncio.Task[None] | None = None
        try:
            self.rig.start()
            handle = await start_run(
                self.client,
                AGENT,
                f"TASK {self.plan.tag}: help the customer with their account.",
                task_queue=self.rig.task_queue,
                id=f"chaos-{self.plan.seed}-{uuid.uuid4().hex[:8]}",
                max_turns=40,
                continue_as_new_after_turns=self.plan.continue_as_new_after_turns,
                budget=(
                    Budget(max_usd=self.plan.max_usd, on_limit=self.plan.on_limit)  # type: ignore[arg-type]
                    if self.plan.max_usd
                    else None
                ),
            )
            tracked = Tracked(handle)
            if self.plan.max_usd:
                tracked.limits.append(self.plan.max_usd)
            self.runs.append(tracked)
            approver = asyncio.create_task(self.approve_loop())
            for action in self.plan.actions:
                why = await self.trigger(action)
                if why:
                    self.out.notes.append(f"{action.kind}@{action.at} not done: {why}")
                    continue
                await self.act(action)
            await self.settle_all()
            await self.check()
        finally:  # whatever happened (a failure, a cancelled test): no process outlives the seed
            if approver is not None:
                approver.cancel()
                await asyncio.gather(approver, return_exceptions=True)
            await self.cleanup()
            self.out.seconds = time.monotonic() - began
        return self.out

    async def trigger(self, action: Action) -> str | None:
        """Wait for the action's request count; why not, if the original ended first or its
        model got no request for a while."""
        deadline = time.monotonic() + TRIGGER_SECONDS
        original = self.runs[0]
        polls = 0
        while self.server.request_count(self.model) < action.at:
            if await self.closed(original):
                return "the run ended first"
            if time.monotonic() > deadline:
                return f"no model request for {TRIGGER_SECONDS:g}s"
            polls += 1
            if self.plan.max_usd and polls % 10 == 0 and await self.at_limit(original):
                return None  # it waits for a person: no request comes until one acts
            await asyncio.sleep(0.1)
        aim = await self.aim(action)
        if aim is None:
            await asyncio.sleep(action.wait)
        elif not aim:
            self.out.notes.append(f"{action.kind}@{action.at}: its moment did not come")
        return "the run ended first" if await self.closed(original) else None

    async def aim(self, action: Action) -> bool | None:
        """Some actions wait for the moment that is most likely to break something: a steer or
        send while a summary call is in flight, a kill while a write runs, a fork once a
        summary happened. ``None`` when the action does not aim; whether the moment came."""
        summarizes = "summarize" in self.plan.features
        if action.kind in ("steer", "send") and summarizes and action.knob < 0.5:
            before = self.summaries()
            return await self.until(lambda: self.summaries() > before)
        if action.kind == "kill" and action.knob < 0.4:
            before = checks.write_starts(self.rig.write_log)
            return await self.until(lambda: checks.write_starts(self.rig.write_log) > before)
        if action.kind == "fork" and summarizes and action.knob < 0.7:
            return await self.until(lambda: self.summaries() > 0)
        return None

    def summaries(self) -> int:
        return sum(1 for r in self.server.requests(self.model) if is_summary(r))

    async def until(self, check: Any, timeout: float = 15.0) -> bool:
        deadline = time.monotonic() + timeout
        while not check():
            if time.monotonic() > deadline or await self.closed(self.runs[0]):
                return False
            await asyncio.sleep(0.05)
        return True

    async def closed(self, run: Tracked) -> bool:
        try:
            description = await run.handle.workflow.describe()
        except Exception:  # noqa: BLE001 - treated as still open
            return False
        return description.status is not None and description.status.name != "RUNNING"

    async def at_limit(self, run: Tracked) -> bool:
        try:
            snapshot = await asyncio.wait_for(run.handle.state(), CALL_SECONDS)
        except Exception:  # noqa: BLE001 - treated as not waiting
            return False
        return bool(snapshot.status == "budget_reached")

    async def open_runs(self) -> list[Tracked]:
        return [r for r in self.runs if not await self.closed(r)]

    async def act(self, action: Action) -> None:
        kind = action.kind
        if kind == "kill" and "mcp" in self.plan.features and 0.4 <= action.knob < 0.6:
            kind = "mcp kill"  # the MCP server crashes, not the worker
        self.out.actions[kind] += 1
        runs = await self.open_runs()
        target = runs[int(action.knob * len(runs))] if runs else self.runs[0]
        if kind in ("steer", "send"):
            mark = f"{kind.upper()}-{uuid.uuid4().hex[:8]}"
            words = f"{mark}: the customer adds one more detail."
            method = target.handle.steer if kind == "steer" else target.handle.send_message
            result = await self.call(kind, method(words, by=OPERATOR))
            if not isinstance(result, Exception):
                self.marks.append((mark, target))
        elif kind == "pause":
            await self.call("pause", target.handle.pause(by=OPERATOR))
            await asyncio.sleep(0.3 + 2 * action.knob)
            await self.call("resume", target.handle.resume(by=OPERATOR))
        elif kind == "mcp kill":
            self.out.mcp_servers_killed += self.rig.kill_mcp_servers()
        elif kind == "kill":
            await asyncio.to_thread(self.rig.kill)
            await asyncio.sleep(2 * action.knob)
            self.rig.start()
        elif kind == "deploy":
            self.rig.version += 1
            if (action.knob * 4) % 2 >= 1:  # half of each kind: the agents get another model
                self.rig.model_name = f"{self.model}-v{self.rig.version}"
                self.server.alias(self.rig.model_name, self.model)
                self.out.actions["deploy with another model"] += 1
            if (action.knob * 8) % 2 >= 1:  # and half of each: which tools need approval
                self.rig.approvals = "as written" if self.rig.approvals == "flipped" else "flipped"
                self.out.actions["deploy that changed approvals"] += 1
            if action.knob < 0.5:  # rolling: the new worker polls before the old one stops
                self.rig.start()
                await asyncio.to_thread(self.rig.stop_oldest)
            else:
                await asyncio.to_thread(self.rig.stop_oldest)
                self.rig.start()
        elif kind == "fork":
            await self.fork(action)
        elif kind == "cancel":
            await self.call("cancel", self.runs[0].handle.cancel(by=OPERATOR))
        elif kind in ("raise", "set", "finish"):
            child = await self.running_child() if action.knob >= CHILD_BUDGET_KNOB else None
            await self.change_budget(child or target, action)
        elif kind == "budget_cancel":  # `relaykit budget RUN --cancel`
            await self.call("budget cancel", target.handle.cancel(by=OPERATOR))

    async def running_child(self) -> Tracked | None:
        """A running child of one of the runs (an agent tool or a subagent, from visibility),
        preferring one that waits for its parent's budget: a person may change a child's budget
        too, though the docs tell them to raise the root."""
        from relaykit import get_run

        query = "ExecutionStatus = 'Running' AND RelayParentRun IS NOT NULL"
        roots = tuple(f"{run.handle.id}/" for run in self.runs)
        found: list[tuple[bool, str]] = []
        try:
            async for execution in self.client.list_workflows(query):
                if execution.id.startswith(roots):
                    status = execution.typed_search_attributes.get(RELAY_STATUS)
                    found.append((status != "waiting_parent_budget", execution.id))
        except Exception as exc:  # noqa: BLE001 - recorded
            self.out.notes.append(f"listing children: {type(exc).__name__}: {exc}"[:240])
        if not found:
            return None
        self.out.actions["budget of a child"] += 1
        return Tracked(get_run(self.client, min(found)[1]))

    async def change_budget(self, run: Tracked, action: Action) -> None:
        """Raise the limit by a few calls' worth, set it (below what was spent one time in
        four), or ask for the best answer so far."""
        handle = run.handle
        if action.kind == "raise":
            coro = handle.set_budget(raise_by=round(0.001 + 0.004 * action.knob, 4), by=OPERATOR)
        elif action.kind == "set":
            state = await self.call("state", handle.state())
            spent = state.budget.spent if not isinstance(state, Exception) and state.budget else 0
            coro = handle.set_budget(
                max(0.0, round(spent + 0.006 * action.knob - 0.0015, 4)), by=OPERATOR
            )
        else:
            coro = handle.set_budget(finish=True, by=OPERATOR)
        view = await self.call(f"budget {action.kind}", coro)
        if not isinstance(view, Exception):
            run.limits.append(view.limit)

    async def fork(self, action: Action) -> None:
        from relaykit import fork_run
        from relaykit.fork import ForkError

        seen = [turn_of(r) - 1 for r in requests_of_run(self.server.requests(self.model), None)]
        turn = 1 + int(action.knob * max(seen, default=1))
        mark = f"FORK-{uuid.uuid4().hex[:8]}"
        try:
            handle = await asyncio.wait_for(
                fork_run(
                    self.client, self.runs[0].handle.id, turn, input=f"{mark}: go on.", by=OPERATOR
                ),
                CALL_SECONDS,
            )
        except ForkError as exc:
            self.out.notes.append(f"fork at turn {turn} refused: {exc}")
            return
        except Exception as exc:  # noqa: BLE001 - an untyped error is a finding
            self.out.violations.append(f"fork at turn {turn}: {type(exc).__name__}: {exc}")
            return
        self.runs.append(Tracked(handle, fork_mark=mark, fork_turn=turn))

    async def approve_loop(self) -> None:
        modes = list(self.plan.approval_modes) or ["update"]
        weights = list(self.plan.approval_modes.values()) or [1.0]
        while True:
            for run in list(self.runs):
                if await self.closed(run):
                    continue
                if self.settling and self.plan.max_usd and not run.finished_at_limit:
                    if await self.at_limit(run):  # the best answer so far ends it
                        run.finished_at_limit = True
                        view = await self.call(
                            "settle finish", run.handle.set_budget(finish=True, by=OPERATOR)
                        )
                        if not isinstance(view, Exception):
                            run.limits.append(view.limit)
                pending = await self.call("pending", run.handle.pending_approvals())
                if isinstance(pending, Exception):
                    continue
                now = time.monotonic()
                for p in pending:
                    if p.call_id in run.decided:
                        continue
                    first = run.first_seen.setdefault(p.call_id, now)
                    lo, hi = self.plan.approve_seconds
                    if not self.settling and now - first < lo + (hi - lo) * self.rng.random():
                        continue
                    approved = self.settling or self.rng.random() < self.plan.approve_chance
                    run.decided.add(p.call_id)
                    self.out.actions["approve" if approved else "deny"] += 1
                    self.out.actions[f"asked for {p.tool}"] += 1
                    mode = self.answers.choices(modes, weights)[0]
                    self.out.actions[f"answer by {mode}"] += 1
                    await self.answer(run, p.call_id, approved, mode)
                    if self.answers.random() < self.plan.late_answer_chance:
                        self.out.late_answers += 1
                        await self.answer_late(run, p.call_id, approved)
            await asyncio.sleep(0.3)

    async def answer(self, run: Tracked, call_id: str, approved: bool, mode: str) -> None:
        """One answer, by the update, by signal, in bulk, or two at once (update and signal, or
        two signals; contradicting each other one time in three)."""
        from relaykit.bulk_approvals import answer_waiting

        handle = run.handle
        if mode == "update":
            await self.call("approve", handle.approve(call_id, approved, by=OPERATOR))
        elif mode == "signal":
            await self.call("approve", handle.approve(call_id, approved, wait=False, by=OPERATOR))
        elif mode == "bulk":
            result = await self.call(
                "bulk approve",
                answer_waiting(
                    self.client,
                    approved=approved,
                    by=OPERATOR,
                    run_ids=[handle.id],
                    call_ids={call_id},
                ),
            )
            if not isinstance(result, Exception):
                self.out.notes += [
                    f"bulk answer to {a.call_id}: {a.status} {a.detail[:120]}"
                    for a in result
                    if a.status != "answered"
                ]
        else:
            other = approved if self.answers.random() < 0.67 else not approved
            second = (
                handle.approve(call_id, other, by=OPERATOR)
                if self.answers.random() < 0.5
                else handle.approve(call_id, other, wait=False, by=OPERATOR)
            )
            await asyncio.gather(
                self.call(
                    "race approve", handle.approve(call_id, approved, wait=False, by=OPERATOR)
                ),
                self.call("race approve", second),
            )

    async def answer_late(self, run: Tracked, call_id: str, approved: bool) -> None:
        """An answer to a call answered already: a typed refusal, or (a signal that raced the
        listing of waiting calls) an ``approval_refused`` event; never a second answer."""
        from temporalio.client import WorkflowUpdateFailedError

        from relaykit.errors import ApprovalNotWaiting

        await asyncio.sleep(0.5 * self.answers.random())
        by_signal = self.answers.random() < 0.5
        try:
            await asyncio.wait_for(
                run.handle.approve(call_id, not approved, wait=not by_signal, by=OPERATOR),
                CALL_SECONDS,
            )
        except (ApprovalNotWaiting, WorkflowUpdateFailedError):
            return
        except Exception as exc:  # noqa: BLE001 - recorded
            self.out.notes.append(f"late answer to {call_id}: {type(exc).__name__}: {exc}"[:240])
            return
        if by_signal:
            run.signalled_late.add(call_id)
        else:
            self.out.violations.append(f"{run.handle.id}: a second answer to {call_id} was taken")

    async def settle_all(self) -> None:
        """Stop acting: a worker serves, paused runs resume, every approval is granted; then
        every run has ``settle`` seconds to end."""
        self.settling = True
        if not self.rig.live:
            self.rig.start()
        for run in await self.open_runs():
            await self.call("resume", run.handle.resume(by=OPERATOR))
        deadline = time.monotonic() + self.settle
        for run in self.runs:
            run.status = await self.result(run, max(1.0, deadline - time.monotonic()))
            self.out.ended[run.handle.id] = run.status

    async def result(self, run: Tracked, timeout: float) -> str:
        from relaykit import RunFailed
        from relaykit.errors import RUN_CANCELLED

        try:
            result = await asyncio.wait_for(run.handle.result(), timeout)
        except TimeoutError:
            await self.describe_stuck(run)
            return "not ended"
        except RunFailed as exc:
            if exc.type == RUN_CANCELLED:
                return "cancelled"
            if not exc.type:
                self.out.violations.append(f"{run.handle.id} failed without a type: {exc}")
            return f"failed:{exc.type}"
        run.transcript_text = "\n".join(m.content or "" for m in result.transcript)
        return "completed"

    async def describe_stuck(self, run: Tracked) -> None:
        """What a run that did not end waits for: its pending activities and last events."""
        try:
            description = await run.handle.workflow.describe()
            for a in description.raw_description.pending_activities:
                failure = a.last_failure.message.strip()[:200]
                self.out.notes.append(
                    f"{run.handle.id} waits for activity {a.activity_type.name} "
                    f"(attempt {a.attempt}, state {a.state}, last failure {failure!r})"
                )
            tail = [e async for e in run.handle.workflow.fetch_history_events()][-6:]
            names = ", ".join(
                EventType.Name(e.event_type).removeprefix("EVENT_TYPE_") for e in tail
            )
            self.out.notes.append(f"{run.handle.id} last events: {names}")
        except Exception as exc:  # noqa: BLE001 - best effort
            self.out.notes.append(f"{run.handle.id}: describe failed: {exc}")

    async def check(self) -> None:
        requests = self.server.requests(self.model)
        limits = [limit for run in self.runs for limit in run.limits]
        trees = []
        for run in self.runs:
            workflow = run.handle.workflow  # from its first run: the chain's earlier runs too
            first = workflow.first_execution_run_id or workflow.result_run_id
            tree = await checks.workflow_tree(self.client, run.handle.id, first)
            trees.append(tree)
            wedges, benign = checks.task_failures(tree)
            self.out.wedges += wedges
            if wedges:  # replayable with Temporal's Replayer, beside the worker logs
                checks.save_failed_histories(tree, Path(self.out.workdir))
            self.out.benign_task_failures += benign
            await self.check_operator_events(run, tree)
            if self.plan.max_usd:
                await self.check_spend(run, limits)
            await self.check_children_budget(run, tree)
            if run.fork_mark is not None:
                problem = checks.fork_mismatch(requests, run.fork_mark, run.fork_turn)
                self.out.forks_compared += problem != checks.NOT_COMPARED
                if problem and problem != checks.NOT_COMPARED:
                    self.out.violations.append(f"{run.handle.id}: {problem}")
        for mark, run in self.marks:
            self.out.marks_checked += 1
            completed = run.status == "completed"
            for problem in checks.steer_problems(requests, mark, run.fork_mark, completed):
                self.out.violations.append(f"{run.handle.id}: {problem}")
            if run.transcript_text.count(mark) > 1:
                self.out.violations.append(f"{run.handle.id}: {mark} twice in the final transcript")
        self.out.summaries = sum(1 for r in requests if is_summary(r))
        self.out.child_calls = sum(1 for r in requests if first_text(r).startswith(CHILD_PREFIX))
        self.out.other_model_calls = sum(1 for r in requests if r.body.get("model") != self.model)
        self.out.repeated_writes = checks.repeated_writes(
            self.rig.write_log
        ) + checks.repeated_mcp_writes(self.rig.mcp_log, checks.mcp_write_calls(trees))
        self.out.mcp_writes = sum(checks.mcp_write_starts(self.rig.mcp_log).values())
        if not (self.out.actions["kill"] or self.out.actions["deploy"]):  # nothing cut a read
            self.out.violations += checks.repeated_reads(self.rig.write_log)
        self.out.writes = checks.write_starts(self.rig.write_log)
        self.out.actions["kill"] += 0
        self.out.actions["deploy"] += 0

    async def check_operator_events(self, run: Tracked, tree: list[Any]) -> None:
        """Every operator event of the run and its children names the driver as its author; a
        call is answered once; a late answer the run took is an ``approval_refused`` event."""
        from relaykit import get_run

        for wid in dict.fromkeys(w for w, _rid, _events in tree):
            events = await self.call("events", get_run(self.client, wid).events())
            if isinstance(events, Exception):
                continue
            answered: collections.Counter[str] = collections.Counter()
            refused: set[str] = set()
            for e in events:
                if e.kind not in OPERATOR_EVENTS:
                    continue
                self.out.operator_events += 1
                call_id = e.data.get("call_id", "")
                if e.kind == "approval_answered":
                    answered[call_id] += 1
                elif e.kind == "approval_refused":
                    refused.add(call_id)
                relaykit_own = e.data.get("timed_out") or (
                    e.kind == "cancelled" and wid != run.handle.id and "by" not in e.data
                )  # an approval timeout; a child cancelled as its parent ended or was cancelled
                if not relaykit_own and e.data.get("by") != OPERATOR:
                    self.out.violations.append(
                        f"{wid}: {e.kind} event {e.seq} names no author: {e.data}"[:300]
                    )
            self.out.violations += [
                f"{wid}: call {c} answered {n} times" for c, n in answered.items() if n > 1
            ]
            if wid == run.handle.id and run.status.startswith("failed"):
                tail = ", ".join(
                    f"{e.kind}{e.data if e.kind.startswith(('budget', 'error')) else ''}"
                    for e in events[-8:]
                )
                self.out.notes.append(f"{wid} ended with events: {tail}"[:1500])
            if wid == run.handle.id:
                self.out.violations += [
                    f"{wid}: the late answer to {c} was taken, but no approval_refused event"
                    for c in sorted(run.signalled_late - refused)
                ]

    async def check_spend(self, run: Tracked, limits: list[float]) -> None:
        """A budgeted run (its children included) never spends past the highest limit it had."""
        state = await self.call("state", run.handle.state())
        if isinstance(state, Exception) or state.budget is None:
            return
        self.out.budget_runs += 1
        bound = max([*limits, state.budget.limit])
        if state.usage.cost_usd > bound + 1e-9:
            self.out.violations.append(
                f"{run.handle.id}: spent ${state.usage.cost_usd:.6f}, past its highest limit "
                f"${bound:.6f}"
            )
        events = await self.call("events", run.handle.events())
        stopped = not isinstance(events, Exception) and any(
            e.kind == "budget_reached" for e in events
        )
        self.out.budget_stops += stopped or run.status == "failed:BudgetExceeded"

    async def check_children_budget(self, run: Tracked, tree: list[Any]) -> None:
        """Once the run has ended, no child of it still waits for its parent's budget (a
        parent that ended answers its asks; a child finds an ask to an ended parent
        undeliverable)."""
        from relaykit import get_run

        children = {w for w, _rid, _events in tree if w != run.handle.id}
        deadline = time.monotonic() + 15.0
        while children:
            waiting = set()
            for wid in sorted(children):
                child = get_run(self.client, wid)
                if await self.closed(Tracked(child)):
                    continue
                state = await self.call("child state", child.state())
                if not isinstance(state, Exception) and state.status == "waiting_parent_budget":
                    waiting.add(wid)
            if not waiting or time.monotonic() > deadline:
                break
            children = waiting
            await asyncio.sleep(1.0)
        else:
            return
        self.out.violations += [
            f"{wid}: waits for its parent's budget after {run.handle.id} ended ({run.status})"
            for wid in sorted(waiting)
        ]

    async def cleanup(self) -> None:
        for run in self.runs:
            if run.status in ("", "not ended"):
                try:
                    await run.handle.workflow.terminate("chaos: the run did not end in time")
                except Exception:  # noqa: BLE001 - already closed
                    pass
        await asyncio.to_thread(self.rig.close)


async def run_seed(
    client: Client,
    server: ScriptedModelServer,
    address: str,
    seed: int,
    workdir: Path,
    settle: float = SETTLE_SECONDS,
) -> Outcome:
    work = workdir / f"seed-{seed}"
    work.mkdir(parents=True, exist_ok=True)
    driver = Driver(client, server, address, seed, work, settle)
    task = asyncio.ensure_future(driver.go())
    done, _ = await asyncio.wait({task}, timeout=SEED_SECONDS)
    if not done:  # a client call that ignored its own bound: report it, never hang the others
        task.cancel()  # not awaited: a call that ignores cancellation must not hold the rest
        driver.out.violations.append(
            f"the driver did not finish within {SEED_SECONDS:.0f} s (runs: "
            + ", ".join(run.handle.id for run in driver.runs)
            + ")"
        )
        await asyncio.to_thread(driver.rig.close)
        return driver.out
    try:
        return task.result()
    except Exception:  # noqa: BLE001 - the driver's own failure is reported as one
        driver.out.violations.append("the driver failed: " + traceback.format_exc(limit=5))
        return driver.out


async def run_seeds(
    client: Client,
    server: ScriptedModelServer,
    address: str,
    seeds: list[int],
    workdir: Path,
    concurrency: int = 1,
    settle: float = SETTLE_SECONDS,
    progress: bool = False,
) -> list[Outcome]:
    gate = asyncio.Semaphore(concurrency)

    async def one(seed: int) -> Outcome:
        async with gate:
            outcome = await run_seed(client, server, address, seed, workdir, settle)
        if progress:
            state = "FAILED" if outcome.failed else "ok"
            print(f"seed {seed}: {state} ({outcome.seconds:.0f}s)", flush=True)
        return outcome

    return list(await asyncio.gather(*(one(s) for s in seeds)))


# --- the report ----------------------------------------------------------------------------------


def table(outcomes: list[Outcome]) -> str:
    actions: collections.Counter[str] = collections.Counter()
    for o in outcomes:
        actions.update(o.actions)
    ended: collections.Counter[str] = collections.Counter(
        s.split(":")[0] for o in outcomes for s in o.ended.values()
    )
    rows = [
        ("seeds (runs started by the driver)", str(len(outcomes))),
        ("runs incl. forks", str(sum(len(o.ended) for o in outcomes))),
        (
            "  completed / failed (typed) / cancelled",
            "{} / {} / {}".format(ended["completed"], ended["failed"], ended["cancelled"]),
        ),
        *(
            (f"  failed: {kind}", str(n))
            for kind, n in sorted(
                collections.Counter(
                    s.split(":", 1)[1]
                    for o in outcomes
                    for s in o.ended.values()
                    if s.startswith("failed:")
                ).items()
            )
        ),
        ("actions", str(sum(v for k, v in actions.items()))),
        *(
            (f"  {kind}", str(actions[kind]))
            for kind in ("steer", "send", "pause", "approve", "deny", "fork", "cancel")
        ),
        *(
            (f"  answers by {mode}", str(actions[f"answer by {mode}"]))
            for mode in ("update", "signal", "bulk", "race")
        ),
        ("  late answers (to a call answered already)", str(sum(o.late_answers for o in outcomes))),
        *(
            (f"  budget {kind}", str(actions[kind]))
            for kind in ("raise", "set", "finish", "budget_cancel")
        ),
        ("  budget actions on a child run", str(actions["budget of a child"])),
        ("budgeted runs (incl. forks)", str(sum(o.budget_runs for o in outcomes))),
        ("  stopped at their limit", str(sum(o.budget_stops for o in outcomes))),
        ("operator events checked for an author", str(sum(o.operator_events for o in outcomes))),
        ("kills (SIGKILL + restart)", str(actions["kill"])),
        ("MCP server kills (the worker goes on)", str(actions["mcp kill"])),
        ("  server processes killed", str(sum(o.mcp_servers_killed for o in outcomes))),
        ("deploys (changed definition)", str(actions["deploy"])),
        ("  of them with another model", str(actions["deploy with another model"])),
        ("  model calls by its name", str(sum(o.other_model_calls for o in outcomes))),
        (
            "  of them changing which tools need approval",
            str(actions["deploy that changed approvals"]),
        ),
        ("  approvals asked for work (after such a deploy)", str(actions["asked for work"])),
        ("write starts", str(sum(o.writes for o in outcomes))),
        ("MCP write starts (slow_write)", str(sum(o.mcp_writes for o in outcomes))),
        ("summary calls (compaction)", str(sum(o.summaries for o in outcomes))),
        ("model calls of child runs", str(sum(o.child_calls for o in outcomes))),
        ("forks compared with the original", str(sum(o.forks_compared for o in outcomes))),
        ("steers and sends traced", str(sum(o.marks_checked for o in outcomes))),
        ("wedged runs (workflow task failed)", str(sum(1 for o in outcomes if o.wedges))),
        (
            "  benign task failures (not counted)",
            str(sum(len(o.benign_task_failures) for o in outcomes)),
        ),
        ("repeated writes", str(sum(len(o.repeated_writes) for o in outcomes))),
        ("runs not ended within the bound", str(sum(o.not_ended for o in outcomes))),
        ("other violations", str(sum(len(o.violations) for o in outcomes))),
        ("failing seeds", " ".join(str(o.seed) for o in outcomes if o.failed) or "none"),
    ]
    width = max(len(r[0]) for r in rows)
    lines = [f"| {'':<{width}} | value |", f"|{'-' * (width + 2)}|-------|"]
    lines += [f"| {name:<{width}} | {value} |" for name, value in rows]
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m bench.chaos", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--runs", type=int, default=10, help="how many seeds (default 10)")
    parser.add_argument("--seed", type=int, default=1, help="the first seed (default 1)")
    parser.add_argument("--seeds", default="", help="comma-separated seeds (instead of a range)")
    parser.add_argument("--concurrency", type=int, default=1, help="seeds at once (default 1)")
    parser.add_argument("--settle", type=float, default=SETTLE_SECONDS, help="bound on ending")
    parser.add_argument("--keep", action="store_true", help="keep every run's worker logs")
    parser.add_argument(
        "--verbose", action="store_true", help="report every seed, not only failing ones"
    )
    return parser.parse_args(argv)


async def amain(args: argparse.Namespace) -> int:
    from relaykit import connect
    from relaykit.devserver import DevServer

    workdir = Path(tempfile.mkdtemp(prefix="relaykit-chaos-"))
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()] or list(
        range(args.seed, args.seed + args.runs)
    )
    began = time.monotonic()
    with (
        DevServer(port=0, headless=True, in_memory=True) as temporal,
        ScriptedModelServer() as server,
    ):
        client = await connect(
            temporal.address, namespace="default", store=(workdir / "store").as_uri()
        )
        outcomes = await run_seeds(
            client, server, temporal.address, seeds, workdir, args.concurrency, args.settle, True
        )
    print()
    print(table(outcomes))
    print(f"\n{len(seeds)} seeds in {time.monotonic() - began:.0f}s")
    failing = [o for o in outcomes if o.failed]
    for o in outcomes if args.verbose else failing:
        print()
        print(o.report())
    if not failing and not args.keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if failing else 0


def main(argv: list[str] | None = None) -> None:
    sys.exit(asyncio.run(amain(parse_args(argv))))


if __name__ == "__main__":
    main()
