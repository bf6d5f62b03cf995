"""Agents for the upgrade test (``tests/test_upgrade.py``): one agent per shape a run can be in
when a worker of the previous release is replaced by one of today's.

The same file is served by a worker of the previous release and by one of today's, so it uses
only the API both have (``Agent``, ``ModelSpec``, ``Subagents``, ``tool`` with ``name``,
``needs_approval`` and ``retry``, ``Agent.as_tool``, handoffs to an agent) and imports nothing
from the ``tests`` package: the test copies it next to the previous release's ``relaykit`` as a
top-level module. Every agent has a model of its own (``<CRASH_MODEL_NAME>-<shape>``), so the
test scripts each shape's model calls apart. Every tool appends ``<tool> <release> <q>`` to
``CRASH_TOOL_LOG``, ``<release>`` being ``UPGRADE_RELEASE`` (``old`` or ``new``): the worker that
ran it.
"""

from __future__ import annotations

import os
from datetime import timedelta
from typing import Any

from temporalio.common import RetryPolicy

from relaykit import Agent, ModelSpec, Subagents, tool

_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)


def _record(line: str) -> None:
    log = os.environ.get("CRASH_TOOL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{line}\n")
            fh.flush()
            os.fsync(fh.fileno())


def _model(shape: str) -> ModelSpec:
    return ModelSpec(
        provider="openai",
        name=f"{os.environ.get('CRASH_MODEL_NAME', 'upgrade')}-{shape}",
        base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
        heartbeat_timeout_seconds=5.0,
        timeout_seconds=60,
    )


def _tool(name: str, **options: Any) -> Any:
    """A tool that records ``<name> <release> <q>`` and returns ``<name> <q>``."""

    def run(q: str) -> str:
        _record(f"{name} {os.environ.get('UPGRADE_RELEASE', '?')} {q}")
        return f"{name} {q}"

    run.__name__ = name
    run.__doc__ = f"{name.capitalize()} something.\n\nArgs:\n    q: What.\n"
    return tool(name=name, retry=_RETRY, **options)(run)


def _agent(shape: str, **fields: Any) -> Agent:
    fields.setdefault("model", _model(shape))
    fields.setdefault("instructions", "Work, then answer.")
    return Agent(name=f"up_{shape}", **fields)


_step = _tool("step")  # one tool of the name for every agent that has it (one activity type)

# an approval waiting when the worker is replaced
up_approval = _agent("approval", tools=[_tool("refund", needs_approval=True)])
# in the middle of a tool loop, at a turn boundary
up_loop = _agent("loop", tools=[_step])
# a model call in flight
up_inflight = _agent("inflight", tools=[_step])
# a background subagent running (its model call in flight), the lead waiting for its report
up_sub_worker = _agent("sub_worker", tools=[_tool("dig")], description="Digs.")
up_subagent = _agent("subagent", subagents=Subagents([up_sub_worker]))
# handed off: the run goes on in the desk agent
up_desk = _agent("desk", tools=[_tool("file")], description="Files things.")
up_handoff = _agent("handoff", handoffs=[up_desk])
# an agent-as-tool child at a turn boundary, its parent waiting for it
up_expert = _agent("expert", tools=[_tool("study")])
up_asker = _agent("asker", tools=[up_expert.as_tool(name="ask_expert")])
# an approval waiting inside an agent-as-tool child, answered through the parent
up_gate = _agent("gate", tools=[_tool("grant", needs_approval=True)])
up_gatekeeper = _agent("gatekeeper", tools=[up_gate.as_tool(name="ask_gate")])
# a run that continued as new, at the first turn of its second execution
up_chain = _agent("chain", tools=[_step])
# paused by a person, resumed with a message
up_paused = _agent("paused", tools=[_step])
# an agent with subagents that continued as new (the transcript's start lives in the store)
up_helper = _agent("helper", description="Helps.")
up_sub_chain = _agent("sub_chain", tools=[_tool("lookup")], subagents=Subagents([up_helper]))
