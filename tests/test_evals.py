"""Replay evaluations (issue 33): a changed agent answers recorded runs again on the real dev
server and the scripted model server, its tool calls answered from the recording, and no write
ever runs again."""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path
from xml.etree import ElementTree

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit import ModelSpec, start_run
from relaykit.devserver import DevServer, find_temporal_cli
from relaykit.evals import EvalReport, EvalSource, evaluate, junit_xml, markdown, select_runs
from relaykit.run_list import RunFilter, list_runs_page
from relaykit.search_attributes import RELAY_EVAL_OF
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest, Step
from tests.eval_agents import (
    candidate_model,
    child_model,
    child_model_refunding,
    clerk_refunding,
    desk_agents,
    desk_model,
    recorded_model,
    ticket_of,
    triage_agent,
)
from tests.support import eventually, scripted_model, serving, transcript_dir

REPO_ROOT = Path(__file__).resolve().parent.parent


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


async def most_open_candidates(client: Client, eval_id: str) -> int:
    """The most candidate runs the evaluation's history had open at once."""
    open_now = most = 0
    async for event in client.get_workflow_handle(eval_id).fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED:
            open_now += 1
            most = max(most, open_now)
        elif event.event_type in (
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_COMPLETED,
            EventType.EVENT_TYPE_CHILD_WORKFLOW_EXECUTION_FAILED,
        ):
            open_now -= 1
    return most


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
    assert await most_open_candidates(client, report.eval_id) <= 5  # --concurrency
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


async def record_desk(client: Client, model_server: ScriptedModelServer) -> str:
    """Record one desk run (its researcher and its clerk each look a ticket up); its id."""
    desk, child = scripted_model(model_server), scripted_model(model_server)
    model_server.respond(desk.name, desk_model)
    model_server.respond(child.name, child_model)
    async with serving(client, desk_agents(desk, child)) as worker:
        handle = await start_run(client, "desk", "help", task_queue=worker.task_queue)
        await handle.result()
    assert model_server.request_count(child.name) == 4  # researcher, clerk: lookup, answer
    return handle.id


async def test_agent_tool_child_is_evaluated_against_its_recording_and_a_subagent_is_matched(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # The candidate's agent-tool call is matched and its child runs as a candidate against the
    # recorded child (its lookup answered from the recording, nothing executed); the spawn is
    # matched too and starts the candidate's clerk as a candidate against the recorded task,
    # whose report the wait returns.
    recorded_id = await record_desk(client, model_server)
    recorded = executions(tool_log)
    assert recorded == {"lookup 7": 1, "lookup 8": 1}

    candidate, candidate_child = scripted_model(model_server), scripted_model(model_server)
    model_server.respond(candidate.name, desk_model)
    model_server.respond(candidate_child.name, child_model)
    report = await run_eval(
        client, model_server, [desk_agents(candidate, candidate_child)], [recorded_id]
    )
    [run] = report.runs
    assert run.verdict == "passed", run
    assert (run.matched, run.live, run.blocked) == (5, 0, [])  # ask, spawn, wait; 2 lookups
    assert model_server.request_count(candidate_child.name) == 4  # the researcher, the clerk
    assert executions(tool_log) == recorded
    assert "child says: check the ledger ticket 8: charged twice" in (run.candidate_output or "")


async def test_a_diverging_subagent_shows_in_its_parents_report(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # The candidate's clerk refunds where the recorded one did not: blocked, listed as the
    # task's call, never executed, and the parent's answer (its clerk's report) differs.
    recorded_id = await record_desk(client, model_server)

    candidate, candidate_child = scripted_model(model_server), scripted_model(model_server)
    model_server.respond(candidate.name, desk_model)
    model_server.respond(candidate_child.name, clerk_refunding)
    report = await run_eval(
        client, model_server, [desk_agents(candidate, candidate_child)], [recorded_id]
    )
    [run] = report.runs
    assert run.verdict == "failed"
    assert [(c.tool, c.outcome) for c in run.blocked] == [("task-1/refund", "blocked")]
    assert run.divergence is not None and run.divergence.turn == 4  # the desk's answer
    assert "not executed during evaluation" in (run.candidate_output or "")
    assert "refund" not in "".join(executions(tool_log))


async def test_a_changed_agent_tool_child_shows_in_its_parents_report(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # The candidate's researcher refunds where the recorded one did not: blocked, listed as
    # the child's call, and the parent's answer differs.
    recorded_id = await record_desk(client, model_server)

    candidate, candidate_child = scripted_model(model_server), scripted_model(model_server)
    model_server.respond(candidate.name, desk_model)
    model_server.respond(candidate_child.name, child_model_refunding)
    report = await run_eval(
        client, model_server, [desk_agents(candidate, candidate_child)], [recorded_id]
    )
    [run] = report.runs
    assert run.verdict == "failed"
    assert [(c.tool.rpartition("/")[2], c.outcome) for c in run.blocked] == [("refund", "blocked")]
    assert run.blocked[0].tool.startswith("researcher")
    assert "refund" not in "".join(executions(tool_log))


async def test_runs_the_candidate_lacks_an_agent_for_or_that_do_not_exist_are_skipped(
    client: Client, model_server: ScriptedModelServer
) -> None:
    ids = await record_triage(client, model_server, range(1, 2))
    model = scripted_model(model_server)
    model_server.respond(model.name, desk_model)
    missing = f"no-such-run-{uuid.uuid4().hex[:6]}"
    report = await run_eval(client, model_server, [desk_agents(model, model)], [*ids, missing])
    [run, unknown] = report.runs
    assert run.verdict == "skipped" and "no agent named 'triage'" in run.reason
    assert unknown.verdict == "skipped" and f"no run with id {missing!r}" in unknown.reason
    assert report.totals.skipped == 2 and report.totals.failed == 0


def history_files(temporal_server: DevServer, run_ids: list[str], folder: Path) -> Path:
    """``folder`` with a file per run, as ``temporal workflow show -o json`` writes it."""
    folder.mkdir()
    for run_id in run_ids:
        show = ["workflow", "show", "-o", "json", "-w", run_id]
        shown = subprocess.run(
            [find_temporal_cli(), *show, "--address", temporal_server.address],
            capture_output=True,
            check=True,
        )
        (folder / f"{run_id}.json").write_bytes(shown.stdout)
    return folder


async def test_runs_from_history_files_are_evaluated_like_runs_on_the_server(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer, tmp_path: Path
) -> None:
    # Files `temporal workflow show -o json` wrote: each one a recorded run, named after it.
    ids = await record_triage(client, model_server, range(1, 3))
    folder = history_files(temporal_server, ids, tmp_path / "histories")
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model(diverging={1}))
    sources = await select_runs(client, histories=str(folder))
    report = await evaluate(
        client,
        [triage_agent(model)],
        sources,
        eval_id=f"eval-{uuid.uuid4().hex[:8]}",
        transcript_dir=transcript_dir(),
    )
    verdicts = {r.recorded_run: r.verdict for r in report.runs}
    assert verdicts == {ids[0]: "failed", ids[1]: "passed"}


async def test_a_history_file_whose_input_this_release_refuses_is_skipped_in_one_line(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer, tmp_path: Path
) -> None:
    # A file from another release (or edited by hand) whose recorded input today's models
    # refuse: that run is skipped, saying which part and why, and the others are evaluated.
    import base64

    ids = await record_triage(client, model_server, range(1, 3))
    folder = history_files(temporal_server, ids, tmp_path / "histories")
    edited = folder / f"{ids[0]}.json"
    document = json.loads(edited.read_text())
    started = document["events"][0]["workflowExecutionStartedEventAttributes"]
    payload = started["input"]["payloads"][0]
    recorded = json.loads(base64.b64decode(payload["data"]))
    recorded["budget"] = {"max_requests": -1}
    payload["data"] = base64.b64encode(json.dumps(recorded).encode()).decode()
    edited.write_text(json.dumps(document))
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model(diverging=set()))
    sources = await select_runs(client, histories=str(folder))
    report = await evaluate(
        client,
        [triage_agent(model)],
        sources,
        eval_id=f"eval-{uuid.uuid4().hex[:8]}",
        transcript_dir=transcript_dir(),
    )
    runs = {Path(r.recorded_run).stem: r for r in report.runs}
    assert runs[ids[1]].verdict == "passed"
    skipped = runs[ids[0]]
    assert skipped.verdict == "skipped" and "\n" not in skipped.reason
    assert "its recorded input cannot be read by this relaykit (budget.max_requests: " in (
        skipped.reason
    )


# --- the command, a real worker process, SIGKILL ------------------------------------------------


def eval_rig(
    temporal_server: DevServer, served: ScriptedModelServer, model: str, log: Path, tmp: Path
) -> dict[str, str]:
    """The environment of a ``relaykit eval tests.eval_agents`` process whose agents call the
    scripted ``model``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TEMPORAL_", "RELAYKIT_"))}
    env.update(
        TEMPORAL_ADDRESS=temporal_server.address,
        TEMPORAL_NAMESPACE="default",
        EVAL_MODEL_URL=served.base_url,
        EVAL_MODEL_NAME=model,
        EVAL_TOOL_LOG=str(log),
        RELAYKIT_STORE=(tmp / "store").as_uri(),
        RELAYKIT_TRANSCRIPT_DIR=str(tmp / "transcripts"),
    )
    return env


def eval_command(
    rig: dict[str, str], *args: str, module: str = "tests.eval_agents"
) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "eval", module, *args],
        cwd=REPO_ROOT,
        env=rig,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )


async def finished(proc: subprocess.Popen[bytes], bound: float = 300) -> tuple[int, str]:
    out, _ = await asyncio.to_thread(proc.communicate, timeout=bound)  # a bound, not a target
    return proc.returncode, out.decode()


async def test_eval_survives_a_killed_worker_and_min_pass_sets_the_exit_status(
    client: Client,
    model_server: ScriptedModelServer,
    temporal_server: DevServer,
    tool_log: Path,
    tmp_path: Path,
) -> None:
    # The command (and the worker in it) is SIGKILLed while a candidate's model call is in
    # flight; the same command again resumes the evaluation and writes the same report as an
    # uninterrupted one would; --min-pass decides the exit status; the JUnit XML parses.
    ids = await record_triage(client, model_server, range(1, 7))
    recorded = executions(tool_log)
    model = scripted_model(model_server)
    normal = candidate_model(diverging={3})
    held = threading.Event()  # never set: the process waiting on it dies first

    def respond(req: ScriptedRequest) -> Step:
        step = normal(req)
        if ticket_of(req) == 5 and not req.tool_results and not held.is_set():
            held.set()  # hold only the first request of ticket 5
            return dataclasses.replace(step, hold=threading.Event())
        return step

    model_server.respond(model.name, respond)
    env = eval_rig(temporal_server, model_server, model.name, tool_log, tmp_path)
    eval_id = f"eval-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "report"
    args = ["--runs", ",".join(ids), "--eval-id", eval_id, "--concurrency", "2"]
    args += ["--json", f"{out}.json", "--junit", f"{out}.xml", "--report", f"{out}.md"]
    first = eval_command(env, *args, "--min-pass", "0.9")
    deadline = time.monotonic() + 120
    while not held.is_set():
        assert first.poll() is None and time.monotonic() < deadline, "no request of ticket 5"
        await asyncio.sleep(0.05)
    first.send_signal(signal.SIGKILL)
    await asyncio.to_thread(first.wait, 10)
    assert not Path(f"{out}.json").exists()

    code, said = await finished(eval_command(env, *args, "--min-pass", "0.9"))
    assert code == 1, said  # 5 of 6 pass: below 0.9
    assert "below --min-pass" in said
    report = EvalReport.model_validate_json(Path(f"{out}.json").read_text())
    assert [(r.recorded_run, r.verdict) for r in report.runs] == [
        (run_id, "failed" if n == 3 else "passed") for n, run_id in enumerate(ids, 1)
    ]
    assert executions(tool_log) == recorded  # no tool ran again, across the crash
    suite = ElementTree.parse(f"{out}.xml").getroot().find("testsuite")
    assert suite is not None and suite.get("failures") == "1"

    # Finished: the same id gives the same report again (nothing runs), and 0.8 passes.
    served = model_server.request_count(model.name)
    code, said = await finished(eval_command(env, *args, "--min-pass", "0.8"))
    assert code == 0, said
    assert EvalReport.model_validate_json(Path(f"{out}.json").read_text()) == report
    assert model_server.request_count(model.name) == served


async def test_a_worker_killed_while_scoring_hands_the_score_on_within_seconds(
    client: Client,
    model_server: ScriptedModelServer,
    temporal_server: DevServer,
    tool_log: Path,
    tmp_path: Path,
) -> None:
    # Reading and scoring heartbeat: the next command's worker takes the killed one's scoring
    # attempt over once its heartbeat timeout passes, long before the activity's 5-minute limit.
    ids = await record_triage(client, model_server, range(1, 2))
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model())
    env = eval_rig(temporal_server, model_server, model.name, tool_log, tmp_path)
    mark = tmp_path / "scoring"
    env["EVAL_SCORE_MARK"] = str(mark)
    out = tmp_path / "report.json"
    args = ["--runs", ids[0], "--eval-id", f"eval-{uuid.uuid4().hex[:8]}", "--json", str(out)]
    module = "tests.eval_agents_held_score"
    first = eval_command(env, *args, module=module)
    await eventually(lambda: mark.exists() or first.poll() is not None, "scoring to start")
    assert first.poll() is None, first.communicate()[0].decode()
    first.send_signal(signal.SIGKILL)
    await asyncio.to_thread(first.wait, 10)

    code, said = await finished(eval_command(env, *args, module=module), bound=120)
    assert code == 0, said
    [run] = EvalReport.model_validate_json(out.read_text()).runs
    assert (run.recorded_run, run.verdict, run.score) == (ids[0], "passed", 1.0)


async def test_candidates_carry_relay_eval_of_and_stay_out_of_the_runs_list(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # Candidate runs name their recorded run; `relaykit runs` leaves them out unless asked.
    ids = await record_triage(client, model_server, range(1, 2))
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model())
    report = await run_eval(client, model_server, [triage_agent(model)], ids)
    [run] = report.runs
    assert run.candidate_run is not None
    described = await client.get_workflow_handle(run.candidate_run).describe()
    assert described.typed_search_attributes.get(RELAY_EVAL_OF) == ids[0]
    mine = f"WorkflowId = '{run.candidate_run}' OR WorkflowId = '{ids[0]}'"
    listed = await poll_list(client, mine, evals=True, expected=2)
    assert listed == sorted([ids[0], run.candidate_run])
    assert await poll_list(client, mine, evals=False, expected=1) == [ids[0]]
    # and a query choosing recorded runs never picks a candidate
    assert await select_runs(client, query=mine) == [EvalSource(run_id=ids[0])]


async def test_model_option_gives_every_candidate_agent_that_model(
    client: Client, model_server: ScriptedModelServer
) -> None:
    # The candidate's own model is unreachable: only --model's answers, so the runs pass.
    ids = await record_triage(client, model_server, range(1, 3))
    model = scripted_model(model_server)
    model_server.respond(model.name, candidate_model())
    nowhere = ModelSpec(provider="openai", name="nowhere", base_url="http://127.0.0.1:9/v1")
    report = await run_eval(client, model_server, [triage_agent(nowhere)], ids, model=model)
    assert [r.verdict for r in report.runs] == ["passed", "passed"]
    assert model_server.request_count(model.name) == 5  # 2 + 3 calls


def test_a_candidate_module_that_does_not_exist_is_one_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "relaykit.cli", "eval", "no_such_module", "--runs", "r1"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    [line] = done.stderr.strip().splitlines()
    assert line.startswith("error: no module named 'no_such_module'")


async def poll_list(client: Client, query: str, *, evals: bool, expected: int) -> list[str]:
    """Visibility is eventually consistent: list until ``expected`` rows show (or give up)."""
    for _ in range(200):
        page = await list_runs_page(client, RunFilter(query=query, evals=evals))
        rows = sorted(row.run_id for row in page.rows)
        if len(rows) >= expected:
            return rows
        await asyncio.sleep(0.05)
    return rows


async def test_refund_desk_example_fails_the_refunds_the_new_instructions_leave_to_a_person(
    temporal_server: DevServer, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The documented example: 20 recorded runs, new instructions, the report names the orders
    # whose refund now goes to a person (scored 0.5 by the module's scorer) and passes the rest.
    from examples.evaluate_refund_desk import record_and_evaluate
    from examples.refund_desk import charged_twice, order_amount, scripted_desk

    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_desk)
    report = await record_and_evaluate(
        temporal_server.address, model, str(tmp_path), eval_id=f"desk-{uuid.uuid4().hex[:8]}"
    )
    left = [n for n in range(1, 21) if charged_twice(n) and order_amount(n) > 40]
    failed = [r for r in report.runs if r.verdict == "failed"]
    assert [r.candidate_output for r in failed] == [
        f"Order {n}: a person will review the refund of {order_amount(n)} EUR." for n in left
    ]
    assert {r.score for r in failed} == {0.5}
    assert report.totals.passed == 20 - len(left) and report.totals.blocked == 0
    assert "## Different answers" in markdown(report)


async def test_a_recorded_run_with_a_long_id_is_evaluated_under_a_shorter_candidate_id(
    client: Client, model_server: ScriptedModelServer, tool_log: Path
) -> None:
    # `<eval id>/<recorded id>` is over the server's 1,000 bytes for a 990-byte recorded id: the
    # candidate is `<eval id>/<digest>` (before: the evaluation's workflow task failed, forever).
    model = scripted_model(model_server)
    model_server.respond(model.name, recorded_model)
    long_id = f"{uuid.uuid4().hex[:8]}-" + "r" * 981
    async with serving(client, triage_agent(model)) as worker:
        handle = await start_run(
            client, "triage", "ticket 2", task_queue=worker.task_queue, id=long_id
        )
        await handle.result()
    candidate = scripted_model(model_server)
    model_server.respond(candidate.name, candidate_model(diverging=set()))
    report = await run_eval(client, model_server, [triage_agent(candidate)], [long_id])
    (run,) = report.runs
    assert run.recorded_run == long_id and run.verdict == "passed", run
    children = [
        e.start_child_workflow_execution_initiated_event_attributes.workflow_id
        async for e in client.get_workflow_handle(report.eval_id).fetch_history_events()
        if e.event_type == EventType.EVENT_TYPE_START_CHILD_WORKFLOW_EXECUTION_INITIATED
    ]
    assert len(children) == 1 and children[0].startswith(report.eval_id + "/")
    assert len(children[0]) == len(report.eval_id) + 33
