"""The durations a definition hands to Temporal, checked where they are defined.

A run schedules each call with its tool's timeouts. Temporal refuses a negative timeout, and a
zero start-to-close timeout leaves the activity with none: either fails the workflow task that
schedules the call, and every retry of that task, so the run stops without ever failing (a
wedged run). A number no ``timedelta`` holds (``nan``, ``inf``) does the same in workflow code.
Refusing them when the tool, MCP server or handoff is defined turns all of that into one
:class:`~relaykit.errors.ConfigurationError` when the worker loads its agents.
"""

from __future__ import annotations

import math
from datetime import timedelta

from relaykit.errors import ConfigurationError

MAX_DURATION = timedelta(days=365)
"""The longest timeout a definition takes: any longer is a mistake, not a wait (a call that may
wait for a person longer than this has no timeout: ``approval_timeout=None``)."""


def duration(value: timedelta | float, what: str, *, zero: str | None = None) -> timedelta:
    """``value`` (a ``timedelta``, or seconds) as a ``timedelta`` above zero and at most
    :data:`MAX_DURATION`; ``zero`` names what ``0`` means where it is allowed (``"off"``)."""
    if isinstance(value, bool) or not isinstance(value, (timedelta, int, float)):
        raise ConfigurationError(
            f"{what} is {value!r}", hint="give a timedelta or a number of seconds"
        )
    if not isinstance(value, timedelta):
        if not math.isfinite(value) or abs(value) > MAX_DURATION.total_seconds():
            raise _out_of_range(what, value, zero)
        value = timedelta(seconds=value)
    if value < timedelta(0) or value > MAX_DURATION or (value == timedelta(0) and zero is None):
        raise _out_of_range(what, value, zero)
    return value


def _out_of_range(what: str, value: timedelta | float, zero: str | None) -> ConfigurationError:
    lowest = f"0 ({zero})" if zero is not None else "above 0"
    seconds = value.total_seconds() if isinstance(value, timedelta) else value
    return ConfigurationError(
        f"{what} is {seconds:g} s",
        hint=f"a duration from {lowest} to {MAX_DURATION.days} days",
    )
