"""Edited agent definitions with runs open: every change of the matrix, one deploy.

Runs of :mod:`tests.matrix_agents` (one agent per change) are brought to a point under a worker
serving v1: a turn boundary (paused), an approval waiting, a background task running, a tool
call in flight. The worker is replaced by one serving v2, the way an operator deploys (SIGTERM,
or a crash that kills it with a call in flight), and the runs are released. Each must complete
or fail with a typed error; none may fail a workflow task with a non-determinism error.

Set ``RELAYKIT_RECORD_MATRIX=1`` to write each run's history at the deploy point to
``tests/histories/matrix/``; ``test_the_recorded_matrix_histories_replay_with_either_version``
replays those files with both versions' definitions, so the next release is checked against them.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.client import Client

from relaykit import RunFailed, RunHandle, start_run
from relaykit.stuck import stuck
from relaykit.testing.scripted_server import Step, call, text
from tests.test_crash_recovery import (
    START_AND_FINISH,
    CrashRig,
    eventually,
    kill,
    rig,  # noqa: F401 - the fixture
    wait_requests,
)
from tests.test_versioning import relaykit_cli, stop

MODULE = "tests.matrix_agents"
HISTORIES = Path(__file__).resolve().parent / "histories" / "matrix"


@dataclass
class Shape:
    """One change of the matrix: its run, and what a person sees of it after the deploy."""

    name: str
    script: list[Step]
    scripts: dict[str, list[Step]] = field(default_factory=dict)
    """Scripts of other agents' models (a background task's), by shape."""
    start: dict[str, object] = field(default_factory=dict)
    handle: RunHandle | None = None

    @property
    def agent(self) -> str:
        return f"matrix_{self.name}"


def model(rig: CrashRig, shape: str) -> str:
    return f"{rig.model}-{shape}"


async def status(handle: RunHandle) -> str:
    return (await handle.state()).status


async def until(handle: RunHandle, wanted: str, what: str) -> None:
    async def reached() -> bool:
        return await status(handle) == wanted

    await eventually(reached, f"{handle.id}: {what}", timeout=START_AND_FINISH)


async def approve_next(handle: RunHandle, tool: str) -> None:
    async def asked() -> bool:
        return any(p.tool == tool for p in await handle.pending_approvals())

    await eventually(asked, f"{handle.id}: an approval for {tool}", timeout=START_AND_FINISH)
    (pending,) = [p for p in await handle.pending_approvals() if p.tool == tool]
    await handle.approve(pending.call_id)


async def ended(shape: Shape) -> object:
    """The run's result (or its failure), or a failed assertion naming the run and its state."""
    assert shape.handle is not None
    try:
        return await asyncio.wait_for(shape.handle.result(), START_AND_FINISH)
    except TimeoutError:
        state = await shape.handle.state()
        raise AssertionError(f"{shape.name}: no end in time; {state}") from None


def tool_results(transcript: list) -> list[str]:
    return [m.content for m in transcript if m.role == "tool"]


async def approvals_requested(handle: RunHandle) -> list[str]:
    return [e.data["tool"] for e in await handle.events() if e.kind == "approval_requested"]


async def failed_tasks(client: Client, task_queue: str) -> list[str]:
    """Every workflow task failure of every execution on the task queue (each run of a chain,
    children included): a non-determinism error most of all, any other one too."""
    found: list[str] = []
    async for execution in client.list_workflows(f"TaskQueue = '{task_queue}'"):
        handle = client.get_workflow_handle(execution.id, run_id=execution.run_id)
        history = await handle.fetch_history()
        for event in history.events:
            if event.event_type != EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
                continue
            attributes = event.workflow_task_failed_event_attributes
            if (
                attributes.cause
                == WorkflowTaskFailedCause.WORKFLOW_TASK_FAILED_CAUSE_NON_DETERMINISTIC_ERROR
            ):
                found.append(f"{execution.id}: {attributes.failure.message[:300]}")
    return found


async def record_histories(client: Client, shapes: list[Shape]) -> None:
    """At the deploy point: each open run's history, for ``tests/histories/matrix/``."""
    if os.environ.get("RELAYKIT_RECORD_MATRIX") != "1":
        return
    HISTORIES.mkdir(parents=True, exist_ok=True)
    for shape in shapes:
        assert shape.handle is not None
        history = await client.get_workflow_handle(shape.handle.id).fetch_history()
        (HISTORIES / f"{shape.name}.json").write_text(history.to_json())


async def start(client: Client, rig: CrashRig, shapes: list[Shape]) -> None:
    server = rig.model_server
    for shape in shapes:
        server.script(model(rig, shape.name), shape.script)
        for other, steps in shape.scripts.items():
            server.script(model(rig, other), steps)
        shape.handle = await start_run(
            client,
            shape.agent,
            "go",
            task_queue=rig.task_queue,
            id=f"matrix-{shape.name}-{rig.model}",
            **shape.start,  # type: ignore[arg-type]
        )


async def park(rig: CrashRig, shape: Shape, hold: threading.Event, requests: int) -> None:
    """Pause the run at the turn boundary after its ``requests``-th model call (held)."""
    assert shape.handle is not None
    await wait_requests(rig.model_server, model(rig, shape.name), requests)
    await shape.handle.pause()
    hold.set()
    await until(shape.handle, "paused", "paused at a turn boundary")


async def test_every_definition_change_of_the_matrix_survives_a_deploy_with_runs_open(
    client: Client,
    rig: CrashRig,
) -> None:
    holds = {name: threading.Event() for name in ("renamed", "removed", "edits", "handoff")}
    holds.update({name: threading.Event() for name in ("chain", "approval_on", "limits")})
    holds["answer"] = threading.Event()
    worker_hold = threading.Event()
    desk_call = "transfer_to_matrix_handoff_desk"
    shapes = {
        s.name: s
        for s in [
            Shape(
                "renamed",
                [call("fetch", q="a", hold=holds["renamed"]), call("fetch", q="b"), text("done")],
            ),
            Shape(
                "removed",
                [call("note", q="a", hold=holds["removed"]), call("note", q="b"), text("done")],
            ),
            Shape(
                "edits",
                [call("lookup", q="a", hold=holds["edits"]), call("extra", q="b"), text("done")],
            ),
            Shape("handoff", [call(desk_call, hold=holds["handoff"]), text("never")]),
            Shape(
                "chain",
                [call("transfer_to_matrix_chain_desk"), call("nothing_here", hold=holds["chain"])],
                start={"continue_as_new_after_turns": 1},
            ),
            Shape(
                "approval_on",
                [
                    call("refund", q="1", hold=holds["approval_on"]),
                    call("refund", q="2"),
                    text("done"),
                ],
            ),
            Shape(
                "approval_off",
                [call("payout", q="1"), call("payout", q="2"), call("payout", q="3"), text("done")],
            ),
            Shape(
                "limits",
                [
                    call("probe", q="a"),
                    call("probe", q="a", hold=holds["limits"]),
                    call("probe", q="a"),
                    text("done"),
                ],
            ),
            Shape("timeout", [call("grant", q="1"), text("done")]),
            Shape("answer", [text("not json", hold=holds["answer"]), text("plain answer")]),
            Shape(
                "subagent",
                [
                    call("spawn_subagent", agent="matrix_sub_worker", prompt="dig"),
                    call("wait_subagents", timeout_seconds=600),
                    text("done"),
                ],
                scripts={"sub_worker": [call("dig", q="x", hold=worker_hold), text("dug")]},
            ),
        ]
    }
    v1 = rig.start_worker(MODULE, MATRIX_VERSION="1")
    await start(client, rig, list(shapes.values()))

    # --- bring every run to its point under v1 --------------------------------------------------
    await asyncio.gather(
        *(park(rig, shapes[name], holds[name], 1) for name in ("renamed", "removed", "edits")),
        park(rig, shapes["handoff"], holds["handoff"], 1),
        park(rig, shapes["chain"], holds["chain"], 2),
        park(rig, shapes["approval_on"], holds["approval_on"], 1),
        park(rig, shapes["limits"], holds["limits"], 2),
        park(rig, shapes["answer"], holds["answer"], 1),
    )
    off = shapes["approval_off"].handle
    assert off is not None
    await approve_next(off, "payout")  # payout 1: approved under v1

    async def second_payout_waits() -> bool:
        return len(await approvals_requested(off)) == 2

    await eventually(second_payout_waits, "payout 2 to wait for approval", timeout=START_AND_FINISH)
    timed = shapes["timeout"].handle
    assert timed is not None
    await until(timed, "waiting_approval", "grant to wait for approval")
    sub = shapes["subagent"].handle
    assert sub is not None
    await wait_requests(rig.model_server, model(rig, "sub_worker"), 1)  # the task's call, held
    await wait_requests(rig.model_server, model(rig, "subagent"), 2)  # the lead waits for it
    await record_histories(client, list(shapes.values()))

    # --- the deploy: v1 stops taking work and finishes what it holds; v2 takes over -------------
    v1.send_signal(signal.SIGTERM)
    rig.start_worker(MODULE, MATRIX_VERSION="2")
    worker_hold.set()  # v1 finishes the task's model call in flight, then exits
    assert await asyncio.to_thread(v1.wait, 60) == 0

    for name in (
        "renamed",
        "removed",
        "edits",
        "handoff",
        "chain",
        "approval_on",
        "limits",
        "answer",
    ):
        handle = shapes[name].handle
        assert handle is not None
        await handle.resume()
    on = shapes["approval_on"].handle
    assert on is not None
    await approve_next(on, "refund")  # refund 2: v2 asks for it
    await approve_next(off, "payout")  # payout 2: asked under v1, still waiting: it runs
    await approve_next(timed, "grant")  # waited without a time limit; v2's limit is for later calls

    results = {}
    for name in (
        "renamed",
        "removed",
        "edits",
        "approval_on",
        "approval_off",
        "limits",
        "subagent",
        "timeout",
        "answer",
    ):
        results[name] = await ended(shapes[name])
    failures: dict[str, RunFailed] = {}
    for name in ("handoff", "chain"):
        with pytest.raises(RunFailed) as failed:
            await ended(shapes[name])
        failures[name] = failed.value

    # --- what each run did ----------------------------------------------------------------------
    calls = rig.tool_calls()
    # renamed / removed: the recorded call replays; a later call of the gone tool is an error result
    assert results["renamed"].output == "done"
    first, later = tool_results(results["renamed"].transcript)
    assert first == "fetch a" and later.startswith("Unknown tool 'fetch'") and "find" in later
    assert results["removed"].output == "done"
    first, later = tool_results(results["removed"].transcript)
    assert first == "note a" and later.startswith("Unknown tool 'note'")
    # edits: v2's instructions and schema reach the model; the added tool runs
    assert tool_results(results["edits"].transcript) == ["lookup a", "extra b"]
    last = rig.model_server.requests(model(rig, "edits"))[-1]
    assert "instructions of v2" in last.system
    (lookup,) = [t for t in last.body["tools"] if t["function"]["name"] == "lookup"]
    assert "exact" in lookup["function"]["parameters"]["properties"]
    # handoff target removed, in this run and in an earlier run of the chain: typed failure
    for name in ("handoff", "chain"):
        assert failures[name].type == "UnknownAgent", failures[name]
        assert f"matrix_{name}_desk" in failures[name].message
    assert rig.model_server.request_count(model(rig, "handoff")) == 1
    assert rig.model_server.request_count(model(rig, "chain")) == 2
    # needs_approval on: the call made before ran unasked; the later one was asked for
    assert await approvals_requested(on) == ["refund"]
    assert tool_results(results["approval_on"].transcript) == ["refund 1", "refund 2"]
    # needs_approval off: the waiting call stayed asked for; the later one ran unasked
    assert await approvals_requested(off) == ["payout", "payout"]
    assert tool_results(results["approval_off"].transcript) == ["payout 1", "payout 2", "payout 3"]
    # approval_timeout added while the call waited: it waited on, without a timer, and ran
    assert tool_results(results["timeout"].transcript) == ["grant 1"]
    assert calls["grant v2 1"] == 1
    # the output type dropped while its rejection was being repaired: the repair stands
    assert results["answer"].output == "plain answer"
    repaired = rig.model_server.requests(model(rig, "answer"))[-1]
    assert "did not match the required JSON schema" in json.dumps(repaired.messages)
    assert rig.model_server.request_count(model(rig, "answer")) == 2
    # limits lowered: the two recorded runs stand; the third, live, meets v2's limit
    assert calls["probe v1 a"] == 2 and calls["probe v2 a"] == 0
    assert "already ran 2 times" in tool_results(results["limits"].transcript)[-1]
    # the subagent's agent removed while its task ran: the task ends UnknownAgent, reported
    assert results["subagent"].output == "done"
    assert "dig v1 x" not in calls and "dig v2 x" not in calls
    report = rig.model_server.requests(model(rig, "subagent"))[-1]
    assert "UnknownAgent" in json.dumps(report.messages) or "not defined" in json.dumps(
        report.messages
    )
    # the tools that ran before the deploy ran once
    for line in ("fetch v1 a", "note v1 a", "lookup v1 a", "refund v1 1", "payout v1 1"):
        assert calls[line] == 1, line
    assert calls["refund v2 2"] == 1 and calls["payout v2 2"] == 1 and calls["payout v2 3"] == 1

    assert await failed_tasks(client, rig.task_queue) == []


async def test_a_tool_removed_or_gated_while_its_call_runs_ends_in_a_result_after_a_crash(
    client: Client,
    rig: CrashRig,
) -> None:
    # The worker dies with the calls in flight; the replacement serves v2, which removed
    # slow_fetch and made slow_refund need approval. The removed tool's retry is answered as
    # gone at once; the gated one was decided unasked when it was made, so its retry just runs.
    shapes = [
        Shape("inflight", [call("slow_fetch", n=1), text("done")]),
        Shape("inflight_approval", [call("slow_refund", n=1), text("done")]),
    ]
    v1 = rig.start_worker(MODULE, MATRIX_VERSION="1")
    await start(client, rig, shapes)
    await eventually(
        lambda: (
            rig.tool_calls()["slow_fetch v1 1"] == 1 and rig.tool_calls()["slow_refund v1 1"] == 1
        ),
        "both calls to start",
    )
    await record_histories(client, shapes)
    await asyncio.to_thread(kill, v1)
    rig.start_worker(MODULE, MATRIX_VERSION="2")
    rig.release_file.touch()
    gone, gated = [s.handle for s in shapes]
    assert gone is not None and gated is not None
    gone_result = await asyncio.wait_for(gone.result(), START_AND_FINISH)
    gated_result = await asyncio.wait_for(gated.result(), START_AND_FINISH)

    assert gone_result.output == "done"
    (content,) = tool_results(gone_result.transcript)
    assert content.startswith("Tool 'slow_fetch' is not defined by the code this worker runs now")
    assert gated_result.output == "done"
    assert tool_results(gated_result.transcript) == ["slow_refund 1 done"]
    assert await approvals_requested(gated) == []
    assert rig.tool_calls()["slow_refund v2 1"] == 1
    assert await failed_tasks(client, rig.task_queue) == []


@pytest.mark.parametrize("version", ["1", "2"])
def test_the_recorded_matrix_histories_replay_with_either_version(
    version: str, rig: CrashRig
) -> None:
    # The runs as this release left them at the deploy point, replayed by the deploy gate with
    # the definitions before and after the changes: both must replay, so must the next release.
    files = sorted(HISTORIES.glob("*.json"))
    assert len(files) == 13, [f.name for f in files]
    done = relaykit_cli(
        rig, "replay-check", MODULE, "--histories", str(HISTORIES), MATRIX_VERSION=version
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1] == "replayed 13, failed 0, skipped 0"


@pytest.mark.wedge_expected(
    "the other application's worker refuses the run's task until the run's own worker is back",
    cause="WORKFLOW_WORKER_UNHANDLED_FAILURE",
    match="serves none of the agents of run",
)
async def test_a_worker_serving_none_of_a_runs_agents_leaves_the_run_to_its_own_workers(
    client: Client,
    rig: CrashRig,
) -> None:
    # Two applications on one task queue (the default one, say): a worker of the other one
    # gets a task of a run it can only replay with stand-ins. It fails that workflow task
    # instead of ending the run; the run's own worker, back, finishes it.
    hold = threading.Event()
    shape = Shape("renamed", [call("fetch", q="a", hold=hold), text("done")])
    own = rig.start_worker(MODULE, MATRIX_VERSION="1")
    await start(client, rig, [shape])
    await park(rig, shape, hold, 1)
    assert shape.handle is not None
    await asyncio.to_thread(stop, own)
    other = rig.start_worker("tests.crash_agents")
    await shape.handle.resume()

    async def refused() -> bool:
        return await stuck(client, shape.handle.id) is not None  # type: ignore[union-attr]

    # its task keeps failing (`relaykit runs --stuck` lists the run); the worker says why
    await eventually(refused, "the other worker to refuse the task", START_AND_FINISH)
    assert (await client.get_workflow_handle(shape.handle.id).describe()).status.name == "RUNNING"
    assert "serves none of the agents of run" in (rig.tmp / "worker-2.log").read_text()
    await asyncio.to_thread(stop, other)
    rig.start_worker(MODULE, MATRIX_VERSION="1")
    result = await ended(shape)
    assert result.output == "done"
