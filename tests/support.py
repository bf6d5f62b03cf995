"""Helpers shared by the tests: a scripted model of one's own, a worker on a fresh task queue,
readers of a run's Temporal history, polling, and the CLI in a subprocess."""

from __future__ import annotations

import asyncio
import inspect
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from relaykit import Agent, ModelSpec, Worker
from relaykit.testing.scripted_server import ScriptedModelServer

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

_transcript_dir: list[str] = []


def transcript_dir() -> str:
    """Where test workers keep transcript prefixes (never the repository's .relaykit/). Made
    on first use: test modules are also imported inside the workflow sandbox, which forbids
    file-system calls at import time."""
    if not _transcript_dir:
        import atexit
        import shutil

        _transcript_dir.append(tempfile.mkdtemp(prefix="relaykit-test-transcripts-"))
        atexit.register(shutil.rmtree, _transcript_dir[0], ignore_errors=True)  # leave no store
    return _transcript_dir[0]


def remove_transcript_dir() -> None:
    """Delete the session's transcript directory (the session fixture in conftest calls it at
    the end, so no test run leaves megabytes in the temp folder)."""
    while _transcript_dir:
        shutil.rmtree(_transcript_dir.pop(), ignore_errors=True)


def scripted_model(
    server: ScriptedModelServer, provider: str = "openai", **options: Any
) -> ModelSpec:
    """A model name no other test uses, served by the scripted server."""
    name = f"m-{uuid.uuid4().hex[:10]}"
    base = f"{server.base_url}/v1" if provider == "openai" else server.base_url
    return ModelSpec(provider=provider, name=name, base_url=base, **options)  # type: ignore[arg-type]


@asynccontextmanager
async def serving(
    client: Client, agents: Agent | Sequence[Agent], **options: Any
) -> AsyncIterator[Worker]:
    """A relaykit worker on a task queue of its own, for the duration of the block."""
    options.setdefault("task_queue", f"tq-{uuid.uuid4().hex[:10]}")
    options.setdefault("transcript_dir", transcript_dir())
    async with Worker(client, agents, **options) as worker:
        yield worker


async def new_namespace(client: Client, prefix: str) -> Client:
    """A client of a fresh namespace (one day's retention) on ``client``'s server, sharing its
    connection and data converter. The namespace reaches the frontend a moment later: callers
    retry their first request on it."""
    from datetime import timedelta

    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest

    namespace = f"{prefix}-{uuid.uuid4().hex[:8]}"
    retention = Duration(seconds=int(timedelta(days=1).total_seconds()))
    await client.workflow_service.register_namespace(
        RegisterNamespaceRequest(namespace=namespace, workflow_execution_retention_period=retention)
    )
    return Client(client.service_client, namespace=namespace, data_converter=client.data_converter)


async def history_events(handle: WorkflowHandle[Any, Any]) -> list[Any]:
    return [event async for event in handle.fetch_history_events()]


async def scheduled_activities(handle: WorkflowHandle[Any, Any]) -> list[str]:
    """Activity types in the order the run scheduled them."""
    return [
        e.activity_task_scheduled_event_attributes.activity_type.name
        for e in await history_events(handle)
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    ]


async def activity_summaries(handle: WorkflowHandle[Any, Any], client: Client) -> list[str]:
    summaries = []
    for e in await history_events(handle):
        if (
            e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
            and e.user_metadata.HasField("summary")
        ):
            summaries.append(await client.data_converter.decode([e.user_metadata.summary]))
    return [s[0] for s in summaries]


async def eventually(
    check: Callable[[], Awaitable[Any] | Any], what: str, timeout: float = 30.0, every: float = 0.05
) -> Any:
    """Poll ``check`` until it returns something truthy, and return that.

    For state nothing notifies a test of: a query, a history read, a visibility listing (which
    is eventually consistent). The deadline is generous because a loaded machine (tests run in
    parallel) slows every poll; a check that succeeds returns at once whatever the deadline."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(every)


async def cli(*args: str, address: str) -> tuple[int, str, str]:
    """``relaykit ARGS`` in a subprocess against the test server: (exit code, stdout, stderr).

    A subprocess, not typer's runner, so the test sees what a person's shell does (exit codes,
    both streams, no state shared with the test's process)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TEMPORAL_")}
    env.update(TEMPORAL_ADDRESS=address, TEMPORAL_NAMESPACE="default", NO_COLOR="1", COLUMNS="300")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relaykit.cli",
        *args,
        cwd=REPO_ROOT,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()
