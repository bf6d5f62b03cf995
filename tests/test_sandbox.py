"""relaykit's workflow runner: Temporal's sandbox, with the SDK's glue compiled once per process
(``relaykit/sandbox.py``). Runs behave as in the stock sandbox, restrictions included, and the
glue is compiled a handful of times, not once per activation and payload."""

from __future__ import annotations

import datetime
import uuid
from datetime import timedelta

from temporalio import activity, workflow
from temporalio.client import Client
from temporalio.worker import Worker

from relaykit.sandbox import (
    CompiledSandboxRunner,
    compiled,
    compiled_runner_supported,
    sandbox_runner,
)


@activity.defn(name="sandbox_test_echo")
async def echo(text: str) -> str:
    return text.upper()


@workflow.defn(name="SandboxTestRun")
class SandboxTestRun:
    @workflow.run
    async def run(self, turns: int) -> list[str]:
        answers = []
        for turn in range(turns):
            answers.append(
                await workflow.execute_activity(
                    echo, f"turn {turn}", start_to_close_timeout=timedelta(seconds=30)
                )
            )
        try:
            datetime.datetime.now()  # not deterministic: the sandbox refuses it
        except Exception as err:  # noqa: BLE001 - the refusal is what the test reads
            answers.append(type(err).__name__)
        return answers


def test_the_pinned_sdk_has_what_the_compiled_runner_overrides() -> None:
    # Fails first when an SDK upgrade drops the private method: the runner would fall back to
    # the stock one and workers would lose the saving without a word.
    assert compiled_runner_supported()
    assert isinstance(sandbox_runner(), CompiledSandboxRunner)


async def test_runs_in_the_compiled_sandbox_behave_as_in_the_stock_one(client: Client) -> None:
    task_queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    before = compiled.cache_info()
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[SandboxTestRun],
        activities=[echo],
        workflow_runner=sandbox_runner(),
    ):
        result = await client.execute_workflow(
            SandboxTestRun.run, 5, id=f"sandbox-{uuid.uuid4().hex[:8]}", task_queue=task_queue
        )
    after = compiled.cache_info()

    assert result == [f"TURN {turn}" for turn in range(5)] + ["RestrictedWorkflowAccessError"]
    # Six workflow tasks, each an activation and a few payload passes: dozens of executions of
    # the glue, compiled at most once per text (the SDK has six).
    assert after.hits - before.hits >= 20
    assert after.misses - before.misses <= 6
