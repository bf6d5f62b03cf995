"""Forking a run (``relaykit.fork_run``, ``relaykit fork``): a new run seeded with turns 1..N of
an existing one, against the real dev server, a worker and the scripted model over HTTP."""

from __future__ import annotations

import asyncio
import os
import uuid
from typing import Any

import pytest
from temporalio.client import Client

from relaykit import Agent, ConfigurationError, ForkError, fork_run, get_run, start_run, tool
from relaykit.devserver import DevServer
from relaykit.search_attributes import RELAY_FORK_OF
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, call, text
from tests.support import cli, history_events, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def counting_tools(invocations: list[str]) -> tuple[Any, Any]:
    @tool
    def lookup(key: str) -> str:
        """Look a key up."""
        invocations.append(f"lookup {key}")
        return f"{key} is 42"

    @tool(needs_approval=True)
    def refund(amount: int) -> str:
        """Refund money."""
        invocations.append(f"refund {amount}")
        return f"refunded {amount}"

    return lookup, refund


def turns_sent(request: ScriptedRequest) -> list[tuple[str, str]]:
    """(role, text or tool-call names) of each non-system message a request carried."""
    out = []
    for m in request.messages:
        if m["role"] in ("system", "developer"):
            continue
        calls = [c["function"]["name"] for c in m.get("tool_calls") or []]
        out.append((m["role"], ",".join(calls) if calls else str(m.get("content") or "")))
    return out


async def test_a_fork_of_a_finished_run_at_turn_2_sends_exactly_turns_1_and_2_and_runs_no_tool_again(  # noqa: E501
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # The fork's first model request holds the prompt, turns 1-2 and the new input, nothing of
    # turn 3; its tools did not run again; it counts turns on from 2 and says where it came from.
    invocations: list[str] = []
    lookup, _ = counting_tools(invocations)
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("lookup", key="a"),
            call("lookup", key="b"),
            text("first answer"),
            text("forked answer"),
        ],
    )
    agent = Agent(name="forked_researcher", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        original = await start_run(client, agent, "find a and b", task_queue=worker.task_queue)
        first = await original.result()
        events_before = len(await history_events(original.workflow))
        fork = await fork_run(client, original.id, 2, input="now answer in one word")
        result = await fork.result()
        assert len(await history_events(original.workflow)) == events_before  # untouched
        code, out, err = await cli(
            "fork", original.id, "--at-turn", "4", address=temporal_server.address
        )
    assert first.output == "first answer"
    assert result.output == "forked answer"
    assert result.turns == 3 and result.forked_from == f"{original.id}@2"
    assert invocations == ["lookup a", "lookup b"]
    sent = turns_sent(model_server.requests(model.name)[3])
    assert sent == [
        ("user", "find a and b"),
        ("assistant", "lookup"),
        ("tool", "a is 42"),
        ("assistant", "lookup"),
        ("tool", "b is 42"),
        ("user", "now answer in one word"),
    ]
    described = await fork.workflow.describe()
    assert described.typed_search_attributes.get(RELAY_FORK_OF) == f"{original.id}@2"
    assert code == 1 and out == ""
    assert err.strip().splitlines() == [
        f"error: run {original.id!r} has 3 finished turns: cannot fork at turn 4 "
        "(hint: --at-turn takes 1..3)"
    ]


async def test_a_running_run_forks_from_a_finished_turn_but_not_from_one_waiting_for_approval(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The original waits for approval at turn 2: a fork at turn 1 goes on at once (the original
    # still waits), a fork at turn 2 is refused with why.
    invocations: list[str] = []
    lookup, refund = counting_tools(invocations)
    model = scripted_model(model_server)

    def respond(request: ScriptedRequest) -> Any:
        if request.last_user_text == "skip the refund":
            return text("no refund then")
        if len(request.tool_results) == 0:
            return call("lookup", key="order")
        if len(request.tool_results) == 1:
            return call("refund", amount=5)
        return text("refund done")

    model_server.respond(model.name, respond)
    agent = Agent(name="forked_refunder", model=model, tools=[lookup, refund])
    async with serving(client, agent) as worker:
        original = await start_run(client, agent, "refund the order", task_queue=worker.task_queue)
        for _ in range(200):
            if await original.pending_approvals():
                break
            await asyncio.sleep(0.05)
        with pytest.raises(ForkError) as refused:
            await fork_run(client, original.id, 2)
        fork = await fork_run(client, original.id, 1, input="skip the refund")
        forked = await fork.result()
        assert (await original.state()).status == "waiting_approval"
        [pending] = await original.pending_approvals()
        await original.approve(pending.call_id)
        finished = await original.result()
    assert "turn 2" in refused.value.message and "still running" in refused.value.message
    assert forked.output == "no refund then" and forked.turns == 2
    assert finished.output == "refund done"
    assert invocations == ["lookup order", "refund 5"]


async def test_a_fork_reaches_back_across_continue_as_new(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # The original continued as new after every 2 turns; `relaykit fork --at-turn 3 --wait`
    # starts a run holding turns 1-3, read from both runs of the chain, counting on from 3.
    invocations: list[str] = []
    lookup, _ = counting_tools(invocations)
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("lookup", key="k1"),
            call("lookup", key="k2"),
            call("lookup", key="k3"),
            text("done"),
            text("forked done"),
        ],
    )
    agent = Agent(name="forked_long", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        original = await start_run(
            client,
            agent,
            "three lookups",
            task_queue=worker.task_queue,
            continue_as_new_after_turns=2,
        )
        assert (await original.result()).output == "done"
        history = await history_events(client.get_workflow_handle(original.id))
        started = history[0].workflow_execution_started_event_attributes
        assert started.continued_execution_run_id  # the last run is not the first
        code, out, err = await cli(
            "fork",
            original.id,
            "--at-turn",
            "3",
            "--wait",
            "--id",
            f"{original.id}-again",
            address=temporal_server.address,
        )
        assert code == 0, err
        result = await get_run(client, f"{original.id}-again").result()
    assert out.splitlines() == [f"{original.id}-again", "forked done"]
    assert result.output == "forked done" and result.turns == 4
    assert turns_sent(model_server.requests(model.name)[4]) == [
        ("user", "three lookups"),
        ("assistant", "lookup"),
        ("tool", "k1 is 42"),
        ("assistant", "lookup"),
        ("tool", "k2 is 42"),
        ("assistant", "lookup"),
        ("tool", "k3 is 42"),
    ]
    assert invocations == ["lookup k1", "lookup k2", "lookup k3"]


async def test_a_fork_after_a_handoff_goes_on_with_the_agent_that_took_over(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Turn 1 handed off to billing: a fork at turn 1 starts with billing (its instructions, its
    # model) and the handoff in the transcript.
    invocations: list[str] = []
    lookup, _ = counting_tools(invocations)
    triage_model, billing_model = scripted_model(model_server), scripted_model(model_server)
    model_server.script(triage_model.name, [call("transfer_to_forked_billing")])
    model_server.script(
        billing_model.name,
        [
            call("lookup", key="invoice"),
            text("billing answer"),
            text("forked billing answer"),
        ],
    )
    billing = Agent(
        name="forked_billing",
        instructions="You handle invoices.",
        model=billing_model,
        tools=[lookup],
    )
    triage = Agent(
        name="forked_triage", instructions="Route.", model=triage_model, handoffs=[billing]
    )
    async with serving(client, triage) as worker:
        original = await start_run(client, triage, "charged twice", task_queue=worker.task_queue)
        assert (await original.result()).final_agent == "forked_billing"
        fork = await fork_run(client, original.id, 1, input="again please")
        result = await fork.result()
    assert result.output == "forked billing answer" and result.final_agent == "forked_billing"
    request = model_server.requests(billing_model.name)[2]
    assert "You handle invoices." in request.system
    sent = turns_sent(request)
    assert [role for role, _ in sent] == ["user", "assistant", "tool", "user"]
    assert sent[1] == ("assistant", "transfer_to_forked_billing")
    assert sent[3] == ("user", "again please")
    assert model_server.request_count(triage_model.name) == 1
    assert invocations == ["lookup invoice"]


async def test_a_namespace_without_relay_fork_of_still_gets_the_other_attributes_and_forks(
    model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # A namespace registered before RelayForkOf existed: runs still upsert RelayStatus etc., and
    # a fork starts without the attribute, its origin still in its result.
    import uuid
    from datetime import timedelta

    from google.protobuf.duration_pb2 import Duration
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )
    from temporalio.api.workflowservice.v1 import RegisterNamespaceRequest
    from temporalio.contrib.pydantic import pydantic_data_converter

    from relaykit.search_attributes import RELAY_STATUS, UPSERTED

    namespace = f"older-{uuid.uuid4().hex[:8]}"
    first = await Client.connect(temporal_server.address, data_converter=pydantic_data_converter)
    await first.workflow_service.register_namespace(
        RegisterNamespaceRequest(
            namespace=namespace,
            workflow_execution_retention_period=Duration(
                seconds=int(timedelta(days=1).total_seconds())
            ),
        )
    )
    client = await Client.connect(
        temporal_server.address, namespace=namespace, data_converter=pydantic_data_converter
    )
    for _ in range(200):  # a new namespace reaches the frontend's cache after a moment
        try:
            await client.operator_service.add_search_attributes(
                AddSearchAttributesRequest(
                    namespace=namespace,
                    search_attributes={
                        key.name: IndexedValueType.ValueType(int(key.indexed_value_type))
                        for key in UPSERTED
                    },
                )
            )
            break
        except Exception:  # noqa: BLE001 - namespace not visible yet
            await asyncio.sleep(0.1)
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=namespace)
    )
    assert "RelayStatus" in listed.custom_attributes
    assert "RelayForkOf" not in listed.custom_attributes
    invocations: list[str] = []
    lookup, _ = counting_tools(invocations)
    model = scripted_model(model_server)
    model_server.script(model.name, [call("lookup", key="x"), text("one"), text("two")])
    agent = Agent(name="forked_older", model=model, tools=[lookup])
    async with serving(client, agent) as worker:
        original = await start_run(client, agent, "look x up", task_queue=worker.task_queue)
        assert (await original.result()).output == "one"
        fork = await fork_run(client, original.id, 1)
        result = await fork.result()
        original_attrs = (await original.workflow.describe()).typed_search_attributes
        fork_attrs = (await fork.workflow.describe()).typed_search_attributes
    assert result.output == "two" and result.forked_from == f"{original.id}@1"
    assert original_attrs.get(RELAY_STATUS) == "completed"
    assert fork_attrs.get(RELAY_STATUS) == "completed"
    assert invocations == ["lookup x"]


async def test_a_fork_of_a_run_with_a_long_id_gets_an_id_that_fits(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # `<origin id>-fork<turn>-<hex>` is over 1,000 bytes for a 995-byte origin id: the origin's
    # part is cut (before: the server refused the start). An id given that is too long is refused.
    model = scripted_model(model_server)
    model_server.script(model.name, [text("first answer"), text("forked answer")])
    agent = Agent(name="long_forked", model=model)
    long_id = f"{uuid.uuid4().hex[:8]}-" + "账" * 329  # 996 bytes
    async with serving(client, agent) as worker:
        original = await start_run(client, agent, "hi", task_queue=worker.task_queue, id=long_id)
        await original.result()
        with pytest.raises(ConfigurationError, match="the fork's id is 1001 bytes long"):
            await fork_run(client, original.id, 1, id="f" * 1001)
        fork = await fork_run(client, original.id, 1, input="again")
        result = await fork.result()
    assert result.output == "forked answer" and result.forked_from == f"{long_id}@1"
    assert fork.id.startswith(long_id[:300]) and "-fork1-" in fork.id
    assert len(fork.id.encode()) <= 1000


async def test_a_run_whose_recorded_input_this_release_refuses_is_one_clear_error(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # A run started by another client with a budget today's Budget refuses (a negative request
    # limit): it failed at its first task. Forking it said nothing but pydantic's traceback.
    from temporalio.client import WorkflowFailureError

    from relaykit.workflows.loop import AGENT_RUN_WORKFLOW

    agent = Agent(name="refused_input", model=scripted_model(model_server))
    run_id = f"refused-{uuid.uuid4().hex[:8]}"
    async with serving(client, agent) as worker:
        handle = await client.start_workflow(
            AGENT_RUN_WORKFLOW,
            {"agent": agent.name, "input": "hi", "budget": {"max_requests": -1}},
            id=run_id,
            task_queue=worker.task_queue,
        )
        with pytest.raises(WorkflowFailureError):
            await handle.result()
    with pytest.raises(
        ForkError,
        match=r"its recorded input cannot be read by this relaykit "
        r"\(budget\.max_requests: Input should be greater than or equal to 0\)",
    ):
        await fork_run(client, run_id, 1)
    code, out, err = await cli("fork", run_id, "--at-turn", "1", address=temporal_server.address)
    assert code != 0 and out == "" and "Traceback" not in err
    assert "its recorded input cannot be read" in err and len(err.strip().splitlines()) == 1
