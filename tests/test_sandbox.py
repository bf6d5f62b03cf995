"""relaykit's workflow runner: Temporal's sandbox with less glue around it
(``relaykit/sandbox.py``). Runs behave as in the stock sandbox, restrictions included; every
payload gets the same serialization and storage context as there; and the glue is compiled a
handful of times, not once per activation and payload."""

from __future__ import annotations

import dataclasses
import datetime
import re
import uuid
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.converter import (
    ExternalStorage,
    PayloadCodec,
    SerializationContext,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    WithSerializationContext,
)
from temporalio.worker import Worker
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner

from relaykit.sandbox import (
    PASSTHROUGH,
    LeanSandboxRunner,
    compiled,
    lean_runner_supported,
    sandbox_runner,
)

TIMEOUT = timedelta(seconds=30)
PAD = "." * 300
"""Makes a payload larger than the storage threshold (a reference, smaller, stays in history)."""


@activity.defn(name="sandbox_test_echo")
async def echo(text: str) -> str:
    return text.upper().rstrip(".")


@workflow.defn(name="SandboxTestChild")
class SandboxTestChild:
    @workflow.run
    async def run(self, text: str) -> str:
        return await workflow.execute_activity(echo, text, start_to_close_timeout=TIMEOUT)


@workflow.defn(name="SandboxTestRun")
class SandboxTestRun:
    @workflow.run
    async def run(self, turns: int) -> list[str]:
        answers = []
        for turn in range(turns):
            answers.append(
                await workflow.execute_activity(
                    echo, f"turn {turn}{PAD}", start_to_close_timeout=TIMEOUT
                )
            )
        answers.append(
            await workflow.execute_local_activity(
                echo, "local" + PAD, start_to_close_timeout=TIMEOUT
            )
        )
        answers.append(
            await workflow.execute_child_workflow(
                SandboxTestChild.run, "child" + PAD, id=f"{workflow.info().workflow_id}-child"
            )
        )
        try:
            datetime.datetime.now()  # not deterministic: the sandbox refuses it
        except Exception as err:  # noqa: BLE001 - the refusal is what the test reads
            answers.append(type(err).__name__)
        return answers


SEEN: list[tuple[str, Any]] = []
"""(what asked, its context) in the order the worker's converter was given them."""


class RecordingCodec(PayloadCodec, WithSerializationContext):
    def __init__(self, context: SerializationContext | None = None) -> None:
        self.context = context

    def with_context(self, context: SerializationContext) -> RecordingCodec:
        return RecordingCodec(context)

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        SEEN.append(("encode", self.context))
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        SEEN.append(("decode", self.context))
        return list(payloads)


class RecordingDriver(StorageDriver):
    def __init__(self) -> None:
        self.kept: dict[str, Payload] = {}

    def name(self) -> str:
        return "sandbox-test"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        SEEN.append(("store", context.target))
        claims = []
        for payload in payloads:
            key = uuid.uuid4().hex
            self.kept[key] = payload
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return [self.kept[claim.claim_data["key"]] for claim in claims]


def _normalized(seen: list[tuple[str, Any]], ids: tuple[str, str]) -> list[tuple[str, str]]:
    """The contexts of one run, its ids (workflow, run, task queue) made comparable with
    another run's."""
    workflow_id, task_queue = ids
    ours = [(what, repr(context)) for what, context in seen if workflow_id in repr(context)]
    return sorted(
        (what, re.sub(r"run_id='[^']*'", "run_id='R'", text).replace(workflow_id, "W"))
        for what, text in ((what, text.replace(task_queue, "Q")) for what, text in ours)
    )


async def _run(
    client: Client, runner: SandboxedWorkflowRunner
) -> tuple[list[str], tuple[str, str]]:
    task_queue = f"sandbox-{uuid.uuid4().hex[:8]}"
    workflow_id = f"sandbox-{uuid.uuid4().hex[:8]}"
    async with Worker(
        client,
        task_queue=task_queue,
        workflows=[SandboxTestRun, SandboxTestChild],
        activities=[echo],
        workflow_runner=runner,
    ):
        result = await client.execute_workflow(
            SandboxTestRun.run, 3, id=workflow_id, task_queue=task_queue
        )
    return result, (workflow_id, task_queue)


def test_the_pinned_sdk_has_what_the_lean_runner_overrides() -> None:
    # Fails first when an SDK upgrade changes what the runner was read against: workers would
    # get the stock runner (correct, slower) without a word.
    assert lean_runner_supported()
    assert isinstance(sandbox_runner(), LeanSandboxRunner)


async def test_runs_in_the_lean_sandbox_behave_and_convert_as_in_the_stock_one(
    client: Client,
) -> None:
    config = client.config()
    converter = dataclasses.replace(
        config["data_converter"],
        payload_codec=RecordingCodec(),
        external_storage=ExternalStorage(drivers=[RecordingDriver()], payload_size_threshold=200),
    )
    recording = Client(client.service_client, namespace=client.namespace, data_converter=converter)
    stock = SandboxedWorkflowRunner(
        restrictions=SandboxedWorkflowRunner().restrictions.with_passthrough_modules(*PASSTHROUGH)
    )
    SEEN.clear()
    expected, stock_id = await _run(recording, stock)
    before = compiled.cache_info()
    result, lean_id = await _run(recording, sandbox_runner())
    after = compiled.cache_info()

    assert (
        result
        == expected
        == ["TURN 0", "TURN 1", "TURN 2", "LOCAL", "CHILD", "RestrictedWorkflowAccessError"]
    )
    lean, stock_seen = _normalized(SEEN, lean_id), _normalized(SEEN, stock_id)
    assert lean == stock_seen
    # activities, the local activity and the child each got their own context
    kinds = {text.split("(")[0] for _, text in lean}
    assert {"WorkflowSerializationContext", "ActivitySerializationContext"} <= kinds
    assert any("is_local=True" in text for _, text in lean)
    assert any("W-child" in text for what, text in lean if what == "store")
    # Dozens of executions of the glue, compiled at most once per text (the SDK has six).
    assert after.hits - before.hits >= 10
    assert after.misses - before.misses <= 6
