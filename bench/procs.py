"""Child processes of the benchmark (workers, the model server) and what ``/proc`` says about
them: resident memory (current and peak) and CPU time.

Every process started here is stopped by :meth:`Child.stop` (SIGTERM, then SIGKILL), which the
scenarios call in ``finally`` blocks; :func:`leftover_children` lets the run check at the end that
nothing it started is still alive.
"""

from __future__ import annotations

import collections
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
"""The repository root (the directory holding ``bench/`` and ``relaykit/``)."""

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


class ChildError(RuntimeError):
    pass


class Child:
    """A ``python -m <module>`` subprocess that prints ``ready <info>`` once it serves."""

    def __init__(
        self,
        name: str,
        args: list[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
        ready_timeout: float = 60.0,
    ) -> None:
        self.name = name
        self.args = [sys.executable, *args]
        self.cwd = cwd
        self.extra_env = dict(env or {})
        self.ready_timeout = ready_timeout
        self.proc: subprocess.Popen[str] | None = None
        self.info = ""
        self._log = tempfile.TemporaryFile(mode="w+t", prefix=f"bench-{name}-")
        self._stdout_tail: collections.deque[str] = collections.deque(maxlen=50)

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def start(self) -> Child:
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(ROOT), *([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])]
        )
        env.setdefault("PYTHONUNBUFFERED", "1")
        env.update(self.extra_env)
        self.proc = subprocess.Popen(
            self.args,
            cwd=self.cwd or ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=self._log,
            text=True,
        )
        line = self._read_ready_line()
        if not line.startswith("ready"):
            tail = self.log_tail()  # before stop(), which closes the log
            self.stop()
            raise ChildError(f"{self.name} did not start: {line!r}\n{tail}")
        self.info = line[len("ready") :].strip()
        return self

    def _read_ready_line(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        found: list[str] = []

        def read() -> None:
            assert self.proc is not None and self.proc.stdout is not None
            stdout = self.proc.stdout
            found.append(stdout.readline().strip())
            got_line.set()
            # Keep reading: a worker's Temporal core logs its warnings (e.g. "workflow task
            # duration exceeded", frequent on a loaded machine) to stdout, and a full pipe would
            # block the core's thread and with it the whole worker. The last lines are kept.
            try:
                for line in stdout:
                    self._stdout_tail.append(line)
            except (OSError, ValueError):  # closed by stop()
                pass

        got_line = threading.Event()
        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        got_line.wait(self.ready_timeout)
        if not found:
            return f"no ready line within {self.ready_timeout:g}s"
        return found[0] or f"exited with code {self.proc.poll()}"

    def log_tail(self, chars: int = 4000) -> str:
        self._log.flush()
        self._log.seek(0)
        return (self._log.read() + "".join(self._stdout_tail))[-chars:]

    def stop(self, timeout: float = 15.0) -> None:
        proc, self.proc = self.proc, None
        if proc is None:
            return
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        self._log.close()

    def __enter__(self) -> Child:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


# --- /proc readers ----------------------------------------------------------------------------


def memory_kb(pid: int) -> dict[str, int]:
    """``VmRSS`` (now) and ``VmHWM`` (peak since start or the last :func:`reset_peak`), in kB."""
    out: dict[str, int] = {}
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                out[key] = int(value.split()[0])
    return out


def reset_peak(pid: int) -> bool:
    """Reset ``VmHWM`` to the current RSS (Linux: ``5`` written to ``clear_refs``)."""
    try:
        with open(f"/proc/{pid}/clear_refs", "w") as refs:
            refs.write("5")
        return True
    except OSError:
        return False


def cpu_seconds(pid: int) -> float:
    """User + system CPU time the process has used so far."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rpartition(")")[2].split()
    # fields[0] is the state (field 3); utime and stime are fields 14 and 15.
    return (int(fields[11]) + int(fields[12])) / _CLK_TCK


def _ppid_and_name(pid: int) -> tuple[int, str] | None:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            raw = stat.read()
    except OSError:
        return None
    name = raw[raw.index("(") + 1 : raw.rindex(")")]
    return int(raw.rpartition(")")[2].split()[1]), name


def children_of(pid: int | None = None) -> list[tuple[int, str]]:
    """Live (non-zombie) direct children of ``pid`` (default: this process) as (pid, name)."""
    parent = os.getpid() if pid is None else pid
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        info = _ppid_and_name(int(entry))
        if info is None or info[0] != parent:
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                state = stat.read().rpartition(")")[2].split()[0]
        except OSError:
            continue
        if state != "Z":
            found.append((int(entry), info[1]))
    return found


def leftover_children(wait: float = 5.0) -> list[tuple[int, str]]:
    """Children still alive after up to ``wait`` seconds (should be none once the run ends)."""
    deadline = time.monotonic() + wait
    while True:
        left = children_of()
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.1)


def commit() -> str:
    """The short commit the benchmark runs, for the figures it prints."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
