"""``python -m bench.chaos``: a seeded fuzzer of operator actions and faults.

Each seed is one run (see :mod:`bench.chaos_model` for what a seed draws): a real ``relaykit
worker`` process of its own (``bench.chaos_agents``, on a task queue of its own), the scripted
model server over HTTP playing the model, and a driver that steers, sends, pauses and resumes,
approves and denies, forks at a random turn, cancels, SIGKILLs the worker and starts it again,
and deploys a changed definition (the worker restarted with a new ``CHAOS_VERSION``: changed
instructions and one more tool, at once or rolling), at moments tied to the model's requests.
Then it stops acting, approves whatever still waits, resumes a paused run, and checks:

- every run (the original and its forks) ends, completed, failed with a type, or cancelled,
  within ``--settle`` seconds after the actions stop;
- no workflow task failed anywhere (children and continue-as-new runs included), except causes
  that are Temporal's own concurrency (:data:`bench.chaos_checks.BENIGN_TASK_FAILURES`);
- no write (the ``charge`` and ``work`` tools, the ``on_handoff`` callback) started twice;
- a fork's first model request is the original's request at that turn;
- an accepted steer or send reaches the model, and never twice in one request.

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
from relaykit.testing.scripted_server import ScriptedModelServer

AGENT = "chaos"
SETTLE_SECONDS = 60.0
"""How long a run may take to end once the actions stopped: long enough for a killed worker's
sticky timeout, heartbeat timeouts and a new worker to start on a loaded machine."""
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
    forks_compared: int = 0
    summaries: int = 0
    child_calls: int = 0
    marks_checked: int = 0
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
            f"  worker logs: {self.workdir}",
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
        from relaykit import start_run

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
            )
            self.runs.append(Tracked(handle))
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
        while self.server.request_count(self.model) < action.at:
            if await self.closed(original):
                return "the run ended first"
            if time.monotonic() > deadline:
                return f"no model request for {TRIGGER_SECONDS:g}s"
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

    async def open_runs(self) -> list[Tracked]:
        return [r for r in self.runs if not await self.closed(r)]

    async def act(self, action: Action) -> None:
        self.out.actions[action.kind] += 1
        runs = await self.open_runs()
        target = runs[int(action.knob * len(runs))] if runs else self.runs[0]
        kind = action.kind
        if kind in ("steer", "send"):
            mark = f"{kind.upper()}-{uuid.uuid4().hex[:8]}"
            words = f"{mark}: the customer adds one more detail."
            method = target.handle.steer if kind == "steer" else target.handle.send_message
            result = await self.call(kind, method(words))
            if not isinstance(result, Exception):
                self.marks.append((mark, target))
        elif kind == "pause":
            await self.call("pause", target.handle.pause())
            await asyncio.sleep(0.3 + 2 * action.knob)
            await self.call("resume", target.handle.resume())
        elif kind == "kill":
            await asyncio.to_thread(self.rig.kill)
            await asyncio.sleep(2 * action.knob)
            self.rig.start()
        elif kind == "deploy":
            self.rig.version += 1
            if action.knob < 0.5:  # rolling: the new worker polls before the old one stops
                self.rig.start()
                await asyncio.to_thread(self.rig.stop_oldest)
            else:
                await asyncio.to_thread(self.rig.stop_oldest)
                self.rig.start()
        elif kind == "fork":
            await self.fork(action)
        elif kind == "cancel":
            await self.call("cancel", self.runs[0].handle.cancel())

    async def fork(self, action: Action) -> None:
        from relaykit import fork_run
        from relaykit.fork import ForkError

        seen = [turn_of(r) - 1 for r in requests_of_run(self.server.requests(self.model), None)]
        turn = 1 + int(action.knob * max(seen, default=1))
        mark = f"FORK-{uuid.uuid4().hex[:8]}"
        try:
            handle = await asyncio.wait_for(
                fork_run(self.client, self.runs[0].handle.id, turn, input=f"{mark}: go on."),
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
        while True:
            for run in list(self.runs):
                if await self.closed(run):
                    continue
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
                    await self.call("approve", run.handle.approve(p.call_id, approved))
            await asyncio.sleep(0.3)

    async def settle_all(self) -> None:
        """Stop acting: a worker serves, paused runs resume, every approval is granted; then
        every run has ``settle`` seconds to end."""
        self.settling = True
        if not self.rig.live:
            self.rig.start()
        for run in await self.open_runs():
            await self.call("resume", run.handle.resume())
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
        for run in self.runs:
            tree = await checks.workflow_tree(self.client, run.handle.id, None)
            wedges, benign = checks.task_failures(tree)
            self.out.wedges += wedges
            self.out.benign_task_failures += benign
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
        self.out.repeated_writes = checks.repeated_writes(self.rig.write_log)
        self.out.writes = checks.write_starts(self.rig.write_log)
        self.out.actions["kill"] += 0
        self.out.actions["deploy"] += 0

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
        ("actions", str(sum(v for k, v in actions.items()))),
        *(
            (f"  {kind}", str(actions[kind]))
            for kind in ("steer", "send", "pause", "approve", "deny", "fork", "cancel")
        ),
        ("kills (SIGKILL + restart)", str(actions["kill"])),
        ("deploys (changed definition)", str(actions["deploy"])),
        ("write starts", str(sum(o.writes for o in outcomes))),
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
