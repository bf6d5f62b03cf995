"""The examples' scripted stand-ins: what ``relaykit dev`` plays when no model is configured."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import pytest
from temporalio.client import Client

from relaykit import start_run
from relaykit.dev import find_scripted_responder
from relaykit.testing.scripted_server import ScriptedModelServer, ScriptedRequest
from tests.support import scripted_model, serving


def openai_request(
    index: int, tools: list[str], messages: list[dict[str, object]]
) -> ScriptedRequest:
    body = {
        "model": "m",
        "messages": messages,
        "tools": [{"type": "function", "function": {"name": name}} for name in tools],
    }
    return ScriptedRequest(api="openai", model="m", body=body, headers={}, index=index)


def test_research_lead_asks_the_editor_even_when_researchers_asked_the_server_first() -> None:
    # The server's request counter is shared by all three agents; the lead's second request
    # may be the fifth the server sees. It must still ask the editor, not skip to waiting.
    from examples.research import scripted_research_lead

    spawned = [
        {"role": "user", "content": "Compare Temporal and Celery"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": f"c{i}",
                    "type": "function",
                    "function": {"name": "spawn_subagent", "arguments": "{}"},
                }
                for i in (1, 2)
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "started task-1"},
        {"role": "tool", "tool_call_id": "c2", "content": "started task-2"},
    ]
    lead_tools = ["ask_editor", "spawn_subagent", "wait_subagents"]
    step = scripted_research_lead(openai_request(4, lead_tools, spawned))
    assert [c.name for c in step.calls] == ["ask_editor"]
    first = scripted_research_lead(openai_request(3, lead_tools, spawned[:1]))
    assert [c.name for c in first.calls] == ["spawn_subagent", "spawn_subagent"]


def test_relaykit_dev_finds_the_approvals_stand_in() -> None:
    from examples.approvals import scripted_refunds

    assert find_scripted_responder("examples.approvals") is scripted_refunds


@pytest.mark.parametrize("approved", [True, False], ids=["approved", "rejected"])
async def test_approvals_stand_in_asks_for_a_refund_and_reports_the_persons_decision(
    client: Client, model_server: ScriptedModelServer, approved: bool
) -> None:
    from examples.approvals import refund_agent, scripted_refunds

    model = scripted_model(model_server)
    model_server.respond(model.name, scripted_refunds)
    async with serving(client, refund_agent, default_model=model) as worker:
        handle = await start_run(
            client,
            refund_agent,
            "Refund order A-1001, the jacket leaks",
            task_queue=worker.task_queue,
        )
        pending = []
        for _ in range(300):  # until the run asks for approval (at most ~30 s)
            pending = await handle.pending_approvals()
            if pending:
                break
            await asyncio.sleep(0.1)
        assert [p.tool for p in pending] == ["issue_refund"]
        assert json.loads(pending[0].arguments)["amount_eur"] == 89.0
        await handle.approve(pending[0].call_id, approved=approved, reason="not this time")
        result = await asyncio.wait_for(handle.result(), 60)
    if approved:
        assert result.output.startswith("Done: refunded 89.00 EUR for A-1001")
    else:
        assert "could not refund order A-1001" in result.output
        assert "not this time" in result.output


def test_approvals_stand_in_asks_for_the_order_when_none_is_named() -> None:
    from examples.approvals import scripted_refunds

    step = scripted_refunds(
        openai_request(0, ["look_up_order"], [{"role": "user", "content": "I want my money back"}])
    )
    assert not step.calls and "Which order" in step.text


def test_quickstart_first_install_shows_pip_progress_and_later_refreshes_are_quiet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A newcomer's first install takes a minute: pip must show that it is working.
    import quickstart

    installs: list[list[str]] = []
    monkeypatch.setattr(quickstart, "VENV", tmp_path / ".venv")
    monkeypatch.setattr(quickstart, "PYTHON", tmp_path / ".venv" / "bin" / "python")
    monkeypatch.setattr(quickstart, "STAMP", tmp_path / ".venv" / ".relaykit-installed")

    def create(path: Path, **_: object) -> None:
        quickstart.PYTHON.parent.mkdir(parents=True)
        quickstart.PYTHON.touch()

    monkeypatch.setattr(quickstart.venv, "create", create)
    monkeypatch.setattr(
        quickstart,
        "_pip",
        lambda *args, quiet=False: installs.append(quickstart.pip_command(*args, quiet=quiet)),
    )
    quickstart.ensure_venv()
    assert len(installs) == 3
    assert all("--quiet" not in c and "-q" not in c for c in installs)
    assert all(c[1:4] == ["-m", "pip", "install"] for c in installs)
    quickstart.STAMP.write_text("an older pyproject.toml")
    installs.clear()
    quickstart.ensure_venv()
    assert installs and all("--quiet" in c for c in installs)


def _stub_tools(tmp_path: Path, failing: set[str], pytest_status: int = 0) -> Path:
    """Executables named like the shape tools and python, each logging its arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("ruff", "mypy", "lint-imports", "python"):
        status = pytest_status if name == "python" else int(name in failing)
        script = bin_dir / name
        script.write_text(f'#!/bin/sh\necho "{name} $*" >> "{tmp_path / "calls"}"\nexit {status}\n')
        script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("failing", "pytest_status", "expected"),
    [(set(), 0, 0), ({"mypy"}, 0, 1), (set(), 3, 3), ({"ruff"}, 0, 1)],
)
def test_quickstart_test_runs_every_shape_check_then_pytest_and_fails_naming_failed_checks(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    failing: set[str],
    pytest_status: int,
    expected: int,
) -> None:
    import quickstart

    bin_dir = _stub_tools(tmp_path, failing, pytest_status)
    monkeypatch.setattr(quickstart, "BIN", bin_dir)
    monkeypatch.setattr(quickstart, "PYTHON", bin_dir / "python")
    monkeypatch.setattr(quickstart, "ensure_venv", lambda: None)
    monkeypatch.chdir(tmp_path)  # main() moves to the checkout; this restores the directory
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "test", "tests/test_cli.py", "-x"])
    assert quickstart.main() == expected
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0:2] for c in calls] == [
        ["ruff", "check"],
        ["ruff", "format"],
        ["mypy"],
        ["lint-imports"],
        ["python", "-m"],
    ]
    assert calls[-1] == "python -m pytest tests/test_cli.py -x"  # extra arguments reach pytest
    err = capsys.readouterr().err
    names = {"ruff": "ruff check, ruff format", "mypy": "mypy"}
    if failing:
        assert f"shape checks failed: {names[next(iter(failing))]} " in err
    else:
        assert "shape checks failed" not in err


def test_quickstart_shape_runs_the_checks_alone_and_exits_non_zero_when_one_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    import quickstart

    bin_dir = _stub_tools(tmp_path, {"lint-imports"})
    monkeypatch.setattr(quickstart, "BIN", bin_dir)
    monkeypatch.setattr(quickstart, "PYTHON", bin_dir / "python")
    monkeypatch.setattr(quickstart, "ensure_venv", lambda: None)
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", ["quickstart.py", "shape"])
    assert quickstart.main() == 1
    assert not any(c.startswith("python") for c in (tmp_path / "calls").read_text().splitlines())
    assert "shape checks failed: import-linter" in capsys.readouterr().err
