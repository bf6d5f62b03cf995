"""Agents for the crash-recovery tests, served by a worker in a process of its own
(``python -m relaykit.cli worker tests.crash_agents``) so that a test can SIGKILL it.

Everything a test varies comes from the environment, read at import:

- ``CRASH_MODEL_URL``: base URL of the test's scripted model server;
- ``CRASH_MODEL_NAME``: the model name the test scripted (one per test);
- ``CRASH_TOOL_LOG``: a file every tool invocation appends one line to (``tool argument``), so a
  test counts executions across worker processes;
- ``CRASH_RELEASE_FILE``: :func:`slow_step` blocks, heartbeating, until this file exists.

Heartbeat timeouts are short (model calls and the slow tool), so a killed worker's in-flight call
is retried elsewhere within seconds.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

from temporalio import activity
from temporalio.common import RetryPolicy

from relaykit import Agent, ModelSpec, tool

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


@tool(retry=_RETRY)
def quick(n: int) -> str:
    """Return a number, recording the call.

    Args:
        n: Any number.
    """
    _record("quick", n)
    return f"quick {n}"


@tool(heartbeat_timeout=TOOL_HEARTBEAT_SECONDS, retry=_RETRY)
async def slow_step(n: int) -> str:
    """Work until released, heartbeating meanwhile.

    Args:
        n: Any number.
    """
    _record("slow_step", n)
    release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
    while not release.exists():
        activity.heartbeat()
        await asyncio.sleep(0.05)
    return f"slow {n} done"


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


crash_agent = Agent(
    name="crash_agent",
    instructions="Use the tools, then answer.",
    model=ModelSpec(
        provider="openai",
        name=os.environ.get("CRASH_MODEL_NAME", "crash-model"),
        base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
        heartbeat_timeout_seconds=MODEL_HEARTBEAT_SECONDS,
        timeout_seconds=30,
    ),
    tools=[quick, slow_step, refund, steady, until_released],
)
