"""Proof across machines: worker processes that share no directory, only an S3 endpoint (moto's
S3 server on 127.0.0.1, speaking the real S3 protocol), serve many long runs through a rolling
restart of every worker without a single transcript miss."""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import boto3
import botocore.exceptions
import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import start_run
from relaykit.devserver import DevServer
from relaykit.storage import scope_for
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step, call, text
from relaykit.transcripts import TRANSCRIPT_MISSING

ROOT = Path(__file__).resolve().parents[1]
RUNS = 20
TURNS = 100
BUCKET = "relaykit-test"
AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "test-key",
    "AWS_SECRET_ACCESS_KEY": "test-secret",
    "AWS_REGION": "us-east-1",
}


@pytest.fixture(autouse=True)
def no_store_left_behind(tmp_path: Path) -> Iterator[None]:
    """Stores hold transcripts: remove each test's temporary folder when it ends."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def s3_endpoint(tmp_path: Path) -> Iterator[str]:
    """moto's S3 server in a process of its own (its request handling then competes with
    neither the scripted model server nor the test's client), with an empty bucket."""
    port = free_port()
    log = open(tmp_path / "moto.log", "wb")  # noqa: SIM115
    proc = subprocess.Popen(
        [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    endpoint = f"http://127.0.0.1:{port}"
    try:
        s3 = boto3.client("s3", endpoint_url=endpoint, **_boto_credentials())
        deadline = time.monotonic() + 60
        while True:
            try:
                s3.create_bucket(Bucket=BUCKET)
                break
            except botocore.exceptions.EndpointConnectionError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise
                time.sleep(0.1)  # the server process is starting: nothing to await but its port
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        log.close()


def _boto_credentials() -> dict[str, str]:
    return {
        "aws_access_key_id": AWS_ENV["AWS_ACCESS_KEY_ID"],
        "aws_secret_access_key": AWS_ENV["AWS_SECRET_ACCESS_KEY"],
        "region_name": AWS_ENV["AWS_REGION"],
    }


class Machines:
    """Worker processes, each in a directory of its own (they share no files)."""

    def __init__(self, tmp: Path, env: dict[str, str], task_queue: str) -> None:
        self.tmp, self.env, self.task_queue = tmp, env, task_queue
        self.started = 0
        self.processes: list[subprocess.Popen[bytes]] = []
        self.logs: list[IO[bytes]] = []
        self.homes: list[Path] = []

    def start(self) -> subprocess.Popen[bytes]:
        self.started += 1
        home = self.tmp / f"machine-{self.started}"
        home.mkdir()
        self.homes.append(home)
        log = open(home.with_suffix(".log"), "wb")  # noqa: SIM115
        self.logs.append(log)
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                "tests.store_agents",
                "--task-queue",
                self.task_queue,
            ],
            cwd=home,
            env=self.env,
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.processes.append(proc)
        return proc

    @staticmethod
    def stop(proc: subprocess.Popen[bytes]) -> None:
        """A deploy's graceful stop."""
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)

    def close(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        for log in self.logs:
            log.close()


def respond(request: ScriptedRequest) -> Step:
    """Step until the transcript the model sees holds TURNS - 1 tool results, then answer: a
    transcript rebuilt wrongly would change the count."""
    steps = sum(1 for m in request.messages if m["role"] == "tool")
    if steps < TURNS - 1:
        return call("step", n=steps + 1)
    return text(f"{request.last_user_text}: {steps} steps")


async def _history(client: Client, workflow_id: str) -> list:
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


def _bytes_per_model_turn(events: list) -> list[int]:
    sizes: list[int] = []
    for event in events:
        scheduled = event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        if (
            scheduled
            and event.activity_task_scheduled_event_attributes.activity_type.name
            == "relaykit.model_call"
        ):
            sizes.append(0)
        if sizes:
            sizes[-1] += event.ByteSize()
    return sizes[:-1]


def _transcript_misses(events: list) -> int:
    return sum(
        1
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_FAILED
        and e.activity_task_failed_event_attributes.failure.application_failure_info.type
        == TRANSCRIPT_MISSING
    )


@pytest.mark.slow
async def test_three_workers_sharing_only_s3_serve_twenty_long_runs_through_a_rolling_restart(
    client: Client,
    model_server: ScriptedModelServer,
    temporal_server: DevServer,
    s3_endpoint: str,
    tmp_path: Path,
) -> None:
    model = f"s3-{uuid.uuid4().hex[:10]}"
    model_server.respond(model, respond)
    task_queue = f"s3-{uuid.uuid4().hex[:10]}"
    store_url = f"s3://{BUCKET}/relaykit?endpoint={s3_endpoint}&allow_http=true"
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_", "AWS_"))
    }
    env.update(
        AWS_ENV,
        TEMPORAL_ADDRESS=temporal_server.address,
        TEMPORAL_NAMESPACE=temporal_server.namespace,
        RELAYKIT_STORE=store_url,
        STORE_MODEL_URL=model_server.base_url,
        STORE_MODEL_NAME=model,
        PYTHONPATH=str(ROOT),
        PYTHONUNBUFFERED="1",
    )
    machines = Machines(tmp_path, env, task_queue)
    try:
        live = [machines.start() for _ in range(3)]
        handles = [
            await start_run(
                client, "store_agent", f"job {i}", task_queue=task_queue, max_turns=TURNS + 5
            )
            for i in range(RUNS)
        ]
        # A rolling deploy: each worker in turn is replaced by a new process on a new machine,
        # while the runs are in the middle of their turns.
        for slot in range(3):
            target = (slot + 1) * RUNS * TURNS // 4
            await asyncio.to_thread(model_server.wait_for_requests, model, target, 600.0)
            replacement = machines.start()
            await asyncio.to_thread(Machines.stop, live[slot])
            live[slot] = replacement
        results = await asyncio.gather(*(h.result() for h in handles))
    finally:
        await asyncio.to_thread(machines.close)

    for i, result in enumerate(results):
        assert result.output == f"job {i}: {TURNS - 1} steps"
        assert result.turns == TURNS
        tools = [m.content for m in result.transcript if m.role == "tool"]
        assert tools == [f"step {n} done" for n in range(1, TURNS)]
    misses = 0
    for handle in handles:
        events = await _history(client, handle.id)
        misses += _transcript_misses(events)
        per_turn = _bytes_per_model_turn(events)
        early, late = statistics.median(per_turn[5:25]), statistics.median(per_turn[-20:])
        assert late <= 1.3 * early, (handle.id, early, late)
        assert max(per_turn[1:]) <= 3 * early, (handle.id, early, max(per_turn))  # no inline resend
    assert misses == 0
    # The workers kept nothing on their own disks; the bucket holds each run's chain.
    assert all(not (home / ".relaykit").exists() for home in machines.homes)
    s3 = boto3.client("s3", endpoint_url=s3_endpoint, **_boto_credentials())
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket=BUCKET, Prefix="relaykit/runs/")
    keys = [o["Key"] for page in pages for o in page.get("Contents", [])]
    for handle in handles:
        nodes = [k for k in keys if k.startswith(f"relaykit/runs/{scope_for(handle.id)}/t/")]
        assert len(nodes) >= TURNS
