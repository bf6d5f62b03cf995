"""Keep a worker from loading what it never uses.

httpx's ``__init__`` imports its own command-line client (``httpx._main``) whenever click, rich
and pygments are installed, and relaykit's CLI installs them; so every worker, which only needs
httpx's client, would carry those three libraries (about 3 MB of resident memory). Importing
httpx once with ``httpx._main`` marked absent makes httpx fall back to its stub ``main``; the
mark is removed again at once, so code that wants ``httpx._main`` can still import it.
"""

from __future__ import annotations

import sys


def import_httpx_without_its_cli() -> None:
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None: "cannot be imported"
    try:
        import httpx  # noqa: F401
    finally:
        if "httpx._main" in sys.modules and sys.modules["httpx._main"] is None:
            del sys.modules["httpx._main"]


import_httpx_without_its_cli()
