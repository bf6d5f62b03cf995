"""Reading a run's Temporal history: events, serialized bytes, and bytes per turn.

A turn starts at the ``ActivityTaskScheduled`` event of its model call and runs until the next
model call is scheduled; events before the first model call are the run's start, and the segment
after the last model call (its completion, the final workflow task, the run's result) is the
run's end. The floor is cut the same way at its ``floor_model`` activity, so turn ``i`` of both
systems covers the same activities. A run that continued as new is measured over its whole chain
of workflow runs (their events concatenated).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from temporalio.api.enums.v1 import EventType


@dataclass
class HistoryStats:
    events: int
    bytes: int
    start_bytes: int
    turn_bytes: list[int]
    """Bytes of turn 1..K (model call, tool calls, and the workflow tasks between them)."""
    end_bytes: int
    largest_event: int
    runs: int = 1
    """Workflow runs in the chain (more than one after a continue-as-new)."""

    def turn(self, number: int) -> int:
        return self.turn_bytes[number - 1]

    def summary(self) -> dict[str, Any]:
        k = len(self.turn_bytes)
        return {
            "events": self.events,
            "bytes": self.bytes,
            "start_bytes": self.start_bytes,
            "end_bytes": self.end_bytes,
            "largest_event": self.largest_event,
            "workflow_runs": self.runs,
            "turns": k,
            "turn_1_bytes": self.turn_bytes[0] if k else None,
            "turn_10_bytes": self.turn_bytes[9] if k >= 10 else None,
            "turn_last_bytes": self.turn_bytes[-1] if k else None,
            "turn_bytes": self.turn_bytes,
        }


def history_stats(events: list[Any], model_activity: str, *, runs: int = 1) -> HistoryStats:
    sizes = [event.ByteSize() for event in events]
    starts = [
        index
        for index, event in enumerate(events)
        if event.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
        and event.activity_task_scheduled_event_attributes.activity_type.name == model_activity
    ]
    if not starts:
        raise ValueError(f"no {model_activity} activity in this history")
    turns = [sum(sizes[a:b]) for a, b in zip(starts, starts[1:])]
    return HistoryStats(
        events=len(events),
        bytes=sum(sizes),
        start_bytes=sum(sizes[: starts[0]]),
        turn_bytes=turns,
        end_bytes=sum(sizes[starts[-1] :]),
        largest_event=max(sizes),
        runs=runs,
    )
