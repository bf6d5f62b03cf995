"""``python -m bench.sdk_update_order``: an update that a replay applies out of order, in bare
Temporal (no relaykit), found by ``bench.chaos`` (seed 1072; bench/README.md, "An update and a
query while a worker is down").

The sequence, each step a process or a request a fleet sees every day:

1. a worker runs a workflow that waits for an activity, and is killed (its sticky queue stays);
2. a new worker starts, and a person's tool queries the workflow;
3. the person sends an update; the workflow task it needs waits on the dead worker's sticky
   queue until that queue's schedule-to-start timeout;
4. the activity completes meanwhile.

The query reaches the new worker, which replays the history, activity result included, and the
workflow goes on to schedule its next activity. The update arrives with the next workflow task,
in an activation of its own, so the task's commands are the next activity, then the update's
acceptance. A replay of that history gets both in one activation, where the SDK applies the
update first: ``Nondeterminism error: Update machine does not handle this event`` at every
attempt. The script runs the sequence ``--rounds`` times and replays each history with
Temporal's ``Replayer``.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import signal
import subprocess
import sys
import tempfile
import uuid
from datetime import timedelta
from pathlib import Path

from temporalio import activity, workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import Replayer, Worker

STEPS = 3
STICKY_TIMEOUT = timedelta(seconds=3)


@activity.defn
async def step(release: str) -> int:
    """Waits until the driver creates ``release`` (it completes the activity at a chosen time)."""
    while not os.path.exists(release):
        await asyncio.sleep(0.05)
    return 1


@workflow.defn
class Steps:
    def __init__(self) -> None:
        self.bumps = 0

    @workflow.run
    async def run(self, folder: str) -> int:
        done = 0
        for n in range(STEPS):
            done += await workflow.execute_activity(
                step,
                f"{folder}/release-{n}",
                task_queue="acts",
                start_to_close_timeout=timedelta(seconds=60),
            )
        return done + self.bumps

    @workflow.query
    def seen(self) -> int:
        return self.bumps

    @workflow.update
    def bump(self, by: int) -> int:
        self.bumps += by
        return self.bumps


async def serve(address: str, kind: str) -> None:
    client = await Client.connect(address)
    if kind == "workflows":
        worker = Worker(
            client,
            task_queue="steps",
            workflows=[Steps],
            sticky_queue_schedule_to_start_timeout=STICKY_TIMEOUT,
        )
    else:
        worker = Worker(client, task_queue="acts", activities=[step])
    await worker.run()


def spawn(address: str, kind: str) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "bench.sdk_update_order", "--serve", kind, "--address", address]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def keep_querying(handle: WorkflowHandle[Steps, int]) -> None:
    while True:
        try:  # longer than the sticky queue's timeout: the server then asks another worker
            await asyncio.wait_for(handle.query(Steps.seen), 10)
        except Exception:  # noqa: BLE001 - a query may time out while no worker answers
            pass
        await asyncio.sleep(0.05)


async def misorder(
    client: Client, address: str, folder: str, processes: list[subprocess.Popen[bytes]]
) -> WorkflowHandle[Steps, int]:
    """Steps 1-4 above: the workflow, once its update completed, with steps left to release
    (``{folder}/release-<n>``); its history then holds the task whose commands are out of
    order. The worker processes it starts are appended to ``processes`` (the caller kills them).
    """
    processes.append(spawn(address, "activities"))
    first = spawn(address, "workflows")
    processes.append(first)
    await asyncio.sleep(2)  # both workers polling
    handle = await client.start_workflow(
        Steps.run, folder, id=f"update-order-{uuid.uuid4().hex[:8]}", task_queue="steps"
    )
    await asyncio.sleep(1.5)  # the first activity runs
    first.send_signal(signal.SIGKILL)
    first.wait()
    processes.append(spawn(address, "workflows"))
    await asyncio.sleep(1.0)
    queries = [asyncio.create_task(keep_querying(handle)) for _ in range(3)]
    try:
        await asyncio.sleep(0.5)
        update = asyncio.create_task(handle.execute_update(Steps.bump, 5))
        await asyncio.sleep(0.3)
        Path(folder, "release-0").touch()
        await asyncio.wait_for(update, 60)
    finally:
        for task in queries:
            task.cancel()
    return handle


async def one_round(client: Client, address: str) -> str:
    folder = tempfile.mkdtemp(prefix="update-order-")
    processes: list[subprocess.Popen[bytes]] = []
    try:
        handle = await misorder(client, address, folder, processes)
        for n in range(1, STEPS):
            Path(folder, f"release-{n}").touch()
        await asyncio.wait_for(handle.result(), 60)
        history = await handle.fetch_history()
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
    kinds = [e.event_type for e in history.events]
    accepted = kinds.index(EventType.EVENT_TYPE_WORKFLOW_EXECUTION_UPDATE_ACCEPTED)
    scheduled_before = kinds[accepted - 1] == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    replayed = await Replayer(workflows=[Steps]).replay_workflow(
        history, raise_on_replay_failure=False
    )
    order = "activity, then update" if scheduled_before else "update first"
    failure = replayed.replay_failure
    found = None if failure is None else re.search(r"\[TMPRL\d+\][^\"]*", str(failure))
    cause = "ok" if failure is None else found.group(0) if found else str(failure)[:160]
    return f"{order}; replay: {cause}"


async def main(rounds: int) -> None:
    from relaykit.devserver import DevServer

    async with DevServer(port=0, headless=True, in_memory=True) as server:
        client = await Client.connect(server.address)
        for n in range(rounds):
            print(f"round {n + 1}: {await one_round(client, server.address)}", flush=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--serve", choices=["workflows", "activities"], help=argparse.SUPPRESS)
    parser.add_argument("--address", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve(args.address, args.serve))
    else:
        asyncio.run(main(args.rounds))
