"""Find agents in a Python module named on the command line (``examples.triage[:triage]``)."""

from __future__ import annotations

import importlib
import os
import sys
import traceback

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
        raise import_failure(module_name, exc) from None
    except SyntaxError as exc:
        raise import_failure(module_name, exc) from None
    except Exception as exc:  # noqa: BLE001 - any error at import time is the module's
        raise import_failure(module_name, exc) from None
    if attr:
        if not hasattr(module, attr):
            raise ConfigurationError(f"module {module_name!r} has no attribute {attr!r}")
        value = getattr(module, attr)
        agents = (
            [value]
            if isinstance(value, Agent)
            else list(value)
            if isinstance(value, (list, tuple))
            else []
        )
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


def import_failure(module_name: str, exc: BaseException) -> ConfigurationError:
    """An error in the user's module, pointed at its file and line: the traceback through
    importlib and relaykit would bury the one line that matters."""
    if isinstance(exc, SyntaxError) and exc.filename:
        where = f"{_shown(exc.filename)}, line {exc.lineno}"
        return ConfigurationError(f"cannot import {module_name!r}: {where}: {exc.msg}")
    frames = [
        frame
        for frame in traceback.extract_tb(exc.__traceback__)
        if not frame.filename.startswith("<")
    ]
    own = [frame for frame in frames if not _is_library(frame.filename)]
    shown = own or frames
    frame = shown[-1] if shown else None
    where = f"{_shown(frame.filename)}, line {frame.lineno}: " if frame is not None else ""
    detail = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    return ConfigurationError(f"cannot import {module_name!r}: {where}{detail}")


def _is_library(filename: str) -> bool:
    here = os.path.dirname(os.path.abspath(__file__))
    path = os.path.abspath(filename)
    return (
        path.startswith(here + os.sep)
        or "site-packages" in path.split(os.sep)
        or any(
            path.startswith(os.path.abspath(prefix) + os.sep + "lib")
            for prefix in {sys.base_prefix, sys.prefix}
        )
    )


def _shown(filename: str) -> str:
    try:
        relative = os.path.relpath(filename)
    except ValueError:
        return filename
    return filename if relative.startswith("..") else relative
