"""The local activity that records a run's decisions: it returns what it is given.

Live, the workflow passes what it decided and reads it back at once; when the run is replayed,
Temporal returns the result recorded in the activity's marker instead, whatever today's code
decided (:mod:`relaykit.workflows.call_record`). It does nothing else, so it costs the worker
no I/O and the run one marker event.
"""

from __future__ import annotations

from temporalio import activity

from relaykit.runs import RECORD_DECISIONS_ACTIVITY

__all__ = ["RECORD_DECISIONS_ACTIVITY", "record_decisions"]


@activity.defn(name=RECORD_DECISIONS_ACTIVITY)
async def record_decisions(codes: list[str]) -> list[str]:
    return codes
