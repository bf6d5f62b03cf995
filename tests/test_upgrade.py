"""A relaykit upgrade with runs open: runs brought to a point under a worker of the previous
release (commit ``d8ed828``), that worker stopped the way an operator stops it (SIGTERM), a
worker of today's relaykit started on the same task queue, the runs released. Each must finish
as it would have without the upgrade: its answer, each tool run the expected number of times,
no workflow task failed.

Both workers are real processes serving :mod:`tests.upgrade_agents`, with the same model server
and the same transcript store. The previous release's ``relaykit`` is read from git
(``git archive``), so the test needs a clone that holds that commit (CI's does; a shallow one
skips it).

Set ``RELAYKIT_RECORD_UPGRADE=1`` to write each run's history at the upgrade point (the
previous release's) to ``tests/histories/upgrade/``;
``test_the_previous_releases_histories_at_the_upgrade_point_replay_with_todays_code`` replays
those files with today's code, so every later release is checked against them.
"""

from __future__ import annotations

import asyncio
import io
import os
import shutil
import signal
import subprocess
import sys
import tarfile
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import RunHandle, RunResult, get_run, start_run
from relaykit.testing.scripted_server import Step, call, text
from tests.test_crash_recovery import (
    REPO_ROOT,
    START_AND_FINISH,
    CrashRig,
    eventually,
    never,
    rig,  # noqa: F401 - the fixture
    wait_requests,
)
from tests.test_deploy_matrix import approvals_requested, tool_results
from tests.test_versioning import relaykit_cli

PREVIOUS_RELEASE = "d8ed828"
MODULE = "tests.upgrade_agents"
AGENTS_FILE = Path(__file__).resolve().parent / "upgrade_agents.py"
HISTORIES = Path(__file__).resolve().parent / "histories" / "upgrade"


def previous_release(into: Path) -> Path:
    """The previous release's ``relaykit`` package and the agents module, side by side in
    ``into``: a worker started there with ``PYTHONPATH=into`` imports that ``relaykit``."""
    known = subprocess.run(
        ["git", "cat-file", "-e", f"{PREVIOUS_RELEASE}^{{commit}}"],
        cwd=REPO_ROOT,
        capture_output=True,
    )
    if known.returncode != 0:
        pytest.skip(f"commit {PREVIOUS_RELEASE} (the previous release) is not in this clone")
    archive = subprocess.run(
        ["git", "archive", PREVIOUS_RELEASE, "relaykit"],
        cwd=REPO_ROOT,
        capture_output=True,
        check=True,
    )
    into.mkdir()
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(into, filter="data")
    shutil.copy(AGENTS_FILE, into / "upgrade_agents.py")
    return into


def start_previous_worker(rig: CrashRig, tree: Path) -> subprocess.Popen[bytes]:
    """A worker of the previous release: run from ``tree`` (so neither the checkout's
    ``relaykit`` nor its ``tests`` package is on the path), serving ``upgrade_agents``."""
    env = {**rig.environment(), "PYTHONPATH": str(tree), "UPGRADE_RELEASE": "old"}
    imported = subprocess.run(
        [sys.executable, "-c", "import relaykit, upgrade_agents; print(relaykit.__file__)"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        check=True,
    )
    assert Path(imported.stdout.strip()).is_relative_to(tree), imported.stdout
    log = open(rig.tmp / "worker-previous.log", "wb")  # noqa: SIM115
    rig.logs.append(log)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "relaykit.cli",
            "worker",
            "upgrade_agents",
            "--task-queue",
            rig.task_queue,
        ],
        cwd=tree,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    rig.processes.append(proc)
    return proc


async def serving(proc: subprocess.Popen[bytes], log: Path) -> None:
    """Until the worker says what it serves; a worker that exits instead fails with its log."""

    def said() -> bool:
        return proc.poll() is not None or "serving:" in log.read_text(errors="replace")

    await eventually(said, "the previous release's worker to start", timeout=START_AND_FINISH)
    assert proc.poll() is None, log.read_text(errors="replace")


@dataclass
class Shape:
    """One run: its agent, its scripted model calls (by shape), and its handle once started."""

    name: str
    scripts: dict[str, list[Step]]
    start: dict[str, object] = field(default_factory=dict)
    handle: RunHandle | None = None
    children: dict[str, RunHandle] = field(default_factory=dict)
    """Child runs to record at the upgrade point, by the name of their history file."""

    @property
    def agent(self) -> str:
        return f"up_{self.name}"

    @property
    def run(self) -> RunHandle:
        assert self.handle is not None
        return self.handle


def model(rig: CrashRig, shape: str) -> str:
    return f"{rig.model}-{shape}"


async def until_status(handle: RunHandle, wanted: str, what: str) -> None:
    async def reached() -> bool:
        return (await handle.state()).status == wanted

    await eventually(reached, f"{handle.id}: {what}", timeout=START_AND_FINISH)


async def waiting_for(handle: RunHandle, tool: str) -> None:
    async def asked() -> bool:
        return any(p.tool == tool for p in await handle.pending_approvals())

    await eventually(asked, f"{handle.id}: an approval for {tool}", timeout=START_AND_FINISH)


async def approve(handle: RunHandle, tool: str) -> None:
    await waiting_for(handle, tool)
    (pending,) = [p for p in await handle.pending_approvals() if p.tool == tool]
    await handle.approve(pending.call_id)


async def park(rig: CrashRig, run: RunHandle, shape: str, hold: threading.Event, n: int) -> None:
    """Pause ``run`` at the turn boundary after the ``n``-th call (held) of ``shape``'s model."""
    await wait_requests(rig.model_server, model(rig, shape), n)
    await run.pause()
    hold.set()
    await until_status(run, "paused", "paused at a turn boundary")


async def ended(shape: Shape) -> RunResult:
    try:
        return await asyncio.wait_for(shape.run.result(), START_AND_FINISH)
    except TimeoutError:
        state = await shape.run.state()
        raise AssertionError(f"{shape.name}: no end in time; {state}") from None


async def failed_tasks(client: Client, task_queue: str) -> list[str]:
    """Every workflow task failure, whatever its cause, of every execution on the task queue
    (each run of a chain, children included)."""
    found: list[str] = []
    async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                failure = event.workflow_task_failed_event_attributes.failure
                found.append(f"{execution.id}: {failure.message[:300]}")
    return found


async def failed_activities(client: Client, task_queue: str) -> list[str]:
    """Every activity attempt that failed (not timed out) on the task queue: a model call that
    could not find a request part it was sent by reference, most of all."""
    found: list[str] = []
    async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        async for event in handle.fetch_history_events():
            if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED:
                failure = event.activity_task_failed_event_attributes.failure
                found.append(f"{execution.id}: {failure.message[:300]}")
    return found


async def record_histories(client: Client, shapes: list[Shape]) -> None:
    """At the upgrade point: each run's history (its current execution) and its children's,
    as the previous release wrote them, for ``tests/histories/upgrade/``."""
    if os.environ.get("RELAYKIT_RECORD_UPGRADE") != "1":
        return
    HISTORIES.mkdir(parents=True, exist_ok=True)
    for old in HISTORIES.glob("*.json"):
        old.unlink()
    for shape in shapes:
        runs = {shape.name: shape.run, **shape.children}
        for name, run in runs.items():
            history = await client.get_workflow_handle(run.id).fetch_history()
            (HISTORIES / f"{name}.json").write_text(history.to_json())


def scripts() -> list[Shape]:
    return [
        Shape("approval", {"approval": [call("refund", q="1"), text("refunded")]}),
        Shape(
            "loop",
            {
                "loop": [
                    call("step", q="a"),
                    call("step", q="b", hold=HOLDS["loop"]),
                    call("step", q="c"),
                    text("looped"),
                ]
            },
        ),
        Shape(
            "inflight",
            {"inflight": [call("step", q="a"), text("lost", hold=never()), text("answered")]},
        ),
        Shape(
            "subagent",
            {
                "subagent": [
                    call("spawn_subagent", agent="up_sub_worker", prompt="dig"),
                    call("wait_subagents", timeout_seconds=600),
                    text("reported"),
                ],
                "sub_worker": [call("dig", q="x"), text("lost", hold=never()), text("dug x")],
            },
        ),
        Shape(
            "handoff",
            {
                "handoff": [call("transfer_to_up_desk")],
                "desk": [
                    call("file", q="h", hold=HOLDS["handoff"]),
                    call("file", q="i"),
                    text("filed"),
                ],
            },
        ),
        Shape(
            "asker",
            {
                "asker": [call("ask_expert", id="call_ask", input="study"), text("asked")],
                "expert": [
                    call("study", q="x", hold=HOLDS["asker"]),
                    call("study", q="y"),
                    text("studied"),
                ],
            },
        ),
        Shape(
            "gatekeeper",
            {
                "gatekeeper": [call("ask_gate", id="call_gate", input="grant"), text("kept")],
                "gate": [call("grant", q="g"), text("granted")],
            },
        ),
        Shape(
            "chain",
            {
                "chain": [
                    call("step", q="a"),
                    call("step", q="b"),
                    call("step", q="c", hold=HOLDS["chain"]),  # the continued run's first turn
                    call("step", q="d"),
                    text("chained"),
                ]
            },
            start={"continue_as_new_after_turns": 2},
        ),
        Shape(
            "paused",
            {"paused": [call("step", q="p", hold=HOLDS["paused"]), text("resumed")]},
        ),
        Shape(
            "sub_chain",
            {
                "sub_chain": [
                    call("lookup", q="a"),
                    call("lookup", q="b"),
                    call("lookup", q="c", hold=HOLDS["sub_chain"]),
                    call("lookup", q="d"),
                    text("looked up"),
                ]
            },
            start={"continue_as_new_after_turns": 2},
        ),
    ]


HOLDS: dict[str, threading.Event] = {}


async def test_runs_in_flight_under_the_previous_release_finish_under_todays_relaykit(
    client: Client, rig: CrashRig
) -> None:
    tree = previous_release(rig.tmp / "previous")
    HOLDS.clear()
    HOLDS.update({n: threading.Event() for n in ("loop", "handoff", "asker", "chain", "paused")})
    HOLDS["sub_chain"] = threading.Event()
    shapes = {s.name: s for s in scripts()}
    server = rig.model_server
    previous = start_previous_worker(rig, tree)
    await serving(previous, rig.tmp / "worker-previous.log")
    for shape in shapes.values():
        for name, steps in shape.scripts.items():
            server.script(model(rig, name), steps)
        shape.handle = await start_run(
            client,
            shape.agent,
            "go",
            task_queue=rig.task_queue,
            id=f"upgrade-{shape.name}-{rig.model}",
            **shape.start,  # type: ignore[arg-type]
        )
    asker = shapes["asker"]
    asker.children["asker_child"] = get_run(client, f"{asker.run.id}/call_ask")
    gatekeeper = shapes["gatekeeper"]
    gatekeeper.children["gatekeeper_child"] = get_run(client, f"{gatekeeper.run.id}/call_gate")

    # --- every run at its point under the previous release --------------------------------------
    await asyncio.gather(
        waiting_for(shapes["approval"].run, "refund"),
        park(rig, shapes["loop"].run, "loop", HOLDS["loop"], 2),
        park(rig, shapes["handoff"].run, "desk", HOLDS["handoff"], 1),
        park(rig, asker.children["asker_child"], "expert", HOLDS["asker"], 1),
        waiting_for(gatekeeper.run, "grant"),
        park(rig, shapes["chain"].run, "chain", HOLDS["chain"], 3),
        park(rig, shapes["paused"].run, "paused", HOLDS["paused"], 1),
        park(rig, shapes["sub_chain"].run, "sub_chain", HOLDS["sub_chain"], 3),
        wait_requests(server, model(rig, "inflight"), 2),  # held: in flight at the upgrade
        wait_requests(server, model(rig, "sub_worker"), 2),  # the task's call, held
        wait_requests(server, model(rig, "subagent"), 2),  # the lead waits for its task
    )
    sub = shapes["subagent"]
    (started,) = [e for e in await sub.run.events() if e.kind == "subagent_started"]
    sub.children["subagent_child"] = get_run(client, started.data["workflow_id"])
    await record_histories(client, list(shapes.values()))

    # --- the upgrade: the previous release's worker stopped, today's takes the task queue -------
    previous.send_signal(signal.SIGTERM)
    # the previous release has no graceful stop: SIGTERM ends it at once, calls in flight too
    assert await asyncio.to_thread(previous.wait, 60) == -signal.SIGTERM
    rig.start_worker(MODULE, UPGRADE_RELEASE="new")
    for name in ("loop", "handoff", "chain", "sub_chain"):
        await shapes[name].run.resume()
    await asker.children["asker_child"].resume()
    await shapes["paused"].run.resume("Mention pears too.")
    await approve(shapes["approval"].run, "refund")
    await approve(gatekeeper.run, "grant")
    results = {name: await ended(shape) for name, shape in shapes.items()}

    # --- what each run did ----------------------------------------------------------------------
    calls = rig.tool_calls()
    outputs = {name: result.output for name, result in results.items()}
    assert outputs == {
        "approval": "refunded",
        "loop": "looped",
        "inflight": "answered",
        "subagent": "reported",
        "handoff": "filed",
        "asker": "asked",
        "gatekeeper": "kept",
        "chain": "chained",
        "paused": "resumed",
        "sub_chain": "looked up",
    }
    assert calls == {
        "refund new 1": 1,  # approved after the upgrade
        "step old a": 3,  # loop, inflight, chain
        "step old b": 2,
        "step new c": 1,
        "dig old x": 1,
        "file old h": 1,
        "file new i": 1,
        "study old x": 1,
        "study new y": 1,
        "grant new g": 1,
        "step old c": 1,
        "step new d": 1,
        "step old p": 1,
        "lookup old a": 1,
        "lookup old b": 1,
        "lookup old c": 1,
        "lookup new d": 1,
    }, calls
    # approval waiting: asked once, answered after the upgrade
    assert await approvals_requested(shapes["approval"].run) == ["refund"]
    # tool loop: the results of both workers' tools, in order
    assert tool_results(results["loop"].transcript) == ["step a", "step b", "step c"]
    # model call in flight: the previous release exits at once on SIGTERM, so the call is lost
    # and made again by today's worker (after its heartbeat timeout)
    assert server.request_count(model(rig, "inflight")) == 3
    # subagent running: its call in flight is made again; its report reaches the lead
    assert server.request_count(model(rig, "sub_worker")) == 3
    report = server.requests(model(rig, "subagent"))[-1]
    assert "dug x" in str(report.messages)
    # handoff: the run ends in the desk agent
    assert results["handoff"].final_agent == "up_desk"
    # agent-as-tool child: its answer is the parent's tool result
    assert tool_results(results["asker"].transcript) == ["studied"]
    # approval inside a child: asked in the parent, answered there, run in the child
    assert tool_results(results["gatekeeper"].transcript) == ["granted"]
    # continued as new: the whole transcript reaches the model
    last = server.requests(model(rig, "chain"))[-1]
    assert [m["content"] for m in last.messages if m.get("role") == "tool"] == [
        "step a",
        "step b",
        "step c",
        "step d",
    ]
    # paused: the message given with resume reaches the model
    assert "Mention pears too." in str(server.requests(model(rig, "paused"))[-1].messages)
    # an agent with subagents, continued as new: the whole transcript, no call lost or repeated
    last = server.requests(model(rig, "sub_chain"))[-1]
    assert [m["content"] for m in last.messages if m.get("role") == "tool"] == [
        "lookup a",
        "lookup b",
        "lookup c",
        "lookup d",
    ]
    assert server.request_count(model(rig, "sub_chain")) == 5

    assert await failed_tasks(client, rig.task_queue) == []
    assert await failed_activities(client, rig.task_queue) == []


def test_the_previous_releases_histories_at_the_upgrade_point_replay_with_todays_code(
    rig: CrashRig,
) -> None:
    # The runs as the previous release left them at the upgrade point, replayed by the deploy
    # gate with today's code: every later release must replay them too.
    files = sorted(HISTORIES.glob("*.json"))
    assert len(files) == 13, [f.name for f in files]
    done = relaykit_cli(rig, "replay-check", MODULE, "--histories", str(HISTORIES))
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "replayed 13, failed 0, skipped 0"
