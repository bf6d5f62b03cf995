"""The runs list (``relaykit.run_list``, ``relaykit runs``): one page of runs from visibility with
what each waits for (a person's approval, a decision on an unknown outcome: from search
attributes; a retry's backoff with its attempt and next try: from the page's descriptions),
tenant, cost and last activity; counts per reason; filters; page tokens; and a bounded number
of requests per page. Against the real dev server, a worker and the scripted model."""

from __future__ import annotations

import os
import time
import uuid
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from temporalio.client import Client
from temporalio.common import RetryPolicy
from temporalio.exceptions import ApplicationError

from relaykit import Agent, RunHandle, start_run, tool
from relaykit.devserver import DevServer
from relaykit.run_list import RunFilter, RunPage, list_runs_page
from relaykit.search_attributes import RELAY_LAST_ACTIVITY, RELAY_WAITING_FOR
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import cli, eventually, new_namespace, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@tool(needs_approval=True)
def refund(order_id: str) -> str:
    """Refund an order.

    Args:
        order_id: The order.
    """
    return f"refunded {order_id}"


@tool(
    timeout=1,
    retry=RetryPolicy(maximum_attempts=3, initial_interval=timedelta(milliseconds=100)),
    on_unknown="ask",
)
def pay_late(key: str) -> str:
    """A write whose first attempt outlives its timeout: a person decides on running it again.

    Args:
        key: Anything.
    """
    time.sleep(2)
    return "paid late"


@tool(effect="read", retry=RetryPolicy(maximum_attempts=5, initial_interval=timedelta(minutes=5)))
def lookup(q: str) -> str:
    """An upstream that is down: retried after a long backoff.

    Args:
        q: What.
    """
    raise ApplicationError("upstream down")  # retryable


async def test_a_page_says_what_each_run_waits_for_with_counts_filters_and_page_tokens(
    client: Client,
    model_server: ScriptedModelServer,
    temporal_server: DevServer,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tag = f"rl{uuid.uuid4().hex[:8]}"
    models = [scripted_model(model_server) for _ in range(3)]
    model_server.script(models[0].name, [call("refund", order_id="A1"), text("done")])
    model_server.script(models[1].name, [call("pay_late", id="c_pay", key="k"), text("done")])
    model_server.script(models[2].name, [call("lookup", q="x"), text("done")])
    asker = Agent(name=f"asker_{tag}", model=models[0], tools=[refund])
    unsure = Agent(name=f"unsure_{tag}", model=models[1], tools=[pay_late])
    flaky = Agent(name=f"flaky_{tag}", model=models[2], tools=[lookup])
    handles: list[RunHandle] = []
    async with serving(client, [asker, unsure, flaky]) as worker:
        try:
            for agent, extra in ((asker, {"tenant": "acme"}), (unsure, {}), (flaky, {})):
                handles.append(
                    await start_run(
                        client,
                        agent,
                        "go",
                        id=f"{tag}-{agent.name}",
                        task_queue=worker.task_queue,
                        **extra,
                    )
                )
            ids = {agent.name: f"{tag}-{agent.name}" for agent in (asker, unsure, flaky)}
            mine = RunFilter(text=tag)
            page = RunPage(rows=[])

            async def all_waiting() -> bool:
                nonlocal page
                page = await list_runs_page(client, mine, counts=True)
                reasons = {row.run_id: row.waiting and row.waiting.reason for row in page.rows}
                return reasons == {
                    ids[asker.name]: "approval",
                    ids[unsure.name]: "unknown_outcome",
                    ids[flaky.name]: "backoff",
                }

            await eventually(all_waiting, "each run waiting, in visibility")
            rows = {row.run_id: row for row in page.rows}
            now = datetime.now(UTC)
            approval = rows[ids[asker.name]]
            assert (approval.agent, approval.status, approval.tenant) == (
                asker.name,
                "waiting_approval",
                "acme",
            )
            assert approval.cost_usd == 0.0 and approval.tokens == 15
            assert approval.started is not None and approval.last_activity is not None
            assert approval.started <= approval.last_activity <= now
            backoff = rows[ids[flaky.name]].waiting
            assert backoff is not None and backoff.attempt == 2
            assert backoff.next_try is not None and backoff.next_try > now
            assert "lookup" in backoff.detail and "upstream down" in backoff.detail
            assert page.counts == {"approval": 1, "unknown_outcome": 1, "budget": 0, "paused": 0}
            assert page.next_page_token is None

            described = await handles[1].workflow.describe()  # what any visibility query sees
            attributes = described.typed_search_attributes
            assert attributes.get(RELAY_WAITING_FOR) == "unknown_outcome"
            assert attributes.get(RELAY_LAST_ACTIVITY) is not None

            async def only(where: RunFilter) -> list[str]:
                return [row.run_id for row in (await list_runs_page(client, where)).rows]

            assert await only(RunFilter(text=tag, reason="unknown_outcome")) == [ids[unsure.name]]
            assert await only(RunFilter(text=tag, reason="approval")) == [ids[asker.name]]
            assert await only(RunFilter(text=tag, reason="backoff")) == [ids[flaky.name]]
            assert await only(RunFilter(text=tag, tenant="acme")) == [ids[asker.name]]
            assert await only(RunFilter(text=tag, agent=flaky.name)) == [ids[flaky.name]]
            assert await only(RunFilter(text=tag, status="completed")) == []

            # Pages of one: each page one list request, four counts, a describe per open row
            # (the store may hand out a token for a last, empty page).
            calls: Counter[str] = Counter()
            service = client.workflow_service
            for name in (
                "list_workflow_executions",
                "count_workflow_executions",
                "describe_workflow_execution",
            ):
                monkeypatch.setattr(service, name, _counted(getattr(service, name), name, calls))
            seen, token = [], None
            while True:
                calls.clear()
                one = await list_runs_page(client, mine, page_size=1, page_token=token, counts=True)
                assert calls["list_workflow_executions"] == 1
                assert calls["count_workflow_executions"] == 4
                assert calls["describe_workflow_execution"] == len(one.rows) <= 1
                seen += [row.run_id for row in one.rows]
                token = one.next_page_token
                if token is None:
                    break
            monkeypatch.undo()
            assert sorted(seen) == sorted(ids.values()) and len(seen) == 3

            code, out, err = await cli("runs", "--text", tag, address=temporal_server.address)
            assert code == 0, err
            assert "waiting: 1 approval · 1 unknown outcome · 0 budget · 0 paused" in err
            line = next(line for line in out.splitlines() if line.startswith(ids[unsure.name]))
            assert "waiting_approval" in line and "unknown outcome" in line
            line = next(line for line in out.splitlines() if line.startswith(ids[flaky.name]))
            assert "backoff (attempt 2, in " in line
            code, out, err = await cli(
                "runs", "--text", tag, "--reason", "sleeping", address=temporal_server.address
            )
            assert code == 1 and "unknown reason 'sleeping'" in err
        finally:
            for handle in handles:
                await handle.cancel()
            for handle in handles:
                try:
                    await handle.result()
                except Exception:  # noqa: BLE001 - cancelled, as asked
                    pass


def _counted(method: Any, name: str, calls: Counter[str]) -> Any:
    async def call(*args: Any, **kwargs: Any) -> Any:
        calls[name] += 1
        return await method(*args, **kwargs)

    return call


async def test_a_namespace_registered_before_the_list_attributes_still_lists_and_counts(
    client: Client,
) -> None:
    # Without RelayWaitingFor a run waiting for a person counts as an approval, and the
    # unknown outcomes are not counted; the page itself never asks for the attribute.
    from temporalio.service import RPCError

    from relaykit import search_attributes
    from relaykit.run_list import count_waiting

    bare = await new_namespace(client, "before")
    namespace = bare.namespace
    older = [k for k in search_attributes.ALL if k not in search_attributes.LIST_ATTRIBUTES]

    async def registered() -> bool:
        try:
            await search_attributes.ensure_registered(bare, namespace, older)
            await bare.count_workflows("RelayStatus = 'paused'")
        except RPCError:
            return False
        return True

    await eventually(registered, "the new namespace with the older attributes")
    assert await count_waiting(bare) == {"approval": 0, "budget": 0, "paused": 0}
    page = await list_runs_page(bare, counts=True)
    assert page.rows == [] and page.counts == {"approval": 0, "budget": 0, "paused": 0}


def test_the_runs_table_cuts_no_cell_on_a_narrow_terminal() -> None:
    # 60 columns, a table that needs about 130: every id, status and figure is printed whole
    # (the terminal wraps the line); before, the status read "waiting_pa…" and the id was cut.
    import io

    from rich.console import Console

    from relaykit.cli.listing import print_uncut
    from relaykit.run_list import RunRow, RunWaiting
    from relaykit.watch import runs_table

    now = datetime.now(UTC)
    row = RunRow(
        run_id="research_lead-8313e229bf0e",
        execution="e",
        agent="research_lead",
        status="waiting_parent_budget",
        waiting=RunWaiting(reason="approval"),
        tenant="acme",
        tokens=123456,
        cost_usd=0.0123,
        started=now - timedelta(hours=3),
        last_activity=now - timedelta(minutes=2),
        build_id="build-2026-12-01",
    )
    out = io.StringIO()
    print_uncut(runs_table([row]), Console(width=60, file=out))
    printed = out.getvalue()
    for cell in (
        row.run_id,
        row.status,
        "approval",
        row.agent,
        "123,456",
        "$0.0123",
        "build-2026-12-01",
    ):
        assert cell in printed, (cell, printed)
    assert "…" not in printed


def test_a_child_waiting_for_its_parents_budget_says_so_in_the_list() -> None:
    # Its status is not one a person acts on (the parent is), so it was the one waiting run
    # whose WAITING cell was empty.
    from temporalio.api.enums.v1 import WorkflowExecutionStatus as Status
    from temporalio.api.workflow.v1 import WorkflowExecutionInfo
    from temporalio.client import WorkflowExecution
    from temporalio.common import SearchAttributePair, TypedSearchAttributes
    from temporalio.converter import DataConverter, encode_search_attributes

    from relaykit.run_list import row_of
    from relaykit.search_attributes import RELAY_STATUS
    from relaykit.watch import waiting_text

    def listed(status: str) -> Any:
        info = WorkflowExecutionInfo(status=Status.WORKFLOW_EXECUTION_STATUS_RUNNING)
        info.execution.workflow_id = "lead-1/task-2"
        encode_search_attributes(
            TypedSearchAttributes([SearchAttributePair(RELAY_STATUS, status)]),
            info.search_attributes,
        )
        return row_of(WorkflowExecution._from_raw_info(info, "default", DataConverter.default))

    child = listed("waiting_parent_budget")
    assert child.waiting is not None and child.waiting.reason == "parent_budget"
    assert waiting_text(child.waiting) == "parent's budget"
    assert listed("running").waiting is None
    assert waiting_text(listed("budget_reached").waiting) == "budget"
