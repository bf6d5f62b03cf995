"""Helpers shared by the tests: a scripted model of one's own, a worker on a fresh task queue,
and readers of a run's Temporal history."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from relaykit import Agent, ModelSpec, Worker
from relaykit.testing.scripted_server import ScriptedModelServer

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
