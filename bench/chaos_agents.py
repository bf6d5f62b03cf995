"""The agents the chaos fuzzer's workers serve (``relaykit worker bench.chaos_agents:agents``).

Each fuzzed run has a worker process of its own, so everything that varies comes from that
process's environment, read at import:

- ``CHAOS_MODEL_URL`` and ``CHAOS_MODEL_NAME``: the scripted model server and the run's model
  name (the driver answers that name with the run's plan, see :mod:`bench.chaos`);
- ``CHAOS_FEATURES``: comma-separated parts of the agent graph: ``handoff`` (a second agent
  reached by a handoff whose ``on_handoff`` writes), ``agent_tool``, ``subagents``, ``mcp``
  (the docs MCP server of the tests, over stdio), ``summarize`` (summarize compaction with a
  small window), ``budget`` (the model has a price, $1 per million tokens in and out, and a
  call plans for at most 1000 output tokens, so that a run's dollar limit, given by the driver
  at its start, is reached within a few turns);
- ``CHAOS_VERSION``: the deployed definition; every version after the first changes the
  instructions and adds the ``audit`` tool, as a deploy of a changed module does;
- ``CHAOS_APPROVALS=flipped``: a deploy that changed which tools a person approves (``work``
  needs an approval, ``lookup`` no longer does);
- ``CHAOS_LOG``: every tool and ``on_handoff`` start appends ``kind key`` here (the key is the
  call's idempotency key, or the workflow id and turn of a handoff), so the driver counts
  starts across worker processes.

Heartbeat timeouts are short so that a killed worker's call is retried (or declared an unknown
outcome) within seconds rather than minutes.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from pathlib import Path

from temporalio.common import RetryPolicy

from relaykit import (
    Agent,
    ContextPolicy,
    Handoff,
    HandoffArgs,
    HandoffCallbackInput,
    MCPServer,
    ModelSettings,
    ModelSpec,
    Price,
    Subagents,
    Tool,
    ToolContext,
    tool,
)

FEATURES = frozenset(f for f in os.environ.get("CHAOS_FEATURES", "").split(",") if f)
VERSION = int(os.environ.get("CHAOS_VERSION", "1"))
FLIPPED = os.environ.get("CHAOS_APPROVALS") == "flipped"
MCP_SERVER_SCRIPT = Path(__file__).resolve().parent.parent / "tests" / "mcp_docs_server.py"
SUMMARY_WINDOW = 250
"""Input tokens (as the scripted model reports them: a quarter of the transcript's JSON) after
which a ``summarize`` run compacts: a few turns in."""

_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)
_HEARTBEAT = 2.0


def record(kind: str, key: str) -> None:
    """One line per start, flushed to disk before the work begins (a SIGKILL loses nothing)."""
    path = os.environ.get("CHAOS_LOG")
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(f"{kind} {key}\n")
            fh.flush()
            os.fsync(fh.fileno())


@tool(needs_approval=not FLIPPED, effect="read", retry=_RETRY, heartbeat_timeout=_HEARTBEAT)
async def lookup(query: str, ctx: ToolContext) -> str:
    """Look a customer record up (a person approves first).

    Args:
        query: What to look up.
    """
    record("lookup", ctx.idempotency_key)
    await asyncio.sleep(0.3)
    return f"record for {query}"


@tool(needs_approval=True, retry=_RETRY, heartbeat_timeout=_HEARTBEAT)
async def charge(amount: int, ref: str, ctx: ToolContext) -> str:
    """Charge the customer's card (a write; a person approves first).

    Args:
        amount: Euros.
        ref: The payment reference.
    """
    record("charge", ctx.idempotency_key)
    await asyncio.sleep(0.5)
    return f"charged {amount} for {ref}"


@tool(needs_approval=FLIPPED, retry=_RETRY, heartbeat_timeout=_HEARTBEAT)
async def work(ref: str, seconds: float, ctx: ToolContext) -> str:
    """Update the ledger, which takes a while (a write without approval).

    Args:
        ref: The ledger entry.
        seconds: How long it takes.
    """
    record("work", ctx.idempotency_key)
    await asyncio.sleep(min(max(seconds, 0.0), 5.0))
    return f"ledger {ref} updated"


@tool(effect="read", retry=_RETRY)
def note(text: str) -> str:
    """Write a thought down (changes nothing outside the run).

    Args:
        text: The thought.
    """
    return f"noted: {text}"


@tool(effect="read", retry=_RETRY)
def audit(ref: str) -> str:
    """Check an entry against the audit log (added by a later deploy).

    Args:
        ref: The entry.
    """
    return f"audit of {ref}: clean"


async def log_handoff(args: HandoffArgs, data: HandoffCallbackInput) -> None:
    """An audit write at every handoff (user code with a side effect)."""
    record("handoff", f"{data.workflow_id}@{data.turn}")
    await asyncio.sleep(1.0)


def _model() -> ModelSpec:
    return ModelSpec(
        provider="openai",
        name=os.environ.get("CHAOS_MODEL_NAME", "chaos-model"),
        base_url=f"{os.environ.get('CHAOS_MODEL_URL', 'http://127.0.0.1:9')}/v1",
        heartbeat_timeout_seconds=5.0,
        timeout_seconds=30,
        price=Price(input=1.0, output=1.0) if "budget" in FEATURES else None,
    )


SETTINGS = ModelSettings(max_tokens=1000) if "budget" in FEATURES else None
"""A budgeted run's calls plan for 1000 output tokens ($0.001) each."""


def _instructions(role: str) -> str:
    text = f"You are the {role}. Use the tools, then answer."
    if VERSION > 1:
        text += f" (definition v{VERSION}: check entries with audit when unsure.)"
    return text


def build() -> list[Agent]:
    model = _model()
    tools: list[Tool | object] = [lookup, charge, work, note]
    if VERSION > 1:
        tools.append(audit)
    helper = Agent(
        name="chaos_helper",
        instructions=_instructions("helper"),
        model=model,
        tools=[note],
        description="Answers side questions.",
        model_settings=SETTINGS,
    )
    if "agent_tool" in FEATURES:
        tools.append(helper.as_tool(max_turns=6))
    if "mcp" in FEATURES:
        tools.append(
            MCPServer.stdio(
                "docs",
                [sys.executable, str(MCP_SERVER_SCRIPT)],
                env_from_env=["MCP_TEST_LOG"],
                include=["read_doc", "slow", "slow_write"],
                retry=_RETRY,
            )
        )
    subagents = Subagents(agents=[helper], max_turns=6) if "subagents" in FEATURES else None
    policy = (
        ContextPolicy(max_input_tokens=SUMMARY_WINDOW, keep_last_turns=2, strategy="summarize")
        if "summarize" in FEATURES
        else None
    )
    specialist = Agent(
        name="chaos_specialist",
        instructions=_instructions("specialist"),
        model=model,
        tools=list(tools),  # type: ignore[arg-type]
        subagents=subagents,
        description="Handles the hard cases.",
        model_settings=SETTINGS,
    )
    handoffs = [Handoff(specialist, on_handoff=log_handoff)] if "handoff" in FEATURES else []
    chaos = Agent(
        name="chaos",
        instructions=_instructions("front desk"),
        model=model,
        tools=list(tools),  # type: ignore[arg-type]
        handoffs=handoffs,  # type: ignore[arg-type]
        subagents=subagents,
        context_policy=policy,
        model_settings=SETTINGS,
    )
    return [chaos]


agents = build()
