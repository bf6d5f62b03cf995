"""Keep a worker from loading or building what it never uses.

httpx's ``__init__`` imports its own command-line client (``httpx._main``) whenever click, rich
and pygments are installed, and relaykit's CLI installs them; so every worker, which only needs
httpx's client, would carry those three libraries (about 3 MB of resident memory). Importing
httpx once with ``httpx._main`` marked absent makes httpx fall back to its stub ``main``; the
mark is removed again at once, so code that wants ``httpx._main`` can still import it.

:class:`DeferredCAContext` puts off loading TLS certificates until a connection needs them.
"""

from __future__ import annotations

import os
import ssl
import sys
import threading
from typing import Any


def import_httpx_without_its_cli() -> None:
    if "httpx" in sys.modules or "httpx._main" in sys.modules:
        return
    sys.modules["httpx._main"] = None  # type: ignore[assignment]  # None: "cannot be imported"
    try:
        import httpx  # noqa: F401
    finally:
        if "httpx._main" in sys.modules and sys.modules["httpx._main"] is None:
            del sys.modules["httpx._main"]


class DeferredCAContext(ssl.SSLContext):
    """The TLS context of ``ssl.create_default_context()`` (as httpx builds it for
    ``verify=True``), except that the CA certificates are loaded on the first TLS connection.

    Loading certifi's bundle into a context costs a worker about 1.3 MB of resident memory when
    its model client is created; a worker whose model server speaks plain HTTP (a local model
    server, a sidecar) never needs it. Loading follows httpx: ``SSL_CERT_FILE``, else
    ``SSL_CERT_DIR``, else certifi's bundle.
    """

    def __new__(cls) -> DeferredCAContext:
        return super().__new__(cls, ssl.PROTOCOL_TLS_CLIENT)

    def __init__(self) -> None:
        super().__init__()
        self.verify_mode = ssl.CERT_REQUIRED
        self.check_hostname = True
        keylog = os.environ.get("SSLKEYLOGFILE")
        if keylog and not sys.flags.ignore_environment:
            self.keylog_filename = keylog
        self._cas_loaded = False
        self._cas_lock = threading.Lock()

    def load_cas(self) -> None:
        if self._cas_loaded:
            return
        with self._cas_lock:
            if self._cas_loaded:
                return
            if os.environ.get("SSL_CERT_FILE"):
                self.load_verify_locations(cafile=os.environ["SSL_CERT_FILE"])
            elif os.environ.get("SSL_CERT_DIR"):
                self.load_verify_locations(capath=os.environ["SSL_CERT_DIR"])
            else:
                import certifi

                self.load_verify_locations(cafile=certifi.where())
            self._cas_loaded = True

    def wrap_socket(self, *args: Any, **kwargs: Any) -> ssl.SSLSocket:
        self.load_cas()
        return super().wrap_socket(*args, **kwargs)

    def wrap_bio(self, *args: Any, **kwargs: Any) -> ssl.SSLObject:
        self.load_cas()
        return super().wrap_bio(*args, **kwargs)


import_httpx_without_its_cli()
