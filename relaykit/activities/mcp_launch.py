"""Start a stdio MCP server so that it dies with its worker.

A worker killed with SIGKILL cannot stop its subprocesses; a server left running would finish
the call in flight after the worker is gone, while the retry on another worker runs it again (or,
for a ``"write"`` tool, reports its outcome unknown: it must then really not happen later). On
Linux the server is started through this small launcher, which asks the kernel to SIGKILL it when
its parent dies (``prctl(PR_SET_PDEATHSIG)``, kept across ``exec``) and then becomes the server.
Elsewhere the command runs as given (the server exits when its stdin closes, as before).

Run as a file (``python -I mcp_launch.py <parent pid> <command...>``), not as a module, so that it
imports nothing of relaykit and starts in milliseconds.
"""

from __future__ import annotations

import os
import shutil
import sys

PR_SET_PDEATHSIG = 1


def orphan_safe_command(
    command: list[str], env: dict[str, str] | None = None, cwd: str | None = None
) -> list[str]:
    """``command`` wrapped in the launcher where the platform supports it. A command that
    cannot be found is left as it is, so the server's start fails with the usual error naming
    it (not with a launcher that exited)."""
    if not sys.platform.startswith("linux") or not command:
        return list(command)
    program = command[0]
    if os.sep in program:
        found = os.access(os.path.join(cwd or "", program), os.X_OK)
    else:
        found = (
            shutil.which(program, path=(env or {}).get("PATH", os.environ.get("PATH"))) is not None
        )
    if not found:
        return list(command)
    return [sys.executable, "-I", os.path.abspath(__file__), str(os.getpid()), *command]


def _launch(argv: list[str]) -> None:
    import ctypes
    import signal

    parent, command = int(argv[0]), argv[1:]
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
        sys.stderr.write("relaykit: PR_SET_PDEATHSIG failed; the server may outlive its worker\n")
    if os.getppid() != parent:  # the worker died before the request took effect
        os._exit(1)
    os.execvp(command[0], command)


if __name__ == "__main__":
    _launch(sys.argv[1:])
