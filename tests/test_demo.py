"""``relaykit demo`` and the model every command picks, as a newcomer meets them: nothing
configured, real processes, a real server, a real SIGKILL of a worker process."""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path

import pytest
from temporalio.api.enums.v1 import EventType
from temporalio.client import Client

from relaykit.errors import RelaykitError
from tests.test_cli import Lines, free_port, popen, stop
from tests.wedge import wedges_on

ROOT = Path(__file__).resolve().parents[1]
NOTHING_CONFIGURED = {
    "RELAYKIT_MODEL": "",
    "OPENAI_API_KEY": "",
    "OPENAI_BASE_URL": "",
    "ANTHROPIC_API_KEY": "",
}


def test_with_nothing_configured_every_command_gets_the_scripted_stand_in_and_how_to_use_a_real_model() -> (  # noqa: E501
    None
):
    from relaykit.dev import choose_model

    choice = choose_model(NOTHING_CONFIGURED)
    assert choice.spec is None
    assert choice.label.startswith("scripted stand-in model")
    assert "RELAYKIT_MODEL=openai:gpt-4.1" in choice.label and "OPENAI_API_KEY" in choice.label
    assert "RELAYKIT_MODEL=local" in choice.label


def test_the_bundled_local_model_is_chosen_only_by_name_and_its_limits_are_said(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    import relaykit.dev
    from relaykit.demo import demo_model_choice
    from relaykit.dev import choose_model

    monkeypatch.setattr(relaykit.dev, "local_model_available", lambda: True)
    assert choose_model(NOTHING_CONFIGURED).spec is None  # installed, yet not picked on its own
    for choice in (
        choose_model({**NOTHING_CONFIGURED, "RELAYKIT_MODEL": "local"}),
        demo_model_choice("local", NOTHING_CONFIGURED),  # relaykit demo --model local
    ):
        assert choice.spec is not None
        assert (choice.spec.provider, choice.spec.name) == ("local", "smollm2")
        assert "wrong" in choice.label and "docs/local-model.md" in choice.label
    # --model wins over the environment's choice.
    keyed = demo_model_choice("scripted", {**NOTHING_CONFIGURED, "OPENAI_API_KEY": "k"})
    assert keyed.spec is None

    monkeypatch.setattr(relaykit.dev, "local_model_available", lambda: False)
    with pytest.raises(RelaykitError, match="not installed") as raised:
        choose_model({**NOTHING_CONFIGURED, "RELAYKIT_MODEL": "local"})
    assert "pip install" in str(raised.value)


def test_a_worker_given_relaykit_model_local_serves_the_bundled_model() -> None:
    from relaykit.models.spec import parse_model

    spec = parse_model("local")
    assert (spec.provider, spec.name, spec.tool_calls) == ("local", "smollm2", "constrained")


def test_dev_with_nothing_configured_says_on_its_first_line_that_a_script_plays_the_model(
    tmp_path: Path,
) -> None:
    port, ui_port = free_port(), free_port()
    dev = popen(
        "-m",
        "relaykit.cli",
        "dev",
        "examples.approvals",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--data-dir",
        str(tmp_path / "data"),
        "--task-queue",
        "demo-dev",
        env={**NOTHING_CONFIGURED, "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "t")},
    )
    lines = Lines(dev.stderr)
    try:
        lines.wait_for("ready:", timeout=120)
    finally:
        stop(dev)
    assert lines.lines[0].startswith("model: scripted stand-in model"), lines.lines
    assert "RELAYKIT_MODEL=openai:gpt-4.1" in lines.lines[0]


async def _history(port: int, workflow_id: str) -> list[object]:
    client = await Client.connect(f"127.0.0.1:{port}")
    return [e async for e in client.get_workflow_handle(workflow_id).fetch_history_events()]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_demo_answers_right_survives_the_sigkill_of_its_worker_and_runs_no_finished_call_twice(
    tmp_path: Path,
) -> None:
    # The quick start with nothing configured: the answer (JPY amount, weather of both cities),
    # then the story of the crash as the run's history tells it, and the history itself.
    port, ui_port = free_port(), free_port()
    demo = popen(
        "-m",
        "relaykit.cli",
        "demo",
        "--stay",
        "--port",
        str(port),
        "--ui-port",
        str(ui_port),
        "--data-dir",
        str(tmp_path / "data"),
        env={**NOTHING_CONFIGURED, "RELAYKIT_TRANSCRIPT_DIR": str(tmp_path / "store")},
    )
    err = Lines(demo.stderr)
    out = Lines(demo.stdout)
    try:
        link = err.wait_for("run in the Temporal UI:", timeout=180)
        out.wait_for("Your cash:", timeout=10)
        workflow_id = link.rsplit("/", 1)[-1]
        events = asyncio.run(_history(port, workflow_id))
        wedged = asyncio.run(wedges_on(f"127.0.0.1:{port}"))
    finally:
        stop(demo)
    assert wedged == []
    assert err.lines[0].startswith("model: scripted stand-in model"), err.lines
    answer = "\n".join(out.lines)
    assert "500.00 EUR = 81967.21 JPY" in answer
    assert "Paris: 14°C" in answer and "Tokyo: 19°C" in answer
    story = "\n".join(err.lines)
    first = re.search(
        r"worker 1 \(pid (\d+)\) ran get_weather\(cities=\[\"Paris\", \"Tokyo\"\]\)", story
    )
    assert first, story
    pid1 = int(first.group(1))
    assert f"worker 1 (pid {pid1}) killed (SIGKILL) while it ran the model call (turn 2)" in story
    resumed = re.search(
        r"worker 2 \(pid (\d+)\) resumed the run: replayed 2 finished calls from history", story
    )
    assert resumed, story
    pid2 = int(resumed.group(1))
    assert f"worker 2 (pid {pid2}) ran convert_currency(amount=500" in story
    assert (
        story.index("killed (SIGKILL)")
        < story.index("resumed the run")
        < story.index("ran convert_currency")
    )
    assert not _pid_alive(pid1)

    # The history: each call scheduled once, each finished once, tools run by the worker the
    # story names; the model call worker 1 lost was retried by worker 2.
    scheduled = {
        e.event_id: e.activity_task_scheduled_event_attributes.activity_type.name
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED
    }
    started = {
        attrs.scheduled_event_id: attrs
        for e in events
        for attrs in [e.activity_task_started_event_attributes]
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED
    }
    completed = [
        e.activity_task_completed_event_attributes.scheduled_event_id
        for e in events
        if e.event_type == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED
    ]
    assert sorted(scheduled.values()) == sorted(
        ["relaykit.model_call"] * 3 + ["get_weather", "convert_currency"]
    )
    assert sorted(completed) == sorted(scheduled)  # every call finished, none twice
    by_type = {scheduled[i]: started[i] for i in scheduled if scheduled[i] != "relaykit.model_call"}
    assert by_type["get_weather"].identity.startswith(f"{pid1}@")
    assert by_type["get_weather"].attempt == 1
    assert by_type["convert_currency"].identity.startswith(f"{pid2}@")
    assert by_type["convert_currency"].attempt == 1
    retried = [s for i, s in started.items() if s.attempt > 1]
    assert [s.identity.split("@")[0] for s in retried] == [str(pid2)]
