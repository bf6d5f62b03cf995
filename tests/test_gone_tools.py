"""A worker asked to run a tool its code does not define (a run's call scheduled before a
deploy renamed or removed it) answers at once, instead of failing the attempt as not registered
until the call's retry policy gives up. The deploy matrix shows it end to end
(``tests/test_deploy_matrix.py``); these pin the answers for each kind of input."""

from __future__ import annotations

import dataclasses
from datetime import UTC, datetime

import pytest
from temporalio.common import RawValue
from temporalio.converter import default
from temporalio.exceptions import ApplicationError
from temporalio.testing import ActivityEnvironment

from relaykit.activities.gone_tools import answer_gone
from relaykit.tools import ATTEMPT_CLAIM_KEY, ToolInvocation


def environment(kind: str, heartbeat: tuple[object, ...] = ()) -> ActivityEnvironment:
    env = ActivityEnvironment()
    env.info = dataclasses.replace(env.info, activity_type=kind, heartbeat_details=list(heartbeat))
    return env


def sent(**fields: object) -> list[RawValue]:
    invocation = ToolInvocation(call_id="c1", arguments="{}", **fields)  # type: ignore[arg-type]
    return [RawValue(default().payload_converter.to_payload(invocation.model_dump(mode="json")))]


async def test_a_call_of_a_gone_tool_is_an_error_result_saying_it_did_not_run() -> None:
    outcome = await environment("lookup").run(answer_gone, "lookup", sent(effect="read"))
    assert outcome["is_error"] is True
    assert outcome["content"].startswith("Tool 'lookup' is not defined by the code this worker")
    assert "was not run" in outcome["content"]


async def test_a_lost_write_of_a_gone_tool_keeps_its_unknown_outcome() -> None:
    started = {
        ATTEMPT_CLAIM_KEY: {
            "attempt": 1,
            "started_at": datetime.now(UTC).isoformat(),
            "state": "started",
        }
    }
    env = environment("refund", (started,))
    with pytest.raises(ApplicationError) as raised:
        await env.run(answer_gone, "refund", sent(effect="write"))
    assert raised.value.type == "ToolOutcomeUnknown"


@pytest.mark.parametrize("kind", ["relaykit.model_call", "mcp:docs/search"])
async def test_relaykit_and_mcp_activity_types_still_fail_as_not_registered(kind: str) -> None:
    with pytest.raises(ApplicationError) as raised:
        await environment(kind).run(answer_gone, kind, sent())
    assert raised.value.type == "NotFoundError" and raised.value.non_retryable
