"""Crash recovery, the product: a worker process SIGKILLed at chosen points of a run, or the
Temporal server restarted on its SQLite file, and the run still completes with the right result
without repeating work that had finished.

The worker runs as a separate process (``python -m relaykit.cli worker tests.crash_agents``) so
it can really die. Counting is done outside it: model calls at the scripted model server (per
model name), tool executions in a file every tool invocation appends to.

The guarantee under test: every model call and tool call that had *completed* before the kill
runs exactly once over the whole run. The call that was *in flight* when the worker died runs
again on the new worker (at-least-once for that one call) when it is a model call or a ``"read"``
or ``"idempotent"`` tool, after its heartbeat timeout (5 s for model calls, 1 s for the slow tool
here, 10 s for tools with default settings); a ``"write"`` tool (the default) is not run again and
the model reads an unknown outcome (``tests/test_tool_effects.py``).

A SIGKILLed worker cannot tell the server it is gone, so the server keeps offering the run's next
workflow task to that worker's sticky queue until the sticky schedule-to-start timeout (3 s on
relaykit workers) passes: a real hard crash costs that once. Most tests reset stickiness right
after each kill, as a graceful worker shutdown does, so that they measure recovery rather than
that timer; the default-settings test does not.
"""

from __future__ import annotations

import asyncio
import collections
import os
import signal
import subprocess
import sys
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

import pytest
from temporalio.api.common.v1 import WorkflowExecution
from temporalio.api.workflowservice.v1 import ResetStickyTaskQueueRequest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit import RunHandle, get_run, start_run
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import eventually
from tests.wedge import wedges_on

REPO_ROOT = Path(__file__).resolve().parent.parent
AGENT = "crash_agent"
START_AND_FINISH = 60.0
"""Generous: a new worker process needs seconds to start on a loaded machine (15-20 s seen on
2 shared cores), and the waits here only bound a failure; a run recovering through the 5-minute
start-to-close timeout still misses them by far."""


@dataclass
class CrashRig:
    """One test's worker processes, model name, task queue and tool log."""

    address: str
    model_server: ScriptedModelServer
    tmp: Path
    model: str = field(default_factory=lambda: f"crash-{uuid.uuid4().hex[:10]}")
    task_queue: str = field(default_factory=lambda: f"crash-{uuid.uuid4().hex[:10]}")
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)

    @property
    def tool_log(self) -> Path:
        return self.tmp / "tools.log"

    @property
    def release_file(self) -> Path:
        return self.tmp / "release"

    def environment(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
        env.update(
            TEMPORAL_ADDRESS=self.address,
            TEMPORAL_NAMESPACE="default",
            CRASH_MODEL_URL=self.model_server.base_url,
            CRASH_MODEL_NAME=self.model,
            CRASH_TOOL_LOG=str(self.tool_log),
            CRASH_RELEASE_FILE=str(self.release_file),
            RELAYKIT_STORE=(self.tmp / "store").as_uri(),  # not the repository's .relaykit/
            PYTHONUNBUFFERED="1",
            # the workers' shared transcript store: in the test's temp dir, not the checkout
            RELAYKIT_TRANSCRIPT_DIR=str(self.tmp / "transcripts"),
        )
        return env

    def start_worker(
        self, module: str = "tests.crash_agents", **env: str
    ) -> subprocess.Popen[bytes]:
        log = open(self.tmp / f"worker-{len(self.processes) + 1}.log", "wb")  # noqa: SIM115
        self.logs.append(log)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                module,
                "--task-queue",
                self.task_queue,
            ],
            cwd=REPO_ROOT,
            env={**self.environment(), **env},
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(proc)
        return proc

    def tool_calls(self) -> collections.Counter[str]:
        if not self.tool_log.exists():
            return collections.Counter()
        return collections.Counter(self.tool_log.read_text().splitlines())

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in self.logs:
            log.close()


def kill(proc: subprocess.Popen[bytes]) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=10)


async def forget_sticky_worker(client: Client, handle: RunHandle) -> None:
    """What a graceful shutdown would have done (see the module docstring)."""
    await client.workflow_service.reset_sticky_task_queue(
        ResetStickyTaskQueueRequest(
            namespace=client.namespace, execution=WorkflowExecution(workflow_id=handle.id)
        )
    )


async def wait_requests(server: ScriptedModelServer, model: str, n: int) -> None:
    await asyncio.to_thread(server.wait_for_requests, model, n, 60.0)


@asynccontextmanager
async def crash_rig(
    address: str, model_server: ScriptedModelServer, tmp_path: Path
) -> AsyncIterator[CrashRig]:
    rig = CrashRig(address=address, model_server=model_server, tmp=tmp_path)
    try:
        yield rig
    finally:
        await asyncio.to_thread(rig.close)


@pytest.fixture
async def rig(
    temporal_server: DevServer, model_server: ScriptedModelServer, tmp_path: Path
) -> AsyncIterator[CrashRig]:
    async with crash_rig(temporal_server.address, model_server, tmp_path) as made:
        yield made


def never() -> threading.Event:
    """A hold that is never released: the worker waiting on it dies first (releasing it later
    would only write to a dead socket)."""
    return threading.Event()


# --- worker crashes -----------------------------------------------------------------------------


async def test_worker_killed_during_a_model_call_resumes_without_repeating_finished_calls(
    client: Client, rig: CrashRig
) -> None:
    # Killed while the second model call waits for its answer: that call is retried on the new
    # worker; the first model call and the tool call are not repeated.
    server = rig.model_server
    server.script(rig.model, [call("quick", n=1), text("lost", hold=never()), text("done")])
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
    await wait_requests(server, rig.model, 2)
    kill(first)
    await forget_sticky_worker(client, handle)
    rig.start_worker()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert result.usage.requests == 2  # the lost answer never reached the run
    requests = server.requests(rig.model)
    assert len(requests) == 3  # the first call once, the call in flight twice
    assert requests[2].messages == requests[1].messages
    assert rig.tool_calls() == {"quick 1": 1}


async def test_worker_killed_during_a_tool_call_resumes_without_repeating_finished_calls(
    client: Client, rig: CrashRig
) -> None:
    # Killed while a heartbeating tool works: only that tool call runs again.
    server = rig.model_server
    server.script(rig.model, [call("quick", n=1), call("slow_step", n=2), text("done")])
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
    await eventually(lambda: rig.tool_calls()["slow_step 2"] == 1, "the slow tool to start")
    kill(first)
    rig.release_file.touch()  # the retried attempt finishes at once
    await forget_sticky_worker(client, handle)
    rig.start_worker()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert [m.content for m in result.transcript if m.role == "tool"] == [
        "quick 1",
        "slow 2 done",
    ]
    assert server.request_count(rig.model) == 3
    assert rig.tool_calls() == {"quick 1": 1, "slow_step 2": 2}  # in flight: at-least-once


async def test_worker_killed_while_waiting_for_an_approval_keeps_the_pending_approval(
    client: Client, rig: CrashRig
) -> None:
    # Nothing is in flight while a run waits for a person: the new worker rebuilds the pending
    # approval from history, takes the answer, and nothing runs twice.
    server = rig.model_server
    server.script(
        rig.model,
        [call("quick", n=1), call("refund", id="call_crash_refund", amount=5), text("done")],
    )
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)

    async def waiting() -> bool:
        return (await handle.state()).status == "waiting_approval"

    await eventually(waiting, "the approval request")
    kill(first)
    await forget_sticky_worker(client, handle)
    rig.start_worker()
    (pending,) = await handle.pending_approvals()  # answered by the new worker, from history
    assert (pending.call_id, pending.tool) == ("call_crash_refund", "refund")
    await handle.approve("call_crash_refund")
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert server.request_count(rig.model) == 3
    assert rig.tool_calls() == {"quick 1": 1, "refund 5": 1}


async def test_worker_killed_between_turns_resumes_at_the_turn_boundary(
    client: Client, rig: CrashRig
) -> None:
    # A run paused at a turn boundary has nothing in flight; after the kill, resume on the new
    # worker continues from there.
    server = rig.model_server
    hold = threading.Event()
    server.script(rig.model, [call("quick", n=1, hold=hold), text("done")])
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
    await wait_requests(server, rig.model, 1)
    await handle.pause()
    hold.set()

    async def paused() -> bool:
        return (await handle.state()).status == "paused"

    await eventually(paused, "the pause at the turn boundary")
    kill(first)
    await forget_sticky_worker(client, handle)
    rig.start_worker()
    await handle.resume("carry on")
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert server.request_count(rig.model) == 2
    assert server.requests(rig.model)[1].last_user_text == "carry on"
    assert rig.tool_calls() == {"quick 1": 1}


async def test_worker_killed_during_a_default_tool_ends_its_call_within_seconds_without_help(
    client: Client, rig: CrashRig
) -> None:
    # Default tool settings, no reset of stickiness: the tool's automatic heartbeats stop with
    # the worker, its heartbeat timeout (10 s) frees the call and the short sticky timeout
    # frees the run's next step. Before, this took the tool's 5-minute start-to-close timeout.
    # A default tool is a "write": the next attempt does not run it again, the model reads
    # that its outcome is unknown (tests/test_tool_effects.py has each effect).
    server = rig.model_server
    server.script(rig.model, [call("quick", n=1), call("until_released", n=2), text("done")])
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
    await eventually(lambda: rig.tool_calls()["until_released 2"] == 1, "the tool to start")
    kill(first)
    rig.release_file.touch()
    rig.start_worker()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH + 10)
    assert result.output == "done"
    assert server.request_count(rig.model) == 3
    assert rig.tool_calls() == {"quick 1": 1, "until_released 2": 1}  # in flight: not repeated
    lost = [m for m in result.transcript if m.role == "tool"][1]
    assert lost.is_error and "unknown outcome" in lost.content


async def test_sigterm_during_a_tool_call_lets_it_finish_and_a_new_worker_completes_the_run(
    client: Client, rig: CrashRig
) -> None:
    # A rolling restart: SIGTERM while a tool works, a new worker started at once. The old
    # worker takes no new work, finishes the call, exits cleanly; nothing runs twice.
    server = rig.model_server
    server.script(rig.model, [call("steady", n=1), call("quick", n=2), text("done")])
    first = rig.start_worker()
    handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
    await eventually(lambda: rig.tool_calls()["steady 1"] == 1, "the tool to start")
    first.send_signal(signal.SIGTERM)
    rig.start_worker()
    result = await asyncio.wait_for(handle.result(), timeout=START_AND_FINISH)
    assert result.output == "done"
    assert await asyncio.to_thread(first.wait, 30) == 0
    assert rig.tool_calls() == {"steady 1": 1, "steady-done 1": 1, "quick 2": 1}
    assert server.request_count(rig.model) == 3
    assert [m.content for m in result.transcript if m.role == "tool"] == [
        "steady 1 done",
        "quick 2",
    ]
    log = (rig.tmp / "worker-1.log").read_text()
    assert "stopping: no new work" in log and "worker stopped" in log


# --- Temporal server restart --------------------------------------------------------------------


async def test_temporal_server_restart_on_its_database_file_keeps_the_run(
    model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The server stops mid-run (during a held model call) and comes back on the same port and
    # SQLite file; the worker reconnects and the run completes. The model call in flight may be
    # retried if its completion could not be reported (at-least-once for that call).
    data_dir = tmp_path / "temporal"
    hold = threading.Event()
    first_server = DevServer(port=0, headless=True, data_dir=data_dir)
    second_server: DevServer | None = None
    try:
        await asyncio.to_thread(first_server.start)
        async with crash_rig(first_server.address, model_server, tmp_path) as rig:
            model_server.script(
                rig.model, [call("quick", n=1), text("done", hold=hold), text("done")]
            )
            client = await Client.connect(
                first_server.address, data_converter=pydantic_data_converter
            )
            rig.start_worker()
            handle = await start_run(client, AGENT, "go", task_queue=rig.task_queue)
            await wait_requests(model_server, rig.model, 2)
            await asyncio.to_thread(first_server.stop)
            second_server = DevServer(port=first_server.port, headless=True, data_dir=data_dir)
            await asyncio.to_thread(second_server.start)
            hold.set()
            client = await Client.connect(
                second_server.address, data_converter=pydantic_data_converter
            )
            result = await asyncio.wait_for(
                get_run(client, handle.id).result(), timeout=START_AND_FINISH
            )
            wedged = await wedges_on(second_server.address)
    finally:
        hold.set()
        for server in (first_server, second_server):
            if server is not None:
                await asyncio.to_thread(server.stop)
    assert result.output == "done"
    assert wedged == []
    assert rig.tool_calls() == {"quick 1": 1}
    assert model_server.request_count(rig.model) in (2, 3)
