"""The wedge detector (``tests/wedge.py``) finds a workflow task failure, and only a declaration
of that cause and message excuses it."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from temporalio import workflow
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle
from temporalio.worker import UnsandboxedWorkflowRunner, Worker

from tests.wedge import Expected, Wedge, find_wedges, started_since, verdict

PROBE_MESSAGE = "probe wedged on purpose"


@workflow.defn(name="WedgeDetectorProbe")
class Probe:
    """Workflow code that raises: every workflow task fails, the run stays RUNNING."""

    @workflow.run
    async def run(self) -> None:
        raise RuntimeError(PROBE_MESSAGE)


async def _wedge_a_run(client: Client) -> tuple[datetime, WorkflowHandle[Probe, None]]:
    since = datetime.now(UTC)
    task_queue = f"wedge-probe-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[Probe],
        workflow_runner=UnsandboxedWorkflowRunner(),
    ):
        handle = await client.start_workflow(Probe.run, id=task_queue, task_queue=task_queue)
        for _ in range(300):
            events = [e.event_type async for e in handle.fetch_history_events()]
            if EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED in events:
                break
            await asyncio.sleep(0.1)
    return since, handle


@pytest.mark.wedge_expected(
    "the probe raises from workflow code",
    cause="WORKFLOW_WORKER_UNHANDLED_FAILURE",
    match=PROBE_MESSAGE,
)
async def test_a_workflow_task_failure_is_reported_unless_the_test_declares_it(
    client: Client,
) -> None:
    # This test passes only because its marker excuses the probe's failure: the detector's
    # own check after the test sees the same wedge as the direct call below.
    since, handle = await _wedge_a_run(client)
    try:
        wedges, still_open = await find_wedges(client, await started_since(client, since))
    finally:
        await handle.terminate("the probe has shown its wedge")
    assert [(w.workflow_id, w.cause) for w in wedges] == [
        (handle.id, "WORKFLOW_WORKER_UNHANDLED_FAILURE")
    ]
    assert PROBE_MESSAGE in wedges[0].message
    assert [e.workflow_id for e in still_open] == [handle.id]
    assert verdict([], wedges, final=True) == [f"workflow task failed: {wedges[0]}"]


NON_DETERMINISM = Wedge(
    namespace="default",
    workflow_id="run-1",
    run_id="r",
    workflow_type="AgentRun",
    cause="NON_DETERMINISTIC_ERROR",
    message="[TMPRL1100] Nondeterminism error: No command scheduled for event",
)


def declared(
    cause: str | tuple[str, ...] = (), match: str | None = None, strict: bool = True
) -> Expected:
    causes = frozenset([cause] if isinstance(cause, str) else cause)
    return Expected("a breaking deploy", causes, match, strict)


def test_a_declaration_excuses_only_its_cause_and_message() -> None:
    assert (
        verdict([declared("NON_DETERMINISTIC_ERROR", "No command")], [NON_DETERMINISM], final=True)
        == []
    )
    assert verdict([declared()], [NON_DETERMINISM], final=True) == []
    for other in (
        declared("WORKFLOW_WORKER_UNHANDLED_FAILURE"),
        declared("NON_DETERMINISTIC_ERROR", match="serves none of the agents"),
    ):
        assert verdict([other], [NON_DETERMINISM], final=False) == [
            f"workflow task failed: {NON_DETERMINISM}"
        ]


def test_a_strict_declaration_of_a_wedge_that_never_happened_fails_the_test() -> None:
    assert verdict([declared("NON_DETERMINISTIC_ERROR")], [], final=True) == [
        "declared wedge did not happen: a breaking deploy"
        " (cause ['NON_DETERMINISTIC_ERROR'], match None)"
    ]
    assert verdict([declared("NON_DETERMINISTIC_ERROR", strict=False)], [], final=True) == []
