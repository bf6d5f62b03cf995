"""Agents whose definitions change between two deploys, one agent per change: the matrix of
``tests/test_deploy_matrix.py``.

``MATRIX_VERSION`` (``1`` or ``2``) picks the definitions a worker process serves
(``python -m relaykit.cli worker tests.matrix_agents``); :func:`build` gives either version in
one process, for replaying recorded histories. Every agent has a model of its own
(``<CRASH_MODEL_NAME>-<shape>``), so the test scripts each shape's model calls apart.

v1 → v2, by shape:

- ``renamed``: its tool ``fetch`` is renamed ``find``;
- ``removed``: its tool ``note`` is removed (``keep`` stays);
- ``edits``: instructions changed, a tool added (``extra``), ``lookup`` gets a new parameter;
- ``handoff``: the handoff to ``matrix_handoff_desk`` and that agent are removed;
- ``chain``: the same, for a run that continued as new after the handoff;
- ``approval_on``: ``refund`` starts needing approval;
- ``approval_off``: ``payout`` stops needing approval;
- ``limits``: ``max_repeated_calls`` goes from 3 to 1;
- ``subagent``: the subagent ``matrix_sub_worker`` is removed (``matrix_sub_other`` stays);
- ``timeout``: ``grant`` (waiting for a person) gets an ``approval_timeout``;
- ``answer``: the output type (which rejected the answer, so a repair is under way) is dropped;
- ``inflight``: ``slow_fetch`` is removed while a call of it runs;
- ``inflight_approval``: ``slow_refund`` starts needing approval while a call of it runs.
"""

from __future__ import annotations

import asyncio
import os
from datetime import timedelta
from pathlib import Path

from pydantic import BaseModel
from temporalio import activity
from temporalio.common import RetryPolicy

from relaykit import Agent, Handoff, ModelSpec, Subagents, tool
from relaykit.agent import Tool
from tests.crash_agents import _record as record_call

_RETRY = RetryPolicy(initial_interval=timedelta(milliseconds=200), maximum_attempts=5)


def _model(shape: str) -> ModelSpec:
    return ModelSpec(
        provider="openai",
        name=f"{os.environ.get('CRASH_MODEL_NAME', 'matrix')}-{shape}",
        base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
        heartbeat_timeout_seconds=5.0,
        timeout_seconds=60,
    )


def _simple(name: str, version: str, *, effect: str = "read", **options: object) -> Tool:
    """A tool that records ``<name> v<version> <q>`` and returns ``<name> <q>``."""

    def run(q: str) -> str:
        record_call(name, f"v{version} {q}")
        return f"{name} {q}"

    run.__name__ = name
    run.__doc__ = f"{name.capitalize()} something.\n\nArgs:\n    q: What.\n"
    made: Tool = tool(name=name, effect=effect, retry=_RETRY, **options)(run)  # type: ignore[call-overload]
    return made


def _slow(name: str, version: str, **options: object) -> Tool:
    """A tool that records its start and waits, heartbeating, for ``CRASH_RELEASE_FILE``."""

    async def run(n: int) -> str:
        record_call(name, f"v{version} {n}")
        release = Path(os.environ.get("CRASH_RELEASE_FILE", "release"))
        while not release.exists():
            activity.heartbeat()
            await asyncio.sleep(0.05)
        return f"{name} {n} done"

    run.__name__ = name
    run.__doc__ = f"{name.capitalize()} something slowly.\n\nArgs:\n    n: Any number.\n"
    made: Tool = tool(  # type: ignore[call-overload]
        name=name, effect="idempotent", heartbeat_timeout=1.0, retry=_RETRY, **options
    )(run)
    return made


class Answer(BaseModel):
    n: int


def build(version: str) -> dict[str, Agent]:
    """Every agent of the matrix as ``version`` defines it, by name."""
    v2 = version == "2"
    agents: list[Agent] = []

    def agent(shape: str, **fields: object) -> Agent:
        fields.setdefault("model", _model(shape))
        fields.setdefault("instructions", "Work.")
        made = Agent(name=f"matrix_{shape}", **fields)  # type: ignore[arg-type]
        agents.append(made)
        return made

    agent("renamed", tools=[_simple("find" if v2 else "fetch", version)])
    agent("removed", tools=[_simple("keep", version), *([] if v2 else [_simple("note", version)])])
    if v2:

        @tool(effect="read", retry=_RETRY)
        def lookup(q: str, exact: bool = False) -> str:
            """Look something up, optionally exactly.

            Args:
                q: What.
                exact: Match exactly.
            """
            record_call("lookup", f"v2 {q}")
            return f"lookup {q}"

        agent(
            "edits",
            instructions="Work (instructions of v2).",
            tools=[lookup, _simple("extra", version)],
        )
    else:
        agent("edits", tools=[_simple("lookup", version)])
    for shape in ("handoff", "chain"):
        desk = None if v2 else agent(f"{shape}_desk", model=_model(shape))
        agent(shape, handoffs=[] if desk is None else [Handoff(target=desk)])
    agent("approval_on", tools=[_simple("refund", version, effect="write", needs_approval=v2)])
    agent(
        "approval_off",
        tools=[_simple("payout", version, effect="write", needs_approval=not v2)],
    )
    agent(
        "timeout",
        tools=[
            _simple(
                "grant",
                version,
                effect="write",
                needs_approval=True,
                approval_timeout=timedelta(hours=1) if v2 else None,
            )
        ],
    )
    agent("answer", output_type=None if v2 else Answer)
    agent("limits", tools=[_simple("probe", version)], max_repeated_calls=1 if v2 else 3)
    other = agent("sub_other")
    worker = None if v2 else agent("sub_worker", tools=[_simple("dig", version)])
    agent(
        "subagent",
        subagents=Subagents([a for a in (worker, other) if a is not None]),
    )
    agent(
        "inflight",
        tools=[_simple("stay", version), *([] if v2 else [_slow("slow_fetch", version)])],
    )
    agent("inflight_approval", tools=[_slow("slow_refund", version, needs_approval=v2)])
    return {a.name: a for a in agents}


VERSION = os.environ.get("MATRIX_VERSION", "1")
globals().update(build(VERSION))  # the worker serves every agent at the module's top level
