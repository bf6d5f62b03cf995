"""The bare-Temporal floor: hand-written minimal workflows that schedule the same activities as
the relaykit runs they are compared with, with tiny payloads (an int in, a short string out).

- :class:`FloorRun` (``turns=K``): ``K`` x (model activity, tool activity), then one final model
  activity, exactly the activity sequence of a relaykit run of ``K`` tool-calling turns.
- :class:`FloorFanout`: a model activity, ``N`` child :class:`FloorRun` of one turn started at
  once, a final model activity.
- :class:`FloorBackground`: a model activity, ``N`` child :class:`FloorRun` of one turn started
  without waiting, a second model activity, a wait for the children, a final model activity
  (relaykit's ``spawn_subagent`` turn, ``wait_subagents`` turn and answer).
- :class:`FloorApproval`: a model activity, a wait for the ``approve`` signal, the tool activity,
  a final model activity. Its argument adds one kind of command before the wait
  (:data:`APPROVAL_EXTRAS`), for ``python -m bench.parked_memory --floor-extra``: what Core keeps
  per command of a cached run.

The model activity sleeps for the configured model latency; nothing here talks HTTP. The
waiting workflow sets the ``RelayStatus`` search attribute (one upsert), as relaykit runs do, so
that the benchmark can count parked workflows the same way for both systems.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta
from typing import Any

from temporalio import activity, workflow
from temporalio.common import SearchAttributeKey

FLOOR_MODEL = "floor_model"
FLOOR_TOOL = "floor_tool"
_TIMEOUT = timedelta(minutes=5)
_STATUS = SearchAttributeKey.for_keyword("RelayStatus")
APPROVAL_EXTRAS = ("marker", "local-activity", "summary")
"""What :class:`FloorApproval` can add before its wait: a ``workflow.patched`` marker (with
Temporal's ``TemporalChangeVersion`` upsert) and one upsert of its own; a local activity; a
4,000-character summary on its model activity."""


@workflow.defn(name="FloorRun")
class FloorRun:
    @workflow.run
    async def run(self, turns: int) -> str:
        for turn in range(1, turns + 1):
            await workflow.execute_activity(FLOOR_MODEL, turn, start_to_close_timeout=_TIMEOUT)
            await workflow.execute_activity(FLOOR_TOOL, turn, start_to_close_timeout=_TIMEOUT)
        return await workflow.execute_activity(
            FLOOR_MODEL, turns + 1, start_to_close_timeout=_TIMEOUT
        )


@workflow.defn(name="FloorFanout")
class FloorFanout:
    @workflow.run
    async def run(self, children: int) -> str:
        await workflow.execute_activity(FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT)
        parent = workflow.info().workflow_id
        await asyncio.gather(
            *(
                workflow.execute_child_workflow(FloorRun.run, 1, id=f"{parent}/{index}")
                for index in range(children)
            )
        )
        return await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)


@workflow.defn(name="FloorBackground")
class FloorBackground:
    @workflow.run
    async def run(self, children: int) -> str:
        await workflow.execute_activity(FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT)
        parent = workflow.info().workflow_id
        handles = await asyncio.gather(
            *(
                workflow.start_child_workflow(FloorRun.run, 1, id=f"{parent}/task-{index}")
                for index in range(children)
            )
        )
        await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)
        await asyncio.gather(*handles)
        return await workflow.execute_activity(FLOOR_MODEL, 2, start_to_close_timeout=_TIMEOUT)


@workflow.defn(name="FloorApproval")
class FloorApproval:
    def __init__(self) -> None:
        self.approved = False

    @workflow.run
    async def run(self, extra: str = "") -> str:
        if extra == "marker":
            workflow.patched("bench.floor-extra")
            workflow.upsert_search_attributes([_STATUS.value_set("starting")])
        summary = "x" * 4000 if extra == "summary" else None
        await workflow.execute_activity(
            FLOOR_MODEL, 0, start_to_close_timeout=_TIMEOUT, summary=summary
        )
        if extra == "local-activity":
            await workflow.execute_local_activity(FLOOR_TOOL, 0, start_to_close_timeout=_TIMEOUT)
        workflow.upsert_search_attributes([_STATUS.value_set("waiting_approval")])
        await workflow.wait_condition(lambda: self.approved)
        await workflow.execute_activity(FLOOR_TOOL, 1, start_to_close_timeout=_TIMEOUT)
        return await workflow.execute_activity(FLOOR_MODEL, 1, start_to_close_timeout=_TIMEOUT)

    @workflow.signal
    def approve(self) -> None:
        self.approved = True


FLOOR_WORKFLOWS: list[type] = [FloorRun, FloorFanout, FloorBackground, FloorApproval]


def floor_activities(latency_s: float) -> list[Any]:
    @activity.defn(name=FLOOR_MODEL)
    async def model(turn: int) -> str:
        if latency_s > 0:
            await asyncio.sleep(latency_s)
        return "ok"

    @activity.defn(name=FLOOR_TOOL)
    async def tool(turn: int) -> str:
        return "ok"

    return [model, tool]
