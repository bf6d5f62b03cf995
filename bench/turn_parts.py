"""``python -m bench.turn_parts``: where a turn's wall time goes, relaykit against the floor.

One run at a time of ``--turns`` tool-calling turns, ``--reps`` runs per system on one in-memory
dev server with the scripted model server. A turn is a model call, a workflow task, a tool
call and a workflow task; each part's time is read from the run's history (the server's event
timestamps), so the figures cost nothing to measure and add up to the wall time per turn:

- ``workflow task: queued``: scheduled to started (the worker polling for it);
- ``workflow task after <activity>: run``: started to completed (the worker's activation,
  and for relaykit the recorded decisions' local activity after a model call);
- ``<activity>: queued``: scheduled to started (0 when Temporal hands the task over with the
  workflow task that scheduled it, which it does for an activity on the run's own queue);
- ``<activity>: run``: started to completed (the activity, its HTTP call for relaykit's model
  call, and the completion's trip to the server).

``--model-on-run-queue`` gives relaykit's model its run queue as ``task_queue``
(docs/fleet.md) instead of its provider queue. Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import time
from collections import defaultdict
from datetime import UTC, datetime
from typing import Any

from temporalio.api.enums.v1 import EventType

from bench.context import Settings, standalone_bench
from bench.procs import commit

ACTIVITY_NAMES = {  # the same part of a turn under each system's name
    "relaykit.model_call": "model call",
    "floor_model": "model call",
    "lookup": "tool",
    "floor_tool": "tool",
}


def _ms(event: Any) -> float:
    return event.event_time.ToNanoseconds() / 1e6


def parts_of(events: list[Any]) -> dict[str, float]:
    """The summed milliseconds of each part of the turns in one run's history."""
    parts: dict[str, float] = defaultdict(float)
    by_id = {event.event_id: event for event in events}
    scheduled = started = 0.0
    after = "start"
    for event in events:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_WORKFLOW_TASK_SCHEDULED:
            scheduled = _ms(event)
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            started = _ms(event)
            parts["workflow task: queued"] += started - scheduled
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_COMPLETED:
            parts[f"workflow task after the {after}: run"] += _ms(event) - started
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            origin = by_id[attrs.scheduled_event_id]
            name = _activity(origin)
            parts[f"{name}: queued"] += _ms(event) - _ms(origin)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            attrs = event.activity_task_completed_event_attributes
            after = _activity(by_id[attrs.scheduled_event_id])
            parts[f"{after}: run"] += _ms(event) - _ms(by_id[attrs.started_event_id])
    return parts


def _activity(scheduled: Any) -> str:
    name = scheduled.activity_task_scheduled_event_attributes.activity_type.name
    return ACTIVITY_NAMES.get(name, name)


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    per_turn: dict[str, dict[str, float]] = {}
    wall: dict[str, float] = {}
    settings = Settings(model_on_run_queue=args.model_on_run_queue)
    async with standalone_bench(settings, "turn-parts") as bench:
        load_before = os.getloadavg()[0]
        for system in ("relaykit", "floor"):
            worker = bench.worker(system)
            for _ in range(2):  # warm-up: connections, sandbox imports, caches
                await bench.timed(bench.start_turns(worker, 3))
            sums: dict[str, float] = defaultdict(float)
            walls = []
            for _ in range(args.reps):
                began = time.perf_counter()
                handle = await bench.start_turns(worker, args.turns)
                await bench.result(handle)
                walls.append((time.perf_counter() - began) * 1000 / args.turns)
                events = [e for h in await bench.history_chain(handle) for e in h.events]
                for part, ms in parts_of(events).items():
                    sums[part] += ms
            wall[system] = statistics.median(walls)
            per_turn[system] = {
                part: round(ms / (args.reps * args.turns), 2)
                for part, ms in sorted(sums.items())
            }
        load_after = os.getloadavg()[0]
    return {
        "at": datetime.now(UTC).isoformat(timespec="seconds"),
        "commit": commit(),
        "turns": args.turns,
        "reps": args.reps,
        "model_on_run_queue": args.model_on_run_queue,
        "wall_ms_per_turn": {s: round(v, 1) for s, v in wall.items()},
        "ms_per_turn": per_turn,
        "load_average_before": round(load_before, 1),
        "load_average_after": round(load_after, 1),
    }


def table(result: dict[str, Any]) -> str:
    relaykit, floor = result["ms_per_turn"]["relaykit"], result["ms_per_turn"]["floor"]
    lines = ["| part of a turn | relaykit ms | floor ms | difference |", "|---|---|---|---|"]
    for part in sorted({*relaykit, *floor}):
        mine, theirs = relaykit.get(part, 0.0), floor.get(part, 0.0)
        lines.append(f"| {part} | {mine:.2f} | {theirs:.2f} | {mine - theirs:+.2f} |")
    walls = result["wall_ms_per_turn"]
    lines.append(
        f"| **wall time per turn (median)** | **{walls['relaykit']:.1f}** | "
        f"**{walls['floor']:.1f}** | **{walls['relaykit'] - walls['floor']:+.1f}** |"
    )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=50, help="tool-calling turns per run")
    parser.add_argument("--reps", type=int, default=3, help="runs per system")
    parser.add_argument("--model-on-run-queue", action="store_true")
    args = parser.parse_args()
    result = asyncio.run(measure(args))
    print(table(result))
    print(json.dumps(result))


if __name__ == "__main__":
    main()
