"""A worker loads only the optional parts it uses: what `import relaykit` and the worker module
pull into a fresh interpreter (a subprocess, so this test process's imports do not count)."""

from __future__ import annotations

import json
import subprocess
import sys

OPTIONAL = (
    "mcp",
    "rich",
    "click",
    "pygments",
    "typer",
    "opentelemetry",
    "starlette",
    "uvicorn",
    "selectolax",
    "cryptography",
    "boto3",
)


def loaded_after(code: str) -> set[str]:
    listing = "print(json.dumps(sorted({m.split('.')[0] for m in sys.modules})))"
    probe = f"{code}\nimport json, sys\n{listing}"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_worker_that_uses_no_optional_part_does_not_import_one() -> None:
    loaded = loaded_after("import relaykit, relaykit.worker, relaykit.client")
    assert "temporalio" in loaded and "httpx" in loaded  # the probe does see imports
    assert loaded.isdisjoint(OPTIONAL), sorted(loaded & set(OPTIONAL))


def test_httpx_command_line_module_stays_importable() -> None:
    loaded = loaded_after("import relaykit\nimport httpx._main")
    assert "rich" in loaded  # code that asks for httpx's CLI still gets it, with its deps


def test_fetching_a_page_is_what_loads_the_html_parser() -> None:
    assert "selectolax" not in loaded_after("import relaykit.web")
    assert "selectolax" in loaded_after(
        "from relaykit.web import html_to_text\nhtml_to_text('<p>x</p>')"
    )
