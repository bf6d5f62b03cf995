#!/usr/bin/env bash
# The code-shape checks alone: lint, format, types and the import layers (the same ones
# `python3 quickstart.py test` runs before pytest; the list is SHAPE_CHECKS in quickstart.py).
# Each check runs even when an earlier one failed; the exit status is non-zero if any failed.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python3 quickstart.py shape
