"""Find agents in a Python module named on the command line (``examples.triage[:triage]``)."""

from __future__ import annotations

import importlib
import os
import sys

from relaykit.agent import Agent
from relaykit.errors import ConfigurationError


def load_agents(target: str) -> list[Agent]:
    """``MODULE`` gives every ``Agent`` at the module's top level; ``MODULE:ATTR`` names one
    agent or a list of agents. The worker also serves every agent these reach."""
    module_name, _, attr = target.partition(":")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name and module_name.startswith(exc.name):
            raise ConfigurationError(
                f"no module named {module_name!r}",
                hint="give a dotted module path importable from the current directory, "
                "e.g. examples.triage",
            ) from None
        raise
    if attr:
        if not hasattr(module, attr):
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
        value = getattr(module, attr)
        agents = [value] if isinstance(value, Agent) else list(value) if isinstance(value, (list, tuple)) else []
        if not agents or not all(isinstance(a, Agent) for a in agents):
            raise ConfigurationError(f"{target!r} is not an Agent or a list of agents")
        return agents
    agents = [value for value in vars(module).values() if isinstance(value, Agent)]
    if not agents:
        raise ConfigurationError(
            f"module {module_name!r} defines no Agent at its top level",
            hint="name one explicitly: MODULE:ATTR",
        )
    return agents
