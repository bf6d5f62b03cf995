"""The durations a definition hands to Temporal: every value either runs or is refused where it
is defined (``relaykit/durations.py``).

Before, a tool defined with a negative timeout was accepted, and each run that called it failed
its workflow task with ``BadScheduleActivityAttributes: invalid StartToCloseTimeout: negative
duration``, retried without end: a wedged run. A model's ``nan`` timeout did the same in
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

from relaykit import Agent, ConfigurationError, Handoff, MCPServer, start_run, tool
from relaykit.durations import MAX_DURATION, duration
from relaykit.models.spec import MAX_TIMEOUT_SECONDS, ModelSpec
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


@pytest.mark.parametrize("field", ["timeout_seconds", "heartbeat_timeout_seconds"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0, MAX_TIMEOUT_SECONDS + 1])
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
        model_server, timeout_seconds=MAX_TIMEOUT_SECONDS, heartbeat_timeout_seconds=0
    )
    model_server.script(model.name, [call("notify", order_id="A1"), text("told them")])
    notify = _define(timeout=MAX_DURATION, heartbeat_timeout=MAX_DURATION)
    agent = Agent(name="longest_timeouts", model=model, tools=[notify])
    async with serving(client, agent) as worker:
        handle = await start_run(client, agent, "notify", task_queue=worker.task_queue)
        result = await asyncio.wait_for(handle.result(), 60)
    assert result.output == "told them"
