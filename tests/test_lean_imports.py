"""A worker loads only the optional parts it uses: what `import relaykit` and the worker module
pull into a fresh interpreter (a subprocess, so this test process's imports do not count)."""

from __future__ import annotations

import asyncio
import datetime
import ipaddress
import json
import ssl
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest

from relaykit.devserver import DevServer

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


@pytest.fixture(autouse=True)
def no_proxy_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    """Behind a proxy the model client is httpx's own; these probes (which inherit the
    environment) look at the aiohttp one a worker otherwise builds."""
    from relaykit.models.http_transport import PROXY_VARIABLES

    for name in PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)


CLIENT_SIDE = ("relaykit.client", "relaykit.codec", "relaykit.fork")
"""relaykit modules a worker never uses (imported when their names are first used)."""


def loaded_after(code: str, *, whole_names: bool = False) -> set[str]:
    name = "m" if whole_names else "m.split('.')[0]"
    listing = f"print(json.dumps(sorted({{{name} for m in sys.modules}})))"
    probe = f"{code}\nimport json, sys\n{listing}"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def test_a_worker_that_uses_no_optional_part_does_not_import_one() -> None:
    loaded = loaded_after("import relaykit, relaykit.worker, relaykit.client")
    assert "temporalio" in loaded and "httpx" in loaded  # the probe does see imports
    assert "aiohttp" not in loaded  # loaded when a worker builds its model client
    assert loaded.isdisjoint(OPTIONAL), sorted(loaded & set(OPTIONAL))


def test_a_worker_does_not_import_the_client_side_modules() -> None:
    loaded = loaded_after("import relaykit, relaykit.worker", whole_names=True)
    assert "relaykit.worker" in loaded and "relaykit.agent" in loaded
    assert loaded.isdisjoint(CLIENT_SIDE), sorted(loaded & set(CLIENT_SIDE))


def test_the_client_side_names_are_still_exported_by_relaykit() -> None:
    import relaykit
    import relaykit.client
    import relaykit.codec
    import relaykit.fork

    assert relaykit.connect is relaykit.client.connect
    assert relaykit.RunHandle is relaykit.client.RunHandle
    assert relaykit.load_codec is relaykit.codec.load_codec
    assert relaykit.fork_run is relaykit.fork.fork_run
    assert set(relaykit.__all__) <= set(dir(relaykit))
    assert all(getattr(relaykit, name) is not None for name in relaykit.__all__)
    with pytest.raises(AttributeError):
        relaykit.no_such_name  # noqa: B018


def test_httpx_command_line_module_stays_importable() -> None:
    loaded = loaded_after("import relaykit\nimport httpx._main")
    assert "rich" in loaded  # code that asks for httpx's CLI still gets it, with its deps


def test_fetching_a_page_is_what_loads_the_html_parser() -> None:
    assert "selectolax" not in loaded_after("import relaykit.web")
    assert "selectolax" in loaded_after(
        "from relaykit.web import html_to_text\nhtml_to_text('<p>x</p>')"
    )


def test_a_worker_model_client_loads_no_ca_certificate_before_an_https_call() -> None:
    probe = (
        "from relaykit.activities.model_call import ModelActivities\n"
        "ctx = ModelActivities().http._transport.ssl_context\n"
        "print(ctx.cert_store_stats()['x509_ca'])\n"
        "ctx.wrap_bio(__import__('ssl').MemoryBIO(), __import__('ssl').MemoryBIO(),"
        " server_hostname='example.com')\n"
        "print(ctx.cert_store_stats()['x509_ca'])"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    before, after = (int(n) for n in out.stdout.split())
    assert before == 0  # nothing loaded while the worker starts and serves plain http
    assert after > 0  # the first TLS connection loads the bundle


# --- the model client still verifies https servers (CAs loaded on first use) ------------------


def _ca_and_server_cert(tmp_path: Path) -> tuple[Path, Path, Path]:
    """A throwaway CA, and a certificate for 127.0.0.1 signed by it: (ca, cert, key) files."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def build(subject: str, key: Any, issuer: str, signer: Any, ca: bool) -> x509.Certificate:
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)]))
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
        )
        if ca:
            builder = builder.add_extension(
                x509.KeyUsage(
                    digital_signature=True,
                    content_commitment=False,
                    key_encipherment=False,
                    data_encipherment=False,
                    key_agreement=False,
                    key_cert_sign=True,
                    crl_sign=True,
                    encipher_only=False,
                    decipher_only=False,
                ),
                critical=True,
            )
        else:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                critical=False,
            )
        return builder.sign(signer, hashes.SHA256())

    ca_key, server_key = (
        ec.generate_private_key(ec.SECP256R1()),
        ec.generate_private_key(ec.SECP256R1()),
    )
    ca = build("relaykit test CA", ca_key, "relaykit test CA", ca_key, ca=True)
    cert = build("127.0.0.1", server_key, "relaykit test CA", ca_key, ca=False)
    paths = tmp_path / "ca.pem", tmp_path / "server.pem", tmp_path / "server.key"
    paths[0].write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    paths[1].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    paths[2].write_bytes(
        server_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return paths


async def _https_status(url: str) -> int | str:
    from relaykit.activities.model_call import ModelActivities

    activities = ModelActivities()
    try:
        return (await activities.http.get(url)).status_code
    except httpx.ConnectError as exc:
        return str(exc)
    finally:
        await activities.aclose()


async def test_the_model_client_verifies_https_servers_against_the_ca_bundle(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ca, cert, key = _ca_and_server_cert(tmp_path)
    server_tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_tls.load_cert_chain(cert, key)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await reader.readuntil(b"\r\n\r\n")
            writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
            await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(answer, "127.0.0.1", 0, ssl=server_tls)
    url = f"https://127.0.0.1:{server.sockets[0].getsockname()[1]}/"
    try:
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        refused = await _https_status(url)  # certifi's bundle does not know the test CA
        monkeypatch.setenv("SSL_CERT_FILE", str(ca))
        trusted = await _https_status(url)  # SSL_CERT_FILE, as httpx reads it
    finally:
        server.close()
        await server.wait_closed()
    assert isinstance(refused, str) and "CERTIFICATE_VERIFY_FAILED" in refused, refused
    assert trusted == 200


def test_a_worker_serving_a_run_on_a_local_store_loads_no_optional_part_nor_obstore(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    probe = f"""
import asyncio
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
import relaykit
from relaykit.testing.scripted_server import ScriptedModelServer, call, text

TQ = {f"lean-{uuid.uuid4().hex[:10]}"!r}

@relaykit.tool
def add(a: int, b: int) -> int:
    return a + b

async def main():
    client = await Client.connect(
        {temporal_server.address!r}, namespace={temporal_server.namespace!r},
        data_converter=pydantic_data_converter,
    )
    with ScriptedModelServer() as server:
        server.script("m", [call("add", a=2, b=3), text("5")])
        model = relaykit.ModelSpec(provider="openai", name="m", base_url=server.base_url + "/v1")
        agent = relaykit.Agent(name="a", instructions="x", model=model, tools=[add])
        store = {str(tmp_path / "store")!r}
        async with relaykit.Worker(client, agent, task_queue=TQ, store=store):
            result = await relaykit.run(client, "a", "2 + 3?", task_queue=TQ)
    assert result.output == "5", result

asyncio.run(main())
"""
    loaded = loaded_after(probe, whole_names=True)
    assert "aiohttp.client_proto" in loaded  # the worker's model client
    assert any((tmp_path / "store").rglob("*")), "the run stored its transcript locally"
    tops = {name.split(".")[0] for name in loaded}
    assert tops.isdisjoint(OPTIONAL), sorted(tops & set(OPTIONAL))
    assert "temporalio.contrib.opentelemetry" not in loaded  # tracing is off
    assert "obstore" not in tops  # local files are read and written directly
