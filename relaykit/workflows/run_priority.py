"""The run's Temporal priority, written out on the activities it schedules.

Temporal gives activities and children the priority of the workflow that starts them
(:mod:`relaykit.fleet`), so relaykit needs to pass nothing for them to take the run's place. It
writes it out on model calls and function tools all the same: their ``ActivityTaskScheduled``
events then show it, where a person (or a test) reading the history looks. A run started without
one writes nothing, so its commands are what they were before.

Workflow code: deterministic, no I/O (``workflow.info().priority`` is the run's, from its start).
"""

from __future__ import annotations

from typing import Any

from temporalio import workflow
from temporalio.common import Priority


def run_priority() -> dict[str, Any]:
    """``priority=`` for an activity command: the run's own, or nothing when it has none."""
    priority = workflow.info().priority
    if priority is None or priority == Priority.default:
        return {}
    return {"priority": priority}
