"""What a definition hands to Temporal (timeouts, retry policies): every value either runs or
is refused where it is defined (``relaykit/schedule_options.py``).

Before, a tool defined with a negative timeout, or with a retry policy whose backoff coefficient
was under 1, was accepted, and each run that called it failed its workflow task
(``BadScheduleActivityAttributes: invalid StartToCloseTimeout``; the SDK's ``ValueError`` for
the policy), retried without end: a wedged run. A model's ``nan`` timeout did the same in
workflow code.
"""

from __future__ import annotations

import asyncio
import math
import re
from datetime import timedelta
from typing import Any

import pydantic
import pytest
from hypothesis import given
from hypothesis import strategies as st
from temporalio.client import Client
from temporalio.common import RetryPolicy

from relaykit import Agent, ConfigurationError, Handoff, MCPServer, start_run, tool
from relaykit.models.spec import ModelSpec
from relaykit.schedule_options import MAX_DURATION, duration, retry_policy
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.tools import Tool
from tests.support import scripted_model, serving

SECONDS = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True),
    st.integers(min_value=-(10**12), max_value=10**12),
)
TIMEDELTAS = st.timedeltas(min_value=timedelta(days=-10_000), max_value=timedelta(days=10_000))


@given(st.one_of(SECONDS, TIMEDELTAS), st.booleans())
def test_a_duration_is_in_range_or_refused_in_one_typed_error(value: Any, zero_ok: bool) -> None:
    try:
        got = duration(value, "timeout of x", zero="off" if zero_ok else None)
    except ConfigurationError as exc:
        assert "timeout of x is" in str(exc) and "365 days" in str(exc)
        seconds = value.total_seconds() if isinstance(value, timedelta) else value
        assert (
            not math.isfinite(seconds)
            or seconds < 0
            or seconds > MAX_DURATION.total_seconds()
            # under a microsecond is zero to a timedelta, and to Temporal no timeout at all
            or (timedelta(seconds=seconds) == timedelta(0) and not zero_ok)
        )
    else:
        assert timedelta(0) <= got <= MAX_DURATION
        assert got > timedelta(0) or zero_ok


@pytest.mark.parametrize("value", ["30", None, True, [1]])
def test_a_duration_that_is_not_a_number_is_refused(value: Any) -> None:
    with pytest.raises(ConfigurationError, match="timedelta or a number of seconds"):
        duration(value, "timeout of x")


def _define(**options: Any) -> Tool:
    @tool(**options)
    def notify(order_id: str) -> str:
        """Tell the customer.

        Args:
            order_id: The order.
        """
        return order_id

    assert isinstance(notify, Tool)
    return notify


@pytest.mark.parametrize(
    ("options", "said"),
    [
        ({"timeout": -5}, "timeout of @tool 'notify' is -5 s"),
        ({"timeout": float("nan")}, "timeout of @tool 'notify' is nan s"),
        ({"timeout": timedelta(days=400)}, "timeout of @tool 'notify' is 3.456e+07 s"),
        ({"heartbeat_timeout": -1}, "heartbeat_timeout of @tool 'notify' is -1 s"),
        ({"approval_timeout": 0}, "approval_timeout of @tool 'notify' is 0 s"),
        ({"approval_timeout": timedelta(seconds=-1)}, "approval_timeout of @tool 'notify'"),
    ],
)
def test_a_tool_timeout_no_run_can_schedule_is_refused_where_the_tool_is_defined(
    options: dict[str, Any], said: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        _define(**options)


def test_the_timeouts_a_tool_may_have() -> None:
    notify = _define(timeout=0, heartbeat_timeout=0, approval_timeout=timedelta(days=3))
    assert notify.timeout == timedelta(minutes=5)  # 0: the default, as before
    assert notify.heartbeat_timeout == timedelta(0)  # off
    assert notify.approval_timeout == timedelta(days=3)
    built = _define()
    with pytest.raises(ConfigurationError, match="timeout of tool 'notify' is 0 s"):
        Tool(
            name="notify",
            description="d",
            function=built.function,
            args_model=built.args_model,
            timeout=timedelta(0),  # a Tool built by hand gets no default
        )


def test_mcp_server_and_handoff_timeouts_are_checked_the_same_way() -> None:
    with pytest.raises(ConfigurationError, match="timeout of MCP server 'files' is -1 s"):
        MCPServer.stdio("files", ["x"], timeout=-1)
    with pytest.raises(ConfigurationError, match="list_timeout of MCP server 'files' is 0 s"):
        MCPServer.stdio("files", ["x"], list_timeout=0)
    server = MCPServer.http("files", "http://127.0.0.1:9/mcp", timeout=5, heartbeat_timeout=0)
    assert (server.timeout, server.heartbeat_timeout) == (timedelta(seconds=5), timedelta(0))
    with pytest.raises(ConfigurationError, match="heartbeat_timeout of on_handoff"):
        Handoff(Agent(name="billing"), heartbeat_timeout=float("inf"))


@pytest.mark.parametrize(
    ("policy", "said"),
    [
        (RetryPolicy(backoff_coefficient=0.5), "Backoff coefficient cannot be less than 1"),
        (RetryPolicy(backoff_coefficient=float("nan")), "backoff_coefficient nan"),
        (RetryPolicy(maximum_attempts=-1), "maximum_attempts -1"),
        (RetryPolicy(maximum_attempts=2**40), "maximum_attempts 1099511627776"),
        (RetryPolicy(initial_interval=timedelta(seconds=-1)), "initial_interval of retry"),
        (
            RetryPolicy(
                initial_interval=timedelta(seconds=9), maximum_interval=timedelta(seconds=1)
            ),
            "Maximum interval cannot be less than initial interval",
        ),
        (  # the SDK sends it, as one attempt; the mistake is still a mistake
            RetryPolicy(maximum_attempts=1, backoff_coefficient=0.5),
            "Backoff coefficient cannot be less than 1",
        ),
        ("3 attempts", "give a temporalio.common.RetryPolicy"),
    ],
)
def test_a_retry_policy_the_sdk_cannot_send_is_refused_where_the_tool_is_defined(
    policy: Any, said: str
) -> None:
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        _define(retry=policy)
    with pytest.raises(ConfigurationError, match="retry of MCP server 'files'"):
        MCPServer.stdio("files", ["x"], retry=policy)


def test_the_retry_policies_a_tool_may_have() -> None:
    for policy in (
        RetryPolicy(maximum_attempts=1),
        RetryPolicy(maximum_interval=timedelta(0)),  # 0: Temporal's default
        RetryPolicy(initial_interval=timedelta(0)),
    ):
        assert retry_policy(policy, "retry of x") is policy
        assert _define(retry=policy).retry is policy


@pytest.mark.parametrize("field", ["timeout_seconds", "heartbeat_timeout_seconds"])
@pytest.mark.parametrize(
    "value", [float("nan"), float("inf"), -1.0, MAX_DURATION.total_seconds() + 1]
)
def test_a_model_timeout_no_activity_can_hold_is_refused_where_the_model_is_defined(
    field: str, value: float
) -> None:
    with pytest.raises(pydantic.ValidationError, match=field):
        ModelSpec(name="m", **{field: value})


def test_the_timeouts_a_model_may_have() -> None:
    spec = ModelSpec(name="m", timeout_seconds=0.5, heartbeat_timeout_seconds=0)
    assert (spec.timeout_seconds, spec.heartbeat_timeout_seconds) == (0.5, 0)
    with pytest.raises(pydantic.ValidationError, match="timeout_seconds"):
        ModelSpec(name="m", timeout_seconds=0)


async def test_a_run_schedules_its_calls_with_the_longest_timeouts_a_definition_takes(
    client: Client, model_server: ScriptedModelServer
) -> None:
    """The bounds are what Temporal accepts: the largest accepted values schedule and run."""
    model = scripted_model(
        model_server, timeout_seconds=MAX_DURATION.total_seconds(), heartbeat_timeout_seconds=0
    )
    model_server.script(model.name, [call("notify", order_id="A1"), text("told them")])
    notify = _define(timeout=MAX_DURATION, heartbeat_timeout=MAX_DURATION)
    agent = Agent(name="longest_timeouts", model=model, tools=[notify])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "notify", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "told them"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("q" * 1001, "is 1001 bytes long (hint: at most 1000"),
        ("账" * 334, "is 1002 bytes long (hint: at most 1000"),
        ("/_sys/gpu", "Temporal reserves names starting with /_sys/"),
        (7, "a task queue name (a string)"),
    ],
)
def test_a_task_queue_the_server_refuses_is_refused_where_it_is_named(name: Any, said: str) -> None:
    """The server refused these in the workflow task that scheduled the call
    (``BadScheduleActivityAttributes: taskQueue length exceeds limit``, ``… reserved prefix
    /_sys/``), retried without end."""
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        _define(task_queue=name)
    with pytest.raises(ConfigurationError, match=re.escape(said)):
        MCPServer.stdio("files", ["x"], task_queue=name)
    # For a number, pydantic's own type check comes first.
    with pytest.raises(
        pydantic.ValidationError, match=re.escape(said) if isinstance(name, str) else "task_queue"
    ):
        ModelSpec(name="m", task_queue=name)


def test_the_task_queues_a_definition_may_name() -> None:
    for name in (None, "", "gpu-workers", "q" * 1000):
        assert _define(task_queue=name).task_queue == name
        assert ModelSpec(name="m", task_queue=name).task_queue == name
