"""Encryption end to end: a payload codec named once (``RELAYKIT_CODEC``) is used by clients,
workers, every command, the transcript store and the codec server; with the AES-GCM codec no
plaintext personal data reaches Temporal's history, the server's database or the store."""

from __future__ import annotations

import asyncio
import base64
import json
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import Any

import httpx
import pytest
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
)
from temporalio.exceptions import ApplicationError

import relaykit
from relaykit import Agent, ConfigurationError, start_run, tool
from relaykit.codecs.aes import AesGcmCodec, key_id_of
from relaykit.devserver import DevServer, find_temporal_cli
from relaykit.messages import Message
from relaykit.storage import Store, scope_for
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.transcripts import TranscriptNotFound, TranscriptStore
from tests.support import scripted_model, serving
from tests.wedge import watching

ROOT = Path(__file__).resolve().parents[1]
KEY = base64.b64encode(bytes(range(32))).decode()
OTHER_KEY = bytes(range(1, 33)).hex()
NAME = "Jane Example"
IBAN = "DE89 3704 0044 0532 0130 00"
PII = (NAME, IBAN, IBAN.replace(" ", ""), "Jane")
CODEC_ENV = {"RELAYKIT_CODEC": "relaykit.codecs.aes:AesGcmCodec", "RELAYKIT_CODEC_KEY": KEY}


def aes() -> AesGcmCodec:
    return AesGcmCodec(KEY)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def base_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("RELAYKIT_CODEC")}
    return {**env, "NO_COLOR": "1", "COLUMNS": "200", "PYTHONPATH": str(ROOT), **extra}


async def relaykit_cmd(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "relaykit.cli",
        *args,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


def assert_no_pii(data: bytes, where: str) -> None:
    for secret in PII:
        for form in (secret.encode(), secret.encode("utf-16-le")):
            assert form not in data, f"{secret!r} in plaintext in {where}"


async def raw_history(client: Client, workflow_id: str) -> bytes:
    history = await client.get_workflow_handle(workflow_id).fetch_history()
    return history.to_json().encode() + b"".join(e.SerializeToString() for e in history.events)


def store_bytes(directory: Path) -> tuple[int, bytes]:
    files = [p for p in directory.rglob("*") if p.is_file()]
    return len(files), b"".join(p.read_bytes() for p in files)


# --- connect() composes codecs and converters --------------------------------------------------


class Rot13Codec(PayloadCodec):
    """A codec of the caller's own (reversible, visibly not JSON)."""

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [
            Payload(metadata={"encoding": b"binary/rot"}, data=p.SerializeToString()[::-1])
            for p in payloads
        ]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") == b"binary/rot":
                decoded = Payload()
                decoded.ParseFromString(p.data[::-1])
                out.append(decoded)
            else:
                out.append(p)
        return out


class MyFailureConverter(DefaultFailureConverter):
    pass


async def test_connect_keeps_a_callers_codec_and_gives_it_pydantic_conversion(
    temporal_server: DevServer, model_server: ScriptedModelServer
) -> None:
    codec = Rot13Codec()
    by_codec = await relaykit.connect(temporal_server.address, codec=codec)
    converter = by_codec.data_converter
    assert converter.payload_codec is codec
    assert issubclass(converter.payload_converter_class, PydanticPayloadConverter)
    # Failure messages may quote prompts or tool output: with a codec they are encoded too.
    assert converter.failure_converter_class is DefaultFailureConverterWithEncodedAttributes

    mine = DataConverter(payload_codec=codec, failure_converter_class=MyFailureConverter)
    by_converter = await relaykit.connect(temporal_server.address, data_converter=mine)
    kept = by_converter.data_converter
    assert kept.payload_codec is codec
    assert kept.failure_converter_class is MyFailureConverter
    assert issubclass(kept.payload_converter_class, PydanticPayloadConverter)

    with pytest.raises(ConfigurationError, match="two payload codecs"):
        await relaykit.connect(temporal_server.address, codec=aes(), data_converter=mine)

    # A run on a worker built on that client: its history holds only codec-encoded payloads,
    # and the client reads the typed result.
    model = scripted_model(model_server)
    model_server.script(model.name, [text("done with the rot codec")])
    agent = Agent(name="rot_agent", model=model)
    async with serving(by_converter, agent) as worker:
        handle = await start_run(by_converter, agent, "hello rot", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "done with the rot codec"
    history = await handle.workflow.fetch_history()
    started = history.events[0].workflow_execution_started_event_attributes
    assert [p.metadata["encoding"] for p in started.input.payloads] == [b"binary/rot"]
    assert b"hello rot" not in history.events[0].SerializeToString()


async def test_connect_uses_the_codec_relaykit_codec_names(
    temporal_server: DevServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("RELAYKIT_CODEC", "relaykit.codecs.aes:AesGcmCodec")
    monkeypatch.setenv("RELAYKIT_CODEC_KEY", KEY)
    client = await relaykit.connect(temporal_server.address)
    codec = client.data_converter.payload_codec
    assert isinstance(codec, AesGcmCodec) and codec.key_id == key_id_of(base64.b64decode(KEY))
    # An explicit codec wins over the environment.
    explicit = Rot13Codec()
    assert (
        await relaykit.connect(temporal_server.address, codec=explicit)
    ).data_converter.payload_codec is explicit
    monkeypatch.setenv("RELAYKIT_CODEC", "relaykit.codecs.aes:nothing_here")
    with pytest.raises(ConfigurationError, match="has no attribute 'nothing_here'"):
        await relaykit.connect(temporal_server.address)


def cli_in_process(*args: str, env: dict[str, str]) -> tuple[int, str, str]:
    """The command line in this process (for failures before any connection: no subprocess
    start-up cost); ``env`` is set for the call only."""
    from typer.testing import CliRunner

    from relaykit.cli import app

    cleared = {k: None for k in os.environ if k.startswith("RELAYKIT_CODEC")}
    done = CliRunner().invoke(app, list(args), env={**cleared, "NO_COLOR": "1", **env})
    return done.exit_code, done.stdout, done.stderr


@pytest.mark.parametrize(
    ("codec", "message"),
    [
        ("no_such_codec_module:Codec", "error: cannot import codec module 'no_such_codec_module'"),
        (
            "relaykit.codecs.aes:Missing",
            "error: module 'relaykit.codecs.aes' has no attribute 'Missing'",
        ),
        (
            "relaykit.codecs.aes:ENCODING",
            "error: relaykit.codecs.aes:ENCODING is a bytes, not a temporalio PayloadCodec",
        ),
        ("just-a-name", "error: codec 'just-a-name' is not of the form module:attr"),
    ],
)
def test_a_codec_that_cannot_be_loaded_is_one_clear_cli_line(
    temporal_server: DevServer, codec: str, message: str
) -> None:
    for command in (["runs"], ["events", "some-run"], ["codec-server"]):
        code, out, err = cli_in_process(
            *command, env={"TEMPORAL_ADDRESS": temporal_server.address, "RELAYKIT_CODEC": codec}
        )
        assert code == 1 and out == ""
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith(message), err


def test_aes_codec_with_a_missing_or_malformed_key_is_one_clear_cli_line(
    temporal_server: DevServer,
) -> None:
    env = {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "RELAYKIT_CODEC": CODEC_ENV["RELAYKIT_CODEC"],
    }
    code, _, err = cli_in_process("runs", env=env)
    assert code == 1 and err.strip().splitlines() == [
        "error: RELAYKIT_CODEC_KEY is not set (hint: the AES-GCM codec needs a 32-byte key)"
    ]
    code, _, err = cli_in_process("runs", env={**env, "RELAYKIT_CODEC_KEY": "c2hvcnQ="})
    assert code == 1 and len(err.strip().splitlines()) == 1
    assert "RELAYKIT_CODEC_KEY is not a 32-byte key" in err and "c2hvcnQ" not in err


async def test_a_codec_set_for_the_worker_process_is_one_clear_line_when_broken(
    temporal_server: DevServer,
) -> None:
    # `relaykit worker` as a real process: the codec is loaded before it serves anything.
    env = base_env(
        TEMPORAL_ADDRESS=temporal_server.address, RELAYKIT_CODEC="no_such_codec_module:C"
    )
    code, _out, err = await relaykit_cmd("worker", "examples.encryption", env=env)
    assert code == 1 and err.strip().splitlines() == [
        "error: cannot import codec module 'no_such_codec_module': No module named "
        "'no_such_codec_module' (hint: set RELAYKIT_CODEC=module:attr, e.g. "
        "relaykit.codecs.aes:AesGcmCodec)"
    ]


# --- the AES-GCM codec ---------------------------------------------------------------------------


async def test_aes_codec_round_trips_rotates_keys_and_refuses_other_keys() -> None:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(IBAN).encode())
    old = AesGcmCodec(OTHER_KEY)
    [sealed_old] = await old.encode([plain])
    assert sealed_old.metadata["encoding"] == b"binary/encrypted"
    assert sealed_old.metadata["encryption-key-id"] == old.key_id.encode()
    assert IBAN.encode() not in sealed_old.SerializeToString()
    # Two encodings of one payload differ (fresh nonce each time).
    assert (await old.encode([plain]))[0].data != sealed_old.data

    rotated = AesGcmCodec(KEY, old_keys=[OTHER_KEY])
    assert await rotated.decode([sealed_old]) == [plain]
    [sealed_new] = await rotated.encode([plain])
    assert (
        sealed_new.metadata["encryption-key-id"] == rotated.key_id.encode() != old.key_id.encode()
    )
    assert await rotated.decode([sealed_new]) == [plain]
    # Payloads written before encryption was turned on are read as they are.
    assert await rotated.decode([plain]) == [plain]

    with pytest.raises(ConfigurationError, match="not configured here"):
        await old.decode([sealed_new])
    impostor = AesGcmCodec(OTHER_KEY, key_id=rotated.key_id)  # same id, another key
    with pytest.raises(ConfigurationError, match="does not decrypt"):
        await impostor.decode([sealed_new])
    tampered = Payload()
    tampered.CopyFrom(sealed_new)
    tampered.data = sealed_new.data[:-1] + bytes([sealed_new.data[-1] ^ 1])
    with pytest.raises(ConfigurationError, match="does not decrypt"):
        await rotated.decode([tampered])

    from_env = AesGcmCodec(
        env={
            "RELAYKIT_CODEC_KEY": KEY,
            "RELAYKIT_CODEC_KEY_ID": "2026-11",
            "RELAYKIT_CODEC_OLD_KEYS": f"2025:{OTHER_KEY}",
        }
    )
    assert from_env.key_id == "2026-11"
    reissued = AesGcmCodec(OTHER_KEY, key_id="2025")
    assert await from_env.decode(await reissued.encode([plain])) == [plain]


# --- the transcript store -------------------------------------------------------------------------


async def test_transcript_store_with_a_codec_writes_no_plaintext_and_reads_its_nodes_back(
    tmp_path: Path,
) -> None:
    store = TranscriptStore(Store(tmp_path, codec=aes()))
    scope = scope_for("payout-run")
    first = [Message(role="user", content=f"I am {NAME}, IBAN {IBAN}")]
    digest = await store.save(scope, None, first)
    await store.save_static(scope, "ab" * 16, {"system": f"You help {NAME}."})
    count, data = store_bytes(tmp_path)
    assert count == 2
    assert_no_pii(data, "the transcript store")

    fresh = TranscriptStore(Store(tmp_path, codec=aes()))  # another worker: nothing cached
    assert [m.content for m in await fresh.load(scope, digest)] == [first[0].content]
    assert await fresh.load_static(scope, "ab" * 16) == {"system": f"You help {NAME}."}
    # A worker without the codec cannot read the nodes: they count as missing (the run then
    # resends the transcript inline), never as garbage.
    with pytest.raises(TranscriptNotFound):
        await TranscriptStore(Store(tmp_path)).load(scope, digest)


# --- the codec server -----------------------------------------------------------------------------


@pytest.fixture()
def codec_server() -> Iterator[str]:
    port = free_port()
    env = base_env(**CODEC_ENV, RELAYKIT_CODEC_AUTH="Bearer let-me-in")
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "codec-server", "--port", str(port)],
        cwd=ROOT,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline()  # printed once it listens
        assert line.startswith(f"codec server on {url} (Authorization required)"), line
        yield url
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def payloads_json(*payloads: Payload) -> dict[str, Any]:
    return {
        "payloads": [
            {
                "metadata": {k: base64.b64encode(v).decode() for k, v in p.metadata.items()},
                "data": base64.b64encode(p.data).decode(),
            }
            for p in payloads
        ]
    }


def payloads_from(body: dict[str, Any]) -> list[Payload]:
    return [
        Payload(
            metadata={k: base64.b64decode(v) for k, v in p.get("metadata", {}).items()},
            data=base64.b64decode(p.get("data", "")),
        )
        for p in body["payloads"]
    ]


async def test_codec_server_encodes_and_decodes_for_callers_with_the_right_authorization(
    codec_server: str,
) -> None:
    plain = Payload(metadata={"encoding": b"json/plain"}, data=json.dumps(NAME).encode())
    auth = {"Authorization": "Bearer let-me-in", "X-Namespace": "default"}
    async with httpx.AsyncClient(base_url=codec_server, timeout=10) as http:
        encoded = await http.post("/encode", json=payloads_json(plain), headers=auth)
        assert encoded.status_code == 200
        [sealed] = payloads_from(encoded.json())
        assert sealed.metadata["encoding"] == b"binary/encrypted"
        assert await aes().decode([sealed]) == [plain]  # what workers with the key read

        from_worker = await aes().encode([plain])
        decoded = await http.post("/decode", json=payloads_json(*from_worker), headers=auth)
        assert decoded.status_code == 200 and payloads_from(decoded.json()) == [plain]

        # The Temporal UI's browser preflight from its origin is allowed; other origins are not.
        preflight = await http.options(
            "/decode",
            headers={
                "Origin": "http://localhost:8233",
                "Access-Control-Request-Method": "POST",
                "Access-Control-Request-Headers": "content-type,x-namespace,authorization",
            },
        )
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "http://localhost:8233"
        evil = await http.options(
            "/decode",
            headers={"Origin": "http://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in evil.headers

        refused = await http.post("/decode", json=payloads_json(*from_worker))
        assert refused.status_code == 401 and refused.json() == {"error": "unauthorized"}
        wrong = await http.post(
            "/decode", json=payloads_json(*from_worker), headers={"Authorization": "Bearer guess"}
        )
        assert wrong.status_code == 401
        garbage = await http.post("/decode", content=b"not json", headers=auth)
        assert garbage.status_code == 400
        other_key = await AesGcmCodec(OTHER_KEY).encode([plain])
        undecodable = await http.post("/decode", json=payloads_json(*other_key), headers=auth)
        assert (
            undecodable.status_code == 422 and "not configured here" in undecodable.json()["error"]
        )


def test_codec_server_logs_each_refused_request_without_the_token() -> None:
    # A UI or CLI with a wrong token sees only 401s; the server's operator needs to see them too,
    # and its log must not become a place the token (or a caller's near-miss) leaks to.
    port = free_port()
    token = "Bearer s3cret-token-value"
    proc = subprocess.Popen(
        [sys.executable, "-m", "relaykit.cli", "codec-server", "--port", str(port)],
        cwd=ROOT,
        env=base_env(**CODEC_ENV, RELAYKIT_CODEC_AUTH=token),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stderr is not None
        assert proc.stderr.readline().startswith("codec server on")
        url = f"http://127.0.0.1:{port}"
        body = payloads_json(Payload(metadata={"encoding": b"json/plain"}, data=b"1"))
        assert httpx.post(f"{url}/decode", json=body, timeout=10).status_code == 401
        near_miss = "Bearer s3cret-token-valuf"
        wrong = httpx.post(
            f"{url}/encode", json=body, headers={"Authorization": near_miss}, timeout=10
        )
        assert wrong.status_code == 401
        ok = httpx.post(f"{url}/encode", json=body, headers={"Authorization": token}, timeout=10)
        assert ok.status_code == 200
    finally:
        proc.terminate()
        _, log = proc.communicate(timeout=10)
    refused = [line for line in log.splitlines() if "refused" in line]
    assert len(refused) == 2, log
    assert refused[0].endswith("refused POST /decode from 127.0.0.1 (401): no Authorization header")
    assert refused[1].endswith(
        "refused POST /encode from 127.0.0.1 (401): a different Authorization header"
    )
    assert "s3cret" not in log


# --- an encrypted deployment: server with a database file, worker process, commands --------------


class Deployment:
    def __init__(self, server: DevServer, store: Path, model: str, task_queue: str) -> None:
        self.server = server
        self.store = store
        self.model = model
        self.task_queue = task_queue
        self.env = base_env(
            **CODEC_ENV,
            TEMPORAL_ADDRESS=server.address,
            RELAYKIT_TRANSCRIPT_DIR=str(store),
        )
        self.plain_env = base_env(TEMPORAL_ADDRESS=server.address)

    async def client(self) -> Client:
        return await relaykit.connect(self.server.address, codec=aes())


@pytest.fixture(scope="module")
def deployment(
    tmp_path_factory: pytest.TempPathFactory, model_server: ScriptedModelServer
) -> Iterator[Deployment]:
    """A dev server keeping its state in a SQLite file, and a ``relaykit worker`` process for
    ``examples.encryption`` that, like every command here, gets the codec from the environment."""
    base = tmp_path_factory.mktemp("encrypted")
    model = f"m-enc-{uuid.uuid4().hex[:8]}"
    task_queue = f"tq-enc-{uuid.uuid4().hex[:8]}"
    with DevServer(port=0, headless=True, data_dir=base / "server") as server:
        setup = Deployment(server, base / "transcripts", model, task_queue)
        worker_env = {
            **setup.env,
            "RELAYKIT_MODEL": f"openai:{model}",
            "OPENAI_BASE_URL": f"{model_server.base_url}/v1",
        }
        worker = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "relaykit.cli",
                "worker",
                "examples.encryption",
                "-q",
                task_queue,
            ],
            cwd=ROOT,
            env=worker_env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            assert worker.stderr is not None
            seen: list[str] = []
            reader = threading.Thread(
                target=lambda: seen.extend(_read_until(worker.stderr, "serving:")), daemon=True
            )
            reader.start()
            reader.join(60)
            assert seen and "serving: payouts" in seen[-1], "".join(seen) or "no output in 60 s"
            threading.Thread(
                target=worker.stderr.read, daemon=True
            ).start()  # keep the pipe drained
            yield setup
        finally:
            worker.terminate()
            worker.wait(timeout=15)


@pytest.fixture(autouse=True)
async def _wedges_on_the_deployments_server(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """The session's wedge detector watches only the session's server; this one watches the
    deployment's, with the same declarations."""
    if "deployment" not in request.fixturenames:
        yield
        return
    deployment: Deployment = request.getfixturevalue("deployment")
    async with watching(request.node, deployment.server.address):
        yield


def _read_until(stream: Any, marker: str) -> list[str]:
    """Lines of a worker's log up to the one with ``marker`` (all of them if it exits first)."""
    seen: list[str] = []
    for line in iter(stream.readline, ""):
        seen.append(line)
        if marker in line:
            break
    return seen or [""]


async def wait_pending(client: Client, run_id: str, timeout: float = 30) -> list[Any]:
    handle = relaykit.get_run(client, run_id)
    deadline = time.monotonic() + timeout
    while not (pending := await handle.pending_approvals()):
        assert time.monotonic() < deadline, "no pending approval"
        await asyncio.sleep(0.05)
    return pending


async def test_every_command_works_on_an_encrypted_run(
    deployment: Deployment, model_server: ScriptedModelServer
) -> None:
    model_server.script(
        deployment.model,
        [
            call("account_details", customer=NAME),
            call("send_payout", id="call_pay", iban=IBAN, amount_eur=120),
            text(f"Paid 120.00 EUR to {NAME} ({IBAN})."),
            call("send_payout", id="call_never", iban=IBAN, amount_eur=5),
        ],
    )
    env, q = deployment.env, deployment.task_queue
    code, out, err = await relaykit_cmd(
        "run", "payouts", f"Pay {NAME} her refund of 120 EUR", "-q", q, "--id", "enc-pay-1", env=env
    )
    assert code == 0 and out.strip() == "enc-pay-1", err
    client = await deployment.client()
    await wait_pending(client, "enc-pay-1")

    code, out, err = await relaykit_cmd("pending", "enc-pay-1", env=env)
    assert code == 0, err
    assert out.splitlines() == [
        f'call_pay\tpayouts\tsend_payout({{"iban": "{IBAN}", "amount_eur": 120}})'
    ]
    code, out, err = await relaykit_cmd("send", "enc-pay-1", f"{NAME} prefers SEPA", env=env)
    assert (code, out.strip()) == (0, "queued"), err
    code, out, err = await relaykit_cmd("pause", "enc-pay-1", env=env)
    assert (code, out.strip()) == (0, "pause requested"), err
    code, out, err = await relaykit_cmd("resume", "enc-pay-1", env=env)
    assert (code, out.strip()) == (0, "resumed"), err
    code, out, err = await relaykit_cmd("approve", "enc-pay-1", "call_pay", env=env)
    assert (code, out.strip()) == (0, "approved send_payout (call_pay)"), err

    code, out, err = await relaykit_cmd("result", "enc-pay-1", "--json", env=env)
    assert code == 0, err
    result = json.loads(out)
    assert result["output"] == f"Paid 120.00 EUR to {NAME} ({IBAN})."
    tool_results = [m["content"] for m in result["transcript"] if m["role"] == "tool"]
    assert tool_results == [f"{NAME}: IBAN {IBAN}", f"sent 120.00 EUR to {IBAN}"]
    assert f"{NAME} prefers SEPA" in [
        m["content"] for m in result["transcript"] if m["role"] == "user"
    ]

    code, out, err = await relaykit_cmd("events", "enc-pay-1", env=env)
    assert code == 0, err
    assert "approval_requested" in out and "send_payout" in out
    code, out, err = await relaykit_cmd("watch", "enc-pay-1", "--plain", env=env)
    assert code == 0, err
    assert "send_payout" in out and "run completed" in err
    code, out, err = await relaykit_cmd("runs", "--json", env=env)
    assert code == 0, err
    assert "enc-pay-1" in [row["run_id"] for row in json.loads(out)]

    # A second run, cancelled while it waits for an approval.
    code, out, err = await relaykit_cmd(
        "run", "payouts", "Pay 5 EUR", "-q", q, "--id", "enc-pay-2", env=env
    )
    assert code == 0, err
    await wait_pending(client, "enc-pay-2")
    code, out, err = await relaykit_cmd("cancel", "enc-pay-2", env=env)
    assert (code, out.strip()) == (0, "run enc-pay-2 cancelled"), err
    code, out, err = await relaykit_cmd("result", "enc-pay-2", env=env)
    assert code == 1 and "run failed (RunCancelled)" in err


async def test_commands_without_the_codec_fail_in_one_line_before_changing_the_run(
    deployment: Deployment, model_server: ScriptedModelServer
) -> None:
    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [call("send_payout", id="call_hold", iban=IBAN, amount_eur=7), text("paid")],
    )
    client = await deployment.client()
    agent = Agent(name="payouts_nocodec", model=model, tools=[relaykit_example_send_payout()])
    async with serving(client, agent, transcript_dir=deployment.store) as worker:
        handle = await start_run(client, agent, f"Pay {NAME}", task_queue=worker.task_queue)
        await wait_pending(client, handle.id)
        expected = (
            "error: cannot read the run's payloads: they are encoded as 'binary/encrypted' and "
            "no codec here decodes them (hint: set RELAYKIT_CODEC=module:attr to the codec the "
            "workers use)"
        )
        for args in (
            ["approve", handle.id, "call_hold"],
            ["pending", handle.id],
            ["result", handle.id],
            ["send", handle.id, "hi"],
        ):
            code, out, err = await relaykit_cmd(*args, env=deployment.plain_env)
            assert (code, out, err.strip().splitlines()) == (1, "", [expected]), args
        # Another key: the same single line, naming the key id.
        other = {**deployment.env, "RELAYKIT_CODEC_KEY": OTHER_KEY}
        code, out, err = await relaykit_cmd("approve", handle.id, "call_hold", env=other)
        assert code == 1 and len(err.strip().splitlines()) == 1
        assert "is not configured here" in err
        # Nothing was answered: the approval still waits.
        assert [p.call_id for p in await handle.pending_approvals()] == ["call_hold"]
        await handle.approve("call_hold")
        assert (await handle.result()).output == "paid"


@pytest.mark.wedge_expected(
    "the worker cannot decrypt the run's input: every workflow task fails until it is ended",
    cause="WORKFLOW_WORKER_UNHANDLED_FAILURE",
)
async def test_run_wait_with_another_key_than_the_workers_is_one_line_not_an_endless_wait(
    deployment: Deployment,
) -> None:
    # The worker cannot decrypt the run's input, so its workflow task fails on every attempt and
    # Temporal keeps the run open: `run --wait` reads that from the run, not waits forever.
    run_id = f"enc-mismatch-{uuid.uuid4().hex[:6]}"
    other = {**deployment.env, "RELAYKIT_CODEC_KEY": OTHER_KEY}
    code, out, err = await relaykit_cmd(
        "run",
        "payouts",
        f"Pay {NAME} 5 EUR",
        "-q",
        deployment.task_queue,
        "--id",
        run_id,
        "--wait",
        env=other,
    )
    client = await deployment.client()
    await client.get_workflow_handle(run_id).terminate()
    assert (code, out) == (1, ""), err
    lines = err.strip().splitlines()
    assert lines[0].startswith(f"run {run_id}")
    assert lines[1:] == [
        f"error: the worker on task queue {deployment.task_queue!r} cannot run {run_id}, and its "
        "error is encoded as 'binary/encrypted' with a codec or key this command lacks: the "
        "worker and this command use different codecs or keys (hint: give both the same "
        f"RELAYKIT_CODEC and key; the worker keeps retrying; `relaykit terminate {run_id}` ends "
        "the run)"
    ]


async def test_temporal_cli_shows_decoded_payloads_through_the_codec_server(
    deployment: Deployment, model_server: ScriptedModelServer, codec_server: str
) -> None:
    model = scripted_model(model_server)
    model_server.script(model.name, [text(f"Hello {NAME}")])
    client = await deployment.client()
    agent = Agent(name="payouts_shown", model=model)
    async with serving(client, agent, transcript_dir=deployment.store) as worker:
        handle = await start_run(client, agent, f"Greet {NAME}", task_queue=worker.task_queue)
        await handle.result()

    def show(*extra: str) -> str:
        done = subprocess.run(
            [
                find_temporal_cli(),
                "workflow",
                "show",
                "--address",
                deployment.server.address,
                "--workflow-id",
                handle.id,
                "--detailed",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    assert NAME not in await asyncio.to_thread(show)
    decoded = await asyncio.to_thread(
        show, "--codec-endpoint", codec_server, "--codec-auth", "Bearer let-me-in"
    )
    assert f"Greet {NAME}" in decoded and f"Hello {NAME}" in decoded


def relaykit_example_send_payout() -> Any:
    from examples.encryption import send_payout

    return send_payout


async def test_no_plaintext_pii_reaches_history_the_server_database_or_the_transcript_store(
    deployment: Deployment, model_server: ScriptedModelServer
) -> None:
    # An in-process relaykit.Worker on a client with the codec; the prompt, a tool's output, a
    # tool's failure message, an injected message and the answer all carry the name and IBAN.
    @tool
    def check_iban(iban: str) -> str:
        """Check an IBAN.

        Args:
            iban: The IBAN.
        """
        # A failed activity: its message is recorded in history as the failure's message.
        raise ApplicationError(f"bank refused {iban} for {NAME}", non_retryable=True)

    from examples.encryption import account_details

    model = scripted_model(model_server)
    model_server.script(
        model.name,
        [
            call("account_details", customer=NAME),
            call("check_iban", iban=IBAN),
            text(f"{NAME}, your IBAN {IBAN} was refused."),
        ],
    )
    client = await deployment.client()
    agent = Agent(name="payouts_private", model=model, tools=[account_details, check_iban])
    async with serving(client, agent, transcript_dir=deployment.store) as worker:
        handle = await start_run(
            client, agent, f"Pay {NAME}, IBAN {IBAN}", task_queue=worker.task_queue
        )
        result = await handle.result()
    assert result.output == f"{NAME}, your IBAN {IBAN} was refused."
    assert any(f"bank refused {IBAN}" in (m.content or "") for m in result.transcript)
    failed = [
        e
        for e in (await handle.workflow.fetch_history()).events
        if e.HasField("activity_task_failed_event_attributes")
    ]
    assert len(failed) == 1
    assert failed[0].activity_task_failed_event_attributes.failure.message == "Encoded failure"

    for run_id in (handle.id, "enc-pay-1", "enc-pay-2"):
        try:
            assert_no_pii(await raw_history(client, run_id), f"the history of {run_id}")
        except Exception as exc:  # the CLI test may not have run (e.g. -k)
            if "not found" not in str(exc).lower():
                raise
    count, data = store_bytes(deployment.store)
    assert count >= 3
    assert_no_pii(data, "the transcript store")
    db = deployment.server.db_path
    assert db is not None
    server_files = [p for p in db.parent.iterdir() if p.name.startswith(db.name)]
    assert server_files
    assert_no_pii(b"".join(p.read_bytes() for p in server_files), "the server's database")


async def test_relaykit_demo_with_a_codec_keeps_the_server_database_and_store_encrypted(
    tmp_path: Path,
) -> None:
    # `relaykit demo` (like `relaykit dev`) builds its worker and run from the environment's
    # codec: the answer is printed decoded, and the database file and store hold none of it.
    env = base_env(
        **CODEC_ENV, RELAYKIT_MODEL="scripted", RELAYKIT_TRANSCRIPT_DIR=str(tmp_path / "store")
    )
    code, out, err = await relaykit_cmd(
        "demo",
        "--exit",
        "--port",
        str(free_port()),
        "--ui-port",
        str(free_port()),
        "--data-dir",
        str(tmp_path / "server"),
        env=env,
    )
    assert code == 0, err
    answer = "500.00 EUR = 81967.21 JPY"
    assert answer in out
    stored = b"".join(p.read_bytes() for p in tmp_path.rglob("*") if p.is_file())
    assert (tmp_path / "server" / "temporal.db").exists() and any((tmp_path / "store").rglob("*"))
    for secret in (answer, "81967.21", "convert_currency("):
        assert secret.encode() not in stored
