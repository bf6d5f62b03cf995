"""The worker entry point, as in Temporal's samples: ``python worker.py``.

It serves the examples' agents (or those named by ``RELAYKIT_AGENTS``) on the task queue
``relaykit`` (or ``RELAYKIT_TASK_QUEUE``) of the Temporal server named by ``TEMPORAL_ADDRESS``
(default ``localhost:7233``) and Temporal's other environment settings. Agents without a model
get the model ``relaykit dev`` would pick (``RELAYKIT_MODEL``, which may name the bundled local
model as ``local``; else provider keys; else the scripted stand-in); the first lines say which. Then start runs from anywhere::

    python worker.py
    relaykit run triage "I was charged twice" --wait

``RELAYKIT_AGENTS`` is a comma-separated list of ``MODULE`` or ``MODULE:ATTR`` (an agent or a
list of agents), e.g. ``RELAYKIT_AGENTS=myapp.agents:support``.

It is ``relaykit worker`` with its targets taken from the environment, so that a container or a
process manager needs no arguments.
"""

from __future__ import annotations

import os
import sys

EXAMPLES = (
    "examples.triage",
    "examples.demo",
    "examples.research",
    "examples.deep_research",
    "examples.approvals",
)


def targets(env: dict[str, str] | None = None) -> list[str]:
    env = dict(os.environ if env is None else env)
    named = [t.strip() for t in env.get("RELAYKIT_AGENTS", "").split(",") if t.strip()]
    return named or list(EXAMPLES)


def main() -> None:
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from relaykit.cli import main as cli_main

    task_queue = os.environ.get("RELAYKIT_TASK_QUEUE") or "relaykit"
    sys.argv = [sys.argv[0], "worker", *targets(), "--task-queue", task_queue]
    cli_main()


if __name__ == "__main__":
    main()
