"""Shared fixtures.

One Temporal dev server serves the whole test session: starting one costs well under a second,
but tests that each started their own would pay it hundreds of times, and Temporal isolates
runs by workflow id and task queue anyway (give each test its own task queue, e.g. from
``uuid4()``).

The server is relaykit's own :class:`~relaykit.devserver.DevServer`, the launcher ``relaykit``
users get, so the tests run against exactly the configuration users do (search attributes,
dynamic config). It is headless, in memory and on a free port, so a session never touches
``.relaykit/`` or a developer's server on 7233.

Async fixtures and tests share one session-wide event loop (``asyncio_mode = "auto"`` and the
loop scopes in ``pyproject.toml``), which session-scoped async fixtures such as ``client``
require.

Add new shared fixtures below in their own section, session-scoped when they start a process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from relaykit.devserver import DevServer
from relaykit.testing.scripted_server import ScriptedModelServer
from tests.wedge import last_look, wedge_detector

__all__ = ["wedge_detector"]  # autouse: every test that uses the dev server is checked

# --- Temporal ---------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def temporal_server() -> Iterator[DevServer]:
    """The session's Temporal dev server (started on first use, stopped at the end)."""
    with DevServer(port=0, headless=True, in_memory=True) as server:
        yield server


@pytest.fixture(scope="session")
async def client(temporal_server: DevServer) -> AsyncIterator[Client]:
    """A client of the session server, with the pydantic data converter relaykit's payloads
    need (workers built on this client inherit it).

    When the session ends, the wedge detector (``tests/wedge.py``) reads once more the runs that
    were still open when their test ended."""
    client = await Client.connect(
        temporal_server.address,
        namespace=temporal_server.namespace,
        data_converter=pydantic_data_converter,
    )
    yield client
    problems = await last_look(client)
    if problems:
        pytest.fail("wedged after their test ended:\n" + "\n".join(problems), pytrace=False)


# --- Models -----------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def model_server() -> Iterator[ScriptedModelServer]:
    """One scripted model server for the session; tests script their own model names (see
    ``support.scripted_model``), so they never share a script."""
    with ScriptedModelServer() as server:
        yield server


# --- Temp folders ------------------------------------------------------------------------------


@pytest.fixture(scope="session", autouse=True)
def _remove_transcript_dir() -> Iterator[None]:
    """Test workers keep transcript prefixes in one temp directory per session
    (``support.transcript_dir``); it goes when the session ends."""
    yield
    from tests.support import remove_transcript_dir

    remove_transcript_dir()
