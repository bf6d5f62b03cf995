#!/usr/bin/env bash
# The code-shape checks: lint, format, types and the import layers. Run from the repository root
# after `python3 quickstart.py test ...` has created .venv (the tools come with the `test` extra).
# Each check runs even when an earlier one failed; the exit status is non-zero if any failed.
set -uo pipefail
cd "$(dirname "$0")/.."
bin=.venv/bin
status=0
run() {
    echo "== $*"
    "$@" || status=1
}
run "$bin/ruff" check relaykit tests
run "$bin/ruff" format --check relaykit tests
run "$bin/mypy"                 # files and options: [tool.mypy] in pyproject.toml
run "$bin/lint-imports"         # contracts: [tool.importlinter] in pyproject.toml
exit $status
