"""Agents for the deploy tests, in two versions chosen by ``DEPLOY_VERSION`` (``1`` or ``2``)
at import, so that a test can stop a worker serving v1 and start one serving v2 on the same
task queue, as an operator's deploy does (``python -m relaykit.cli worker tests.deploy_agents``).

v2 changes what docs/replay.md calls safe: the lead's instructions and the schema of its
``lookup`` tool (a new optional parameter). The lead has subagents, whose built-in tools are
part of every request's unchanging part too. v3 breaks runs that called ``lookup``: the name now
answers another kind of tool (an agent as tool, a child run where history holds an activity),
which no recorded decision can replay.

The model and tool log come from the same variables as :mod:`tests.crash_agents`
(``CRASH_MODEL_URL``, ``CRASH_MODEL_NAME``, ``CRASH_TOOL_LOG``).
"""

from __future__ import annotations

import os

from relaykit import Agent, ModelSpec, Subagents, tool

VERSION = os.environ.get("DEPLOY_VERSION", "1")


def _record(line: str) -> None:
    log = os.environ.get("CRASH_TOOL_LOG")
    if log:
        with open(log, "a", encoding="utf-8") as fh:
            fh.write(f"{line}\n")


if VERSION == "1":

    @tool
    def lookup(q: str) -> str:
        """Look something up.

        Args:
            q: What to look up.
        """
        _record(f"lookup v1 {q}")
        return f"v1 found {q}"

elif VERSION == "3":  # a breaking change: the tool runs had called is now another kind of tool
    lookup = None  # type: ignore[assignment]  # (an agent as tool of the same name, below)

else:

    @tool
    def lookup(q: str, exact: bool = False) -> str:  # type: ignore[misc]  # v2's schema
        """Look something up, optionally matching exactly.

        Args:
            q: What to look up.
            exact: Match the words exactly.
        """
        _record(f"lookup v2 {q}")
        return f"v2 found {q}"


_MODEL = ModelSpec(
    provider="openai",
    name=os.environ.get("CRASH_MODEL_NAME", "deploy-model"),
    base_url=f"{os.environ.get('CRASH_MODEL_URL', 'http://127.0.0.1:9')}/v1",
    heartbeat_timeout_seconds=5.0,
    timeout_seconds=30,
)

helper = Agent(name="deploy_helper", instructions="Help.", model=_MODEL)
if lookup is None:  # v3: `lookup` asks the helper agent instead of running a function
    lookup = helper.as_tool(name="lookup", description="Look something up.")  # type: ignore[assignment]

deploy_lead = Agent(
    name="deploy_lead",
    instructions=f"Look things up, then answer. (instructions of v{VERSION})",
    model=_MODEL,
    tools=[lookup],
    subagents=Subagents([helper]),
)
