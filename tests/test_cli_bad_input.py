"""Every ``relaykit`` command, fed bad input, answers with one clear line and a non-zero exit
status, never a traceback.

The commands come from the typer app itself, so a command added later is covered without being
listed here: each gets its required arguments missing, an unknown flag, a non-number for each
numeric option, unknown, empty and odd run ids, a closed run, and the inputs listed in
``SPECIFIC``. Commands run in this process (a process per case would take minutes); an
exception escaping a command is exactly what would have been a traceback."""

from __future__ import annotations

import inspect
import signal
import typing
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
import typer.main
from typer.testing import CliRunner, Result

from relaykit.cli import app
from relaykit.devserver import DevServer


def _walk(group: Any, prefix: tuple[str, ...] = ()) -> Iterator[tuple[str, Any]]:
    """``("deployment status", command)`` for every command, inside groups too."""
    for name, command in group.commands.items():
        path = (*prefix, name)
        if hasattr(command, "commands"):
            yield from _walk(command, path)
        else:
            yield " ".join(path), command


ROOT_COMMAND = typer.main.get_command(app)
COMMANDS = dict(_walk(ROOT_COMMAND))
GROUPS = sorted(name for name, c in ROOT_COMMAND.commands.items() if hasattr(c, "commands"))  # type: ignore[attr-defined]
UNKNOWN_RUN = f"no-such-run-{uuid.uuid4().hex[:8]}"
NOBODY = f"nobody-{uuid.uuid4().hex[:8]}"
"""A task queue no worker polls: runs started by a bad-input case never execute."""
ODD_RUN_IDS = ("", " ", "../../etc/passwd", "x" * 1200, "run\nwith-newline")
CLOSED = "{closed}"
"""Stands for the id of a run that has been terminated."""

SPECIFIC: dict[str, list[list[str]]] = {
    "run": [
        ["run", "triage", "hi", "-q", NOBODY, "--max-turns", "0"],
        ["run", "triage", "hi", "-q", NOBODY, "--max-turns", "-1"],
        ["run", "triage", "hi", "-q", NOBODY, "--if-exists", "sometimes"],
        ["run", "triage", "hi", "-q", NOBODY, "--id", CLOSED, "--if-exists", "fail"],
        ["run", "triage", "bad \udcff byte", "-q", NOBODY],
        ["run", "triage", "hi", "-q", NOBODY, "--address", "127.0.0.1:1"],
        ["run", "", "hi", "-q", NOBODY],
        ["run", "triage", "hi", "-q", ""],
        ["run", "triage", "hi", "-q", NOBODY, "--id", "x" * 1200],
    ],
    "runs": [
        ["runs", "--status", "sleeping"],
        ["runs", "--limit", "0"],
        ["runs", "--limit", "-1"],
        ["runs", "--namespace", f"no-such-namespace-{uuid.uuid4().hex[:6]}"],
        ["runs", "--address", "not a host"],
        ["runs", "--agent", "bad \udcff byte"],
    ],
    "events": [["events", CLOSED, "--from", "-1"], ["events", UNKNOWN_RUN, "--from", "-5"]],
    "watch": [["watch", CLOSED, "--from", "soon"], ["watch", CLOSED, "--from", "-3", "--plain"]],
    "approve": [
        ["approve", CLOSED, "call_1"],
        ["approve", UNKNOWN_RUN, "call_1", "--reason", "\udcff"],
    ],
    "send": [["send", CLOSED, "hello"], ["send", CLOSED, "bad \udcff byte"]],
    "resume": [["resume", CLOSED, "go on"]],
    "terminate": [["terminate", CLOSED, "--reason", "again"]],
    "gc": [
        ["gc", "--retention", "soon"],
        ["gc", "--retention", "-1d"],
        ["gc", "--retention", "1e400d"],
        ["gc", "--retention", "nan"],
        ["gc", "--store", "nope://bucket/prefix"],
    ],
    "worker": [
        ["worker", "no_such_module_here"],
        ["worker", ""],
        ["worker", "examples.triage", "os:path"],
        ["worker", "examples.triage:no_such_attr"],
        ["worker", "examples.triage", "--tool-threads", "0"],
        ["worker", "examples.triage", "--address", "127.0.0.1:1"],
    ],
    "dev": [["dev", "no_such_module_here"], ["dev", "examples.triage", "--tool-threads", "0"]],
    "demo": [["demo", "--port", "seven"]],
    "codec-server": [
        ["codec-server"],
        ["codec-server", "--port", "70000"],
        ["codec-server", "--port", "-1"],
    ],
}
"""Inputs that only make sense for one command (codec-server's run with a codec set)."""

NEEDS_CODEC = {("codec-server", "--port", "70000"), ("codec-server", "--port", "-1")}
NOT_AN_ERROR = {"ui-url"}
"""Commands that only format their input: odd ids and closed runs are no error for them."""


def _numeric_options(name: str) -> list[str]:
    callback = inspect.unwrap(COMMANDS[name].callback)
    hints = typing.get_type_hints(callback, include_extras=True)
    flags = []
    for param in COMMANDS[name].params:
        if param.param_type_name != "option":
            continue
        hint = hints[param.name]
        if typing.get_origin(hint) is typing.Annotated:
            hint = typing.get_args(hint)[0]
        members = set(typing.get_args(hint)) - {type(None)} or {hint}
        if members <= {int, float}:
            flags.append(param.opts[0])
    return flags


def cases(name: str) -> Iterator[tuple[list[str], bool]]:
    """``(argv, is_an_error)`` for one command."""
    command = COMMANDS[name]
    path = name.split()
    required = [p for p in command.params if p.param_type_name == "argument" and p.required]
    fill = [UNKNOWN_RUN if p.name == "run_id" else "x" for p in required]
    if required:
        yield path, True
    yield [*path, *fill, "--no-such-option"], True
    for flag in _numeric_options(name):
        yield [*path, *fill, flag, "not-a-number"], True
    if required and required[0].name == "run_id":
        for run_id in (UNKNOWN_RUN, *ODD_RUN_IDS):
            yield [*path, run_id, *fill[1:]], name not in NOT_AN_ERROR
        yield [*path, CLOSED, *fill[1:]], False  # a defined outcome, maybe not an error
    if path[0] in GROUPS and len(path) == 2:
        yield [path[0], "no-such-subcommand"], True
    for argv in SPECIFIC.get(name, []):
        yield argv, True


@pytest.fixture(scope="module")
def closed_run(temporal_server: DevServer) -> str:
    env = {"TEMPORAL_ADDRESS": temporal_server.address}
    run_id = f"closed-{uuid.uuid4().hex[:8]}"
    started = invoke(["run", "triage", "hi", "-q", NOBODY, "--id", run_id], env)
    assert started.exit_code == 0, started.output
    ended = invoke(["terminate", run_id], env)
    assert ended.exit_code == 0, ended.output
    return run_id


class Hung(Exception):
    pass


def invoke(argv: list[str], env: dict[str, str | None]) -> Result:
    def hung(*_: Any) -> None:
        raise Hung(" ".join(argv))

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(90)
    try:
        return CliRunner().invoke(app, argv, env=env)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def test_the_commands_under_test_are_the_apps_commands() -> None:
    assert {"run", "result", "events", "watch", "gc", "worker", "dev", "demo"} <= set(COMMANDS)
    assert set(SPECIFIC) <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_answers_bad_input_with_one_line_never_a_traceback(
    name: str, temporal_server: DevServer, closed_run: str
) -> None:
    env: dict[str, str | None] = {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": None,
        "RELAYKIT_CODEC": None,
        "RELAYKIT_CODEC_KEY": None,
        "RELAYKIT_MODEL": "scripted",
        "RELAYKIT_UI_URL": None,
        "NO_COLOR": "1",
        "COLUMNS": "200",
    }
    problems = []
    for argv, is_error in cases(name):
        argv = [closed_run if arg == CLOSED else arg for arg in argv]
        case_env = dict(env)
        if tuple(argv) in NEEDS_CODEC:
            case_env.update(
                RELAYKIT_CODEC="relaykit.codecs.aes:AesGcmCodec",
                RELAYKIT_CODEC_KEY="AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8=",
            )
        result = invoke(argv, case_env)
        shown = repr(argv)[:160]
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            problems.append(
                f"{shown}: raised {type(result.exception).__name__}: {result.exception}"
            )
            continue
        if "Traceback" in result.output:
            problems.append(f"{shown}: printed a traceback")
            continue
        lines = [line for line in result.stderr.splitlines() if line.strip()]
        if is_error and result.exit_code == 0:
            problems.append(f"{shown}: exit status 0 for bad input; stderr {lines}")
        elif result.exit_code != 0 and not (lines and lines[-1].startswith(("error:", "Error:"))):
            problems.append(f"{shown}: exit {result.exit_code} without an error line: {lines[-3:]}")
        elif result.exit_code == 1 and len(lines) != 1:
            problems.append(f"{shown}: more than one line: {lines}")
    assert not problems, "\n".join(problems)
