"""Record the histories that ``tests/test_replay.py`` replays.

Run it by hand from the repository root when a change to the workflow code is *meant* to change
what runs do (see ``docs/replay.md`` first: usually a change must replay the old histories
unchanged, behind ``workflow.patched``)::

    python -m tests.histories.record              # every scenario
    python -m tests.histories.record boundaries   # only the named ones

It starts its own in-memory Temporal dev server and scripted model server, runs the scenarios
of :mod:`tests.histories.agents` (a tool loop, a handoff, an approval answered once by update and
once by signal, a turn with a repeated call id, cut-off arguments and approvals in request
order, a run before lovia's semantics, repeated calls of two kinds under the loop guard,
decisions recorded by the local activity, and an approval run recorded with
``relaykit.run-setup.v4`` and again with v5 and v6)
with fixed workflow ids and task queues, and writes each history to
``tests/histories/<scenario>.json``. Commit the JSON files with the change.
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit import ApprovalDecision, RunHandle, Worker, start_run
from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer, Step, batch, call, text
from tests.histories.agents import MODEL_NAME, SCENARIOS, SEARCH_ATTRIBUTES, Scenario, model

HERE = Path(__file__).resolve().parent
IDENTITY = "relaykit-histories"
"""Worker and client identity written into the histories (instead of pid@hostname)."""

SCRIPTS: dict[str, list[Step]] = {
    "tool_loop": [
        batch(call("add", id="call_add_1", a=2, b=3), call("add", id="call_add_2", a=0, b=0)),
        call("add", id="call_add_3", a=5, b=10),
        text("15"),
    ],
    "handoff": [
        call("transfer_to_billing", id="call_handoff", reason="double charge"),
        call("look_up_invoice", id="call_invoice", invoice_id="INV-7"),
        text("Invoice INV-7 was charged twice; a refund of 42 EUR is on its way."),
    ],
    "approval": [
        batch(
            call("refund", id="call_refund_a1", order_id="A1", amount=30),
            call("refund", id="call_refund_b2", order_id="B2", amount=5),
        ),
        text("Refunded 30 EUR on A1; the refund on B2 was rejected."),
    ],
    # Recorded with the run setup markers, unique call ids, bad arguments refused and approvals
    # in request order: the provider repeats an id, and a third call's JSON is cut off.
    "boundaries": [
        batch(
            call("refund", id="call_dup", order_id="A1", amount=30),
            call("refund", id="call_dup", order_id="B2", amount=5),
            call("refund", raw_arguments='{"order_id": "C3"', id="call_c3"),
        ),
        text("Refunded 30 EUR on A1; B2 was rejected; C3 needs valid arguments."),
    ],
    "approval_v4": [
        batch(
            call("refund", id="call_refund_a1", order_id="A1", amount=30),
            call("refund", id="call_refund_b2", order_id="B2", amount=5),
        ),
        text("Refunded 30 EUR on A1; the refund on B2 was rejected."),
    ],
    # Recorded before the one tool path: the repeated cancel_subagent ran, the repeated add
    # was refused by the loop guard (max_repeated_calls=1).
    "guard_kinds": [
        call("cancel_subagent", raw_arguments='{"id": "task-9"}', id="call_cancel_1"),
        call("cancel_subagent", raw_arguments='{"id": "task-9"}', id="call_cancel_2"),
        call("add", id="call_add_1", a=1, b=1),
        call("add", id="call_add_2", a=1, b=1),
        text("2"),
    ],
    # Recorded before lovia's semantics (issue 25): earlier tool names, strict handoff
    # arguments, the handoff after the turn's other calls, two repairs of structured output.
    "before_lovia": [
        call("transfer_to_billing_team_40edd973", id="call_h1", reason="refund", priority="high"),
        batch(
            call("transfer_to_billing_team_40edd973", id="call_h2", reason="double charge"),
            call("check_account", id="call_check", email="a@b.c"),
        ),
        text("refunded"),
        text('{"queue": "billing"}'),
        text('{"queue": "billing", "refunded": true}'),
    ],
    # Recorded with decisions recorded by the local activity (relaykit.record_decisions).
    "decisions": [
        batch(
            call("refund", id="call_refund", order_id="A1", amount=30),
            call("add", id="call_add_1", a=1, b=1),
        ),
        call("subtract", id="call_subtract", a=2, b=1),
        call("add", id="call_add_2", a=1, b=1),
        text("two"),
        text('{"total": 2}'),
    ],
}
SCRIPTS["approval_v5"] = SCRIPTS["approval_v4"]
SCRIPTS["approval_v6"] = SCRIPTS["approval_v4"]


async def _wait_for_approvals(handle: RunHandle, count: int) -> None:
    for _ in range(500):
        if len(await handle.pending_approvals()) >= count:
            return
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{handle.id} never asked for {count} approvals")


async def _next_approval(handle: RunHandle, answered: str) -> str:
    for _ in range(500):
        waiting = [p.call_id for p in await handle.pending_approvals() if p.call_id != answered]
        if waiting:
            return waiting[0]
        await asyncio.sleep(0.02)
    raise TimeoutError(f"{handle.id} never asked for a second approval")


async def record(scenario: Scenario, client: Client, base_url: str) -> str:
    worker = Worker(
        client,
        scenario.agent,
        task_queue=scenario.task_queue,
        default_model=model(base_url),
        search_attributes=SEARCH_ATTRIBUTES,
        identity=IDENTITY,
    )
    async with worker:
        handle = await start_run(
            client,
            scenario.agent,
            scenario.prompt,
            task_queue=scenario.task_queue,
            id=scenario.workflow_id,
        )
        if scenario.name == "boundaries":  # one approval at a time, in request order
            await _wait_for_approvals(handle, 1)
            await handle.approve("call_dup")
            second = await _next_approval(handle, "call_dup")
            await handle.workflow.signal(
                "approve_signal",
                ApprovalDecision(call_id=second, approved=False, reason="duplicate"),
            )
        if scenario.name == "decisions":
            await _wait_for_approvals(handle, 1)
            await handle.approve("call_refund")
        if scenario.name in ("approval_v4", "approval_v5", "approval_v6"):  # in request order
            await _wait_for_approvals(handle, 1)
            await handle.approve("call_refund_a1")
            await _next_approval(handle, "call_refund_a1")
            await handle.workflow.signal(
                "approve_signal",
                ApprovalDecision(call_id="call_refund_b2", approved=False, reason="duplicate"),
            )
        if scenario.name == "approval":  # recorded when both waited at once
            await _wait_for_approvals(handle, 2)
            await handle.approve("call_refund_a1")
            await handle.workflow.signal(
                "approve_signal",
                ApprovalDecision(call_id="call_refund_b2", approved=False, reason="duplicate"),
            )
        result = await handle.result()
        history = await handle.workflow.fetch_history()
    path = HERE / scenario.history_file
    path.write_text(json.dumps(json.loads(history.to_json()), indent=1) + "\n")
    return f"{path.name}: {len(history.events)} events, output {result.output!r}"


async def main(names: list[str]) -> None:
    with ScriptedModelServer() as model_server:
        async with DevServer(port=0, headless=True, in_memory=True) as server:
            client = await Client.connect(
                server.address, data_converter=pydantic_data_converter, identity=IDENTITY
            )
            for scenario in SCENARIOS:
                if names and scenario.name not in names:
                    continue
                model_server.script(MODEL_NAME, SCRIPTS[scenario.name])
                print(await record(scenario, client, f"{model_server.base_url}/v1"))


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1:]))
