"""The summary call of ``ContextPolicy(strategy="summarize")``: a steer while it is in flight, and
a fork of a run that summarised, against the real dev server, a worker and the scripted model
over HTTP."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client
from temporalio.worker import Replayer

from relaykit import Agent, ContextPolicy, fork_run, registry, start_run, tool
from relaykit.authors import current_user
from relaykit.devserver import DevServer
from relaykit.graph import AgentGraph
from relaykit.sandbox import sandbox_runner
from relaykit.testing.scripted_server import (
    ScriptedModelServer,
    ScriptedRequest,
    Step,
    call,
    text,
)
from relaykit.workflows import model_turn
from relaykit.workflows.agent_run import AgentRun
from tests.support import activity_summaries, cli, history_events, scripted_model, serving

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEER = "actually: stop after this and say finished"


@tool
def step(n: int) -> str:
    """Do one step of the job."""
    return f"step {n} done"


def is_summary(request: ScriptedRequest) -> bool:
    return "compress a conversation" in request.system


def tool_turn(n: int, tokens: int) -> Step:
    """A call of ``step`` that reports ``tokens`` input tokens."""
    return Step(calls=call("step", n=n).calls, usage=(tokens, 5))


def summarising_agent(model: Any) -> Agent:
    # Turns report 40 input tokens; past 30, everything before the last turn is summarised.
    return Agent(
        name=f"summariser_{uuid.uuid4().hex[:6]}",
        model=model,
        instructions="Do the job one step at a time.",
        tools=[step],
        context_policy=ContextPolicy(max_input_tokens=30, keep_last_turns=1),
    )


def task_failures(history: list[Any]) -> list[str]:
    return [
        e.workflow_task_failed_event_attributes.failure.message
        for e in history
        if e.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED
    ]


async def replays(client: Client, agent: Agent, workflow_id: str) -> bool:
    """Whether today's workflow code replays the run's history without a nondeterminism."""
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    build = f"summary-{uuid.uuid4().hex[:8]}"
    graph = AgentGraph.build([agent])
    registry.register(f"replay-{build}", graph)
    try:
        replayer = Replayer(
            workflows=[AgentRun],
            data_converter=client.data_converter,
            workflow_runner=sandbox_runner(),
            build_id=build,
        )
        result = await replayer.replay_workflow(history, raise_on_replay_failure=False)
    finally:
        registry.unregister(f"replay-{build}", graph)
    return result.replay_failure is None


async def test_a_steer_during_a_summary_call_is_accepted_at_once_and_the_next_turn_has_its_text(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer
) -> None:
    # The summary call is held while `relaykit steer` runs: the steer is accepted, the summary
    # finishes (made once, not cancelled), and the turn's call after it carries the text once.
    gate = threading.Event()
    model = scripted_model(model_server)
    turns: list[int] = []

    def respond(request: ScriptedRequest) -> Step:
        if is_summary(request):
            return text("SUMMARY: step 1 done", hold=gate)
        turns.append(request.index)
        if len(turns) <= 2:
            return tool_turn(len(turns), 40)
        return text("finished")

    model_server.respond(model.name, respond)
    agent = summarising_agent(model)
    try:
        async with serving(client, agent) as worker:
            handle = await start_run(client, agent, "do the job", task_queue=worker.task_queue)
            requests = await asyncio.to_thread(model_server.wait_for_requests, model.name, 3, 30)
            assert is_summary(requests[2])
            steering = asyncio.create_task(
                cli("steer", handle.id, STEER, address=temporal_server.address)
            )
            # Hold the summary until the steer has answered or the run's workflow task failed.
            for _ in range(600):
                if steering.done() or task_failures(await history_events(handle.workflow)):
                    break
                await asyncio.sleep(0.05)
            gate.set()
            code, out, err = await steering
            result = await handle.result()
            events = await handle.events()
            history = await history_events(handle.workflow)
            labels = await activity_summaries(handle.workflow, client)
            replayed = await replays(client, agent, handle.id)
    finally:
        gate.set()
    assert task_failures(history) == []
    assert code == 0, err
    assert out.strip() == "queued: no turn's model call in flight, the next one has your message"
    assert result.output == "finished" and result.turns == 3
    assert [m.content for m in result.transcript].count(STEER) == 1
    sent = model_server.requests(model.name)
    assert [is_summary(r) for r in sent] == [False, False, True, False]  # the summary once
    assert [m.get("content") for m in sent[3].messages].count(STEER) == 1  # the next call
    assert [e.data for e in events if e.kind == "steered"] == [
        {"text": STEER, "cancelled_call": False, "by": current_user()}  # the CLI's default
    ]
    assert [e.data["text"] for e in events if e.kind == "message_injected"] == [STEER]
    assert [label.split(" · ")[1] for label in labels if label.startswith(agent.name)] == [
        "turn 1",
        "turn 2",
        "summary after turn 2",
        "turn 3",
    ]
    assert replayed


async def original_and_forks(
    client: Client, model_server: ScriptedModelServer, at_turns: list[int]
) -> tuple[list[ScriptedRequest], dict[int, ScriptedRequest], list[str]]:
    """A run that summarises after turn 2 (turns 1-3 call a tool, turn 4 answers), then a fork
    of it at each of ``at_turns``: the original's turn requests, each fork's first request, and
    the original's model-call labels."""
    model = scripted_model(model_server)
    forking = False

    def respond(request: ScriptedRequest) -> Step:
        if is_summary(request):
            return text("SUMMARY: step 1 done")
        if forking:
            return text("forked answer")
        turn = sum(1 for r in model_server.requests(model.name) if not is_summary(r))
        if turn <= 3:
            return tool_turn(turn, 40 if turn <= 2 else 10)
        return text("finished")

    model_server.respond(model.name, respond)
    agent = summarising_agent(model)
    firsts: dict[int, ScriptedRequest] = {}
    async with serving(client, agent) as worker:
        original = await start_run(client, agent, "do the job", task_queue=worker.task_queue)
        assert (await original.result()).output == "finished"
        labels = [  # the model calls' (a tool call's names its tool)
            label
            for label in await activity_summaries(original.workflow, client)
            if label.endswith(f" · {model.label}")
        ]
        turn_requests = [r for r in model_server.requests(model.name) if not is_summary(r)]
        forking = True
        for at in at_turns:
            before = model_server.request_count(model.name)
            fork = await fork_run(client, original.id, at)
            assert (await fork.result()).output == "forked answer"
            firsts[at] = model_server.requests(model.name)[before]
    return turn_requests, firsts, labels


def same_request(fork: ScriptedRequest, original: ScriptedRequest) -> None:
    assert fork.messages == original.messages  # system prompt, task, calls, results, summary
    assert fork.body.get("tools") == original.body.get("tools")


async def test_a_fork_before_and_after_a_summary_starts_from_the_originals_request_at_that_turn(
    client: Client, model_server: ScriptedModelServer
) -> None:
    turn_requests, firsts, labels = await original_and_forks(client, model_server, [1, 2, 3])
    assert [label.split(" · ")[1] for label in labels] == [
        "turn 1",
        "turn 2",
        "summary after turn 2",
        "turn 3",
        "turn 4",
    ]
    # At turn 1: the task, turn 1's call and its result (not the summary prompt).
    assert [m["role"] for m in firsts[1].messages] == ["system", "user", "assistant", "tool"]
    for at in (1, 2, 3):
        same_request(firsts[at], turn_requests[at])
    assert "SUMMARY: step 1 done" in str(firsts[2].messages)


async def test_a_fork_reads_a_summary_call_recorded_with_its_turns_label(
    client: Client, model_server: ScriptedModelServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Runs recorded before summary calls had a label of their own show it as another call of
    # the turn before it (turns 1, 2, 2, 3, 4); a fork still tells it from the turns.
    monkeypatch.setattr(model_turn, "SUMMARY_LABEL", "turn")
    turn_requests, firsts, labels = await original_and_forks(client, model_server, [1, 2])
    assert [label.split(" · ")[1] for label in labels] == [
        "turn 1",
        "turn 2",
        "turn 2",
        "turn 3",
        "turn 4",
    ]
    for at in (1, 2):
        same_request(firsts[at], turn_requests[at])
