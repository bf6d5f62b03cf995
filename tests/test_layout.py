"""The layout keeps its rooms small: no module in ``relaykit/workflows/`` over 400 lines, none
elsewhere in ``relaykit/`` over 600 (``relaykit/testing/`` aside). A module that grows past its
bound is split by concern before it lands (docs/architecture.md maps what each one owns)."""

from __future__ import annotations

from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "relaykit"


def oversized() -> dict[str, int]:
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        if relative.parts[0] == "testing":
            continue
        limit = 400 if relative.parts[0] == "workflows" else 600
        lines = len(path.read_text().splitlines())
        if lines > limit:
            found[str(relative)] = lines
    return found


def test_no_module_is_over_its_size_bound() -> None:
    assert oversized() == {}
