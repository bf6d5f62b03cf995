"""Replay evaluations (issue 33): a changed agent answers recorded runs again on the real dev
server and the scripted model server, its tool calls answered from the recording, and no write
ever runs again."""

from __future__ import annotations

import asyncio
import collections
import json
import uuid
from pathlib import Path
from xml.etree import ElementTree

import pytest
from temporalio.client import Client

from relaykit import start_run
from relaykit.evals import EvalReport, EvalSource, evaluate, junit_xml, markdown
from relaykit.testing.scripted_server import ScriptedModelServer
from tests.eval_agents import (
    candidate_model,
    child_model,
    desk_agents,
    desk_model,
    recorded_model,
    triage_agent,
)
from tests.support import scripted_model, serving, transcript_dir


def executions(log: Path) -> collections.Counter[str]:
    return collections.Counter(log.read_text().splitlines() if log.exists() else [])


@pytest.fixture
def tool_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    log = tmp_path / "tools.log"
    monkeypatch.setenv("EVAL_TOOL_LOG", str(log))
    return log


async def record_triage(
    client: Client, model_server: ScriptedModelServer, tickets: range
) -> list[str]:
    """Record one triage run per ticket; their workflow ids."""
    model = scripted_model(model_server)
    model_server.respond(model.name, recorded_model)
    prefix = f"rec-{uuid.uuid4().hex[:8]}"
    async with serving(client, triage_agent(model)) as worker:
        handles = [
            await start_run(
                client, "triage", f"ticket {n}", task_queue=worker.task_queue, id=f"{prefix}-{n}"
            )
            for n in tickets
        ]
        await asyncio.gather(*(handle.result() for handle in handles))
    return [handle.id for handle in handles]


async def run_eval(
    client: Client,
    model_server: ScriptedModelServer,
    agents: list,
    ids: list[str],
    **options: object,
) -> EvalReport:
    return await evaluate(
        client,
        agents,
        [EvalSource(run_id=run_id) for run_id in ids],
        eval_id=f"eval-{uuid.uuid4().hex[:8]}",
        transcript_dir=transcript_dir(),
        **options,  # type: ignore[arg-type]
    )


async def test_twenty_runs_three_diverge_and_a_new_write_never_runs(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # The report names exactly the diverging runs with their first divergent step, passes the
    # rest, and the refunds the candidate asks for anew are blocked, never executed.
    ids = await record_triage(client, model_server, range(1, 21))
    recorded = executions(tool_log)
    assert sum(recorded.values()) == 30 and recorded["refund 2"] == 1  # 20 lookups, 10 refunds
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model(diverging={3, 7, 11}))
    report = await run_eval(client, model_server, [triage_agent(model)], ids, concurrency=5)

    assert executions(tool_log) == recorded  # nothing ran again, not even a read
    failed = {r.recorded_run: r for r in report.runs if r.verdict == "failed"}
    assert sorted(failed) == sorted(ids[n - 1] for n in (3, 7, 11))
    for n in (3, 7, 11):
        run = failed[ids[n - 1]]
        assert run.divergence is not None
        assert (run.divergence.turn, run.divergence.tool) == (2, "refund")
        assert json.loads(run.divergence.arguments or "") == {"ticket": n, "amount": 20}
        assert [(c.tool, c.outcome) for c in run.blocked] == [("refund", "blocked")]
        assert "not executed during evaluation" in run.candidate_output
    passed = [r for r in report.runs if r.verdict == "passed"]
    assert len(passed) == 17
    assert all(r.divergence is None and not r.blocked for r in passed)
    assert {r.matched for r in passed} == {1, 2}  # the lookup, and the refund of even tickets
    assert report.totals.pass_rate == pytest.approx(17 / 20)
    assert report.totals.blocked == 3
    text = markdown(report)
    assert all(ids[n - 1] in text for n in (3, 7, 11))
    suites = ElementTree.fromstring(junit_xml(report))
    suite = suites.find("testsuite")
    assert suite is not None and suite.get("tests") == "20" and suite.get("failures") == "3"
    assert len(suite.findall("testcase/failure")) == 3


async def test_unmatched_read_runs_live_only_with_live_reads(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # A lookup the recording never made is blocked by default and runs with live reads.
    ids = await record_triage(client, model_server, range(1, 3))
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model(extra_lookup={1}))
    blocked = await run_eval(client, model_server, [triage_agent(model)], ids)
    assert executions(tool_log)["lookup 101"] == 0
    [first] = [r for r in blocked.runs if r.recorded_run == ids[0]]
    assert [(c.tool, c.outcome) for c in first.blocked] == [("lookup", "blocked")]

    live = await run_eval(client, model_server, [triage_agent(model)], ids, live_reads=True)
    assert executions(tool_log)["lookup 101"] == 1
    [first] = [r for r in live.runs if r.recorded_run == ids[0]]
    assert (first.matched, first.live, first.blocked) == (1, 1, [])
    assert "charged twice" in first.candidate_output


async def test_agent_tool_and_subagent_answers_come_from_the_recording(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The candidate's agent-tool call, spawn and wait are matched: no child runs again.
    desk, child = scripted_model(model_server), scripted_model(model_server)
    model_server.respond(desk.name, desk_model)
    model_server.respond(child.name, child_model)
    async with serving(client, desk_agents(desk, child)) as worker:
        handle = await start_run(client, "desk", "help", task_queue=worker.task_queue)
        await handle.result()
    children = model_server.request_count(child.name)
    assert children == 2  # the researcher and the helper, once each

    candidate = scripted_model(model_server)
    model_server.respond(candidate.name, desk_model)
    report = await run_eval(client, model_server, [desk_agents(candidate, child)], [handle.id])
    [run] = report.runs
    assert run.verdict == "passed", run
    assert (run.matched, run.live, run.blocked) == (3, 0, [])
    assert model_server.request_count(child.name) == children


async def test_runs_whose_agent_the_candidate_lacks_are_skipped_not_failed(
    client: Client, model_server: ScriptedModelServer
) -> None:
    ids = await record_triage(client, model_server, range(1, 2))
    model = scripted_model(model_server)
    model_server.respond(model.name, desk_model)
    report = await run_eval(client, model_server, [desk_agents(model, model)], ids)
    [run] = report.runs
    assert run.verdict == "skipped" and "no agent named 'triage'" in run.reason
    assert report.totals.skipped == 1 and report.totals.failed == 0
