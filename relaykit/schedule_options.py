"""What a definition hands to Temporal when a run schedules its calls (timeouts, retry
policies, task queues), checked where the tool, MCP server, model or handoff is defined.

Temporal refuses a negative timeout, a zero start-to-close timeout leaves an activity with
none, the SDK refuses a retry policy it cannot send (a backoff coefficient under 1, a maximum
interval under the initial one), and the server a task queue name over its length limit or
under its reserved prefix: each fails the workflow task that schedules the call,
and every retry of that task, so the run stops without ever failing (a wedged run). A number no
``timedelta`` holds (``nan``, ``inf``) does the same in workflow code. Refusing them when they
are defined turns all of that into one :class:`~relaykit.errors.ConfigurationError` when the
worker loads its agents.
"""

from __future__ import annotations

import dataclasses
import math
from datetime import timedelta
from typing import Protocol

from temporalio.common import RetryPolicy

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


_MAX_INT32 = 2**31 - 1
MAX_TASK_QUEUE_BYTES = 1000
"""The Temporal server's default limit on a task queue name (``limit.maxIDLength``)."""
_RESERVED_QUEUE_PREFIX = "/_sys/"


def task_queue_name(name: str | None, what: str) -> str | None:
    """``name`` if the server takes it as a task queue (``None`` and ``""`` are the default
    queue, as before)."""
    if name is None or name == "":
        return name
    if not isinstance(name, str):
        raise ConfigurationError(f"{what} is {name!r}", hint="a task queue name (a string)")
    size = len(name.encode("utf-8", "surrogatepass"))
    if size > MAX_TASK_QUEUE_BYTES:
        raise ConfigurationError(
            f"{what} is {size} bytes long",
            hint=f"at most {MAX_TASK_QUEUE_BYTES} (UTF-8), the Temporal server's limit",
        )
    if name.startswith(_RESERVED_QUEUE_PREFIX):
        raise ConfigurationError(
            f"{what} is {name!r}",
            hint=f"Temporal reserves names starting with {_RESERVED_QUEUE_PREFIX}",
        )
    return name


def retry_policy(policy: RetryPolicy, what: str) -> RetryPolicy:
    """``policy`` if Temporal's SDK can send it, with intervals in range; else
    :class:`ConfigurationError` in the SDK's own words."""
    if not isinstance(policy, RetryPolicy):
        raise ConfigurationError(
            f"{what} is {policy!r}", hint="give a temporalio.common.RetryPolicy"
        )
    default = "Temporal's default"
    duration(policy.initial_interval, f"initial_interval of {what}", zero=default)
    if policy.maximum_interval is not None:
        duration(policy.maximum_interval, f"maximum_interval of {what}", zero=default)
    if not math.isfinite(policy.backoff_coefficient):
        raise ConfigurationError(
            f"{what} has backoff_coefficient {policy.backoff_coefficient}",
            hint="a finite number, at least 1",
        )
    if not 0 <= policy.maximum_attempts <= _MAX_INT32:
        raise ConfigurationError(
            f"{what} has maximum_attempts {policy.maximum_attempts}",
            hint=f"0 (no limit) to {_MAX_INT32}",
        )
    try:  # what the SDK checks when it sends the policy, in workflow code; with any number
        # of attempts (the SDK skips its checks for one attempt, the server may not)
        dataclasses.replace(policy, maximum_attempts=0)._validate()
    except ValueError as exc:
        raise ConfigurationError(f"{what}: {exc}", hint="fix the RetryPolicy") from None
    return policy


class CallOptions(Protocol):
    """How a run schedules one kind of call: a tool's or an MCP server's options."""

    timeout: timedelta
    heartbeat_timeout: timedelta | None
    approval_timeout: timedelta | None
    task_queue: str | None


def check_call_options(definition: CallOptions, owner: str) -> None:
    """Check ``definition``'s call options, numbers made ``timedelta`` s (``owner`` names it in
    errors: ``"tool 'notify'"``); ``heartbeat_timeout=0`` turns the heartbeat timeout off. Its
    retry policy is checked by :func:`retry_policy` (a tool's may be ``None``, the default)."""
    definition.timeout = duration(definition.timeout, f"timeout of {owner}")
    if definition.heartbeat_timeout is not None:
        definition.heartbeat_timeout = duration(
            definition.heartbeat_timeout, f"heartbeat_timeout of {owner}", zero="off"
        )
    if definition.approval_timeout is not None:
        definition.approval_timeout = duration(
            definition.approval_timeout, f"approval_timeout of {owner}"
        )
    definition.task_queue = task_queue_name(definition.task_queue, f"task_queue of {owner}")
