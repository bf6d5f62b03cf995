"""Agents for the crash-recovery tests, served by a worker in a process of its own
(``python -m relaykit.cli worker tests.crash_agents``) so that a test can SIGKILL it.

Everything a test varies comes from the environment, read at import:

- ``CRASH_MODEL_URL``: base URL of the test's scripted model server;
- ``CRASH_MODEL_NAME``: the model name the test scripted (one per test);
- ``CRASH_TOOL_LOG``: a file every tool invocation appends one line to (``tool argument``), so a
  test counts executions across worker processes;
- ``CRASH_RELEASE_FILE``: :func:`slow_step` (and the other blocking tools) wait, heartbeating,
  until this file exists.

The blocking tools come in each effect: ``slow_step`` is a read, ``slow_put`` idempotent,
``slow_charge`` and ``slow_charge_asked`` writes (the second with ``on_unknown="ask"``);
``until_released`` keeps the default settings (a write). Each records ``tool argument`` when it
starts, and ``tool argument key`` (its idempotency key) in ``CRASH_TOOL_LOG`` + ``.keys``.
``crash_handoff_agent`` hands over to ``crash_target`` through a handoff whose ``on_handoff``
(a write, by default) records ``on_handoff reason`` and blocks the same way;
``crash_handoff_asking`` does the same with ``on_unknown="ask"``.

Heartbeat timeouts are short (model calls and the slow tool), so a killed worker's in-flight call
is retried elsewhere within seconds.
"""

from __future__ import annotations

import asyncio
import os
import time
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit import (
    Agent,
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    ModelSettings,
    ModelSpec,
    Price,
    Subagents,
    ToolContext,
    tool,
)

MODEL_HEARTBEAT_SECONDS = 5.0
"""Long enough that a loaded machine does not time out a healthy model call (whose retry would
consume the next scripted answer), short enough that a crash costs seconds."""
TOOL_HEARTBEAT_SECONDS = 1.0
_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200))


def _record(tool_name: str, argument: object) -> None:
    log = os.environ.get("CRASH_TOOL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{tool_name} {argument}\n")
            fh.flush()
            os.fsync(fh.fileno())


def _record_key(tool_name: str, argument: object, key: str) -> None:
    """The idempotency key an attempt saw, in ``CRASH_TOOL_LOG`` + ``.keys``."""
    log = os.environ.get("CRASH_TOOL_LOG")
    if log:
        with open(f"{log}.keys", "a", encoding="utf-8") as fh:
            fh.write(f"{tool_name} {argument} {key}\n")


@tool(retry=_RETRY)
def quick(n: int) -> str:
    """Return a number, recording the call.

    Args:
        n: Any number.
    """
    _record("quick", n)
    return f"quick {n}"


async def _until_release(beat: bool = True) -> None:
    release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
    while not release.exists():
        if beat:
            activity.heartbeat()
        await asyncio.sleep(0.05)


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY, effect="read")
async def slow_step(n: int, ctx: ToolContext) -> str:
    """Look something up until released, heartbeating meanwhile.

    Args:
        n: Any number.
    """
    _record_key("slow_step", n, ctx.idempotency_key)
    _record("slow_step", n)
    await _until_release()
    return f"slow {n} done"


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY, effect="idempotent")
async def slow_put(n: int, ctx: ToolContext) -> str:
    """Store a value under the call's idempotency key, until released.

    Args:
        n: Any number.
    """
    _record_key("slow_put", n, ctx.idempotency_key)
    _record("slow_put", n)
    await _until_release()
    return f"put {n} done"


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY)
async def slow_charge(n: int, ctx: ToolContext) -> str:
    """Charge a card (a write), until released.

    Args:
        n: Euros.
    """
    _record_key("slow_charge", n, ctx.idempotency_key)
    _record("slow_charge", n)
    await _until_release(beat=False)  # the automatic heartbeat keeps it alive
    return f"charged {n}"


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY, on_unknown="ask")
async def slow_charge_asked(n: int, ctx: ToolContext) -> str:
    """Charge a card (a write whose unknown outcome a person decides on), until released.

    Args:
        n: Euros.
    """
    _record_key("slow_charge_asked", n, ctx.idempotency_key)
    _record("slow_charge_asked", n)
    await _until_release()
    return f"charged {n}"


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY)
async def stepwise_charge(n: int) -> str:
    """Charge a card in steps (a write), reporting each step with the SDK's own heartbeat.

    Args:
        n: Euros.
    """
    _record("stepwise_charge", n)
    release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
    step = 0
    while not release.exists():
        step += 1
        activity.heartbeat({"step": step})
        await asyncio.sleep(0.05)
    return f"charged {n} in {step} steps"


@tool(retry=_RETRY)
def flaky_write(n: int, ctx: ToolContext) -> str:
    """A write whose first attempt fails with a retryable error.

    Args:
        n: Any number.
    """
    _record("flaky_write", n)
    if ctx.attempt == 1:
        raise ApplicationError("the payment service is briefly unavailable")
    return f"wrote {n} on attempt {ctx.attempt}"


@tool
async def steady(n: int) -> str:
    """Work for two seconds (default tool settings), recording start and end.

    Args:
        n: Any number.
    """
    _record("steady", n)
    await asyncio.sleep(2)
    _record("steady-done", n)
    return f"steady {n} done"


@tool
async def until_released(n: int) -> str:
    """Wait for the release file without ever heartbeating itself (default tool settings).

    Args:
        n: Any number.
    """
    _record("until_released", n)
    release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
    while not release.exists():
        await asyncio.sleep(0.05)
    return f"released {n}"


@tool(needs_approval=True, retry=_RETRY)
def refund(amount: int) -> str:
    """Refund an amount (a person approves first).

    Args:
        amount: Euros to refund.
    """
    _record("refund", amount)
    return f"refunded {amount}"


def audit_handoff(args: HandoffArgs, data: HandoffCallbackInput) -> None:
    """An ``on_handoff`` that writes (an audit record), then blocks until released (sync: it
    runs on the worker's tool pool while the activity heartbeats for it)."""
    _record_key("on_handoff", args.reason, data.idempotency_key)  # first: a kill follows _record
    _record("on_handoff", args.reason)
    release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
    while not release.exists():
        time.sleep(0.05)


MODEL = ModelSpec(
    provider="openai",
    name=os.environ.get("CRASH_MODEL_NAME", "crash-model"),
    base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
    heartbeat_timeout_seconds=MODEL_HEARTBEAT_SECONDS,
    timeout_seconds=30,
)

crash_target = Agent(name="crash_target", instructions="Take over.", model=MODEL)

crash_handoff_agent = Agent(
    name="crash_handoff_agent",
    instructions="Hand over.",
    model=MODEL,
    handoffs=[
        Handoff(
            crash_target,
            on_handoff=audit_handoff,
            heartbeat_timeout=timedelta(seconds=TOOL_HEARTBEAT_SECONDS),
        )
    ],
)

crash_handoff_asking = Agent(
    name="crash_handoff_asking",
    instructions="Hand over.",
    model=MODEL,
    handoffs=[
        Handoff(
            crash_target,
            name="transfer_asking",
            on_handoff=audit_handoff,
            on_unknown="ask",
            heartbeat_timeout=timedelta(seconds=TOOL_HEARTBEAT_SECONDS),
        )
    ],
)

crash_agent = Agent(
    name="crash_agent",
    instructions="Use the tools, then answer.",
    model=MODEL,
    tools=[
        quick,
        slow_step,
        refund,
        steady,
        until_released,
        slow_put,
        slow_charge,
        slow_charge_asked,
        stepwise_charge,
        flaky_write,
    ],
)

crash_priced = Agent(
    name="crash_priced",
    instructions="Use the tools, then answer.",
    model=MODEL.model_copy(update={"price": Price(input=1.0, output=1.0)}),
    tools=[quick],
    model_settings=ModelSettings(max_tokens=1000),
)
"""Every call of it costs its tokens in millionths of a dollar (the dollar-budget tests)."""

crash_priced_lead = Agent(
    name="crash_priced_lead",
    instructions="Start a crash_priced subagent, wait for it, then answer.",
    model=MODEL.model_copy(update={"price": Price(input=1.0, output=1.0)}),
    model_settings=ModelSettings(max_tokens=1000),
    subagents=Subagents([crash_priced], max_concurrent=1, max_turns=20),
)
"""A priced lead whose subagent outgrows its reservation (the budget-tree tests)."""
