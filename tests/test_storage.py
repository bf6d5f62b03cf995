"""The storage layer: one store by URL, safe keys, atomic private writes, codec encoding,
payloads beyond Temporal's limit, retention (``relaykit gc``) and old-layout compatibility."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import PayloadCodec

from relaykit import Agent, RunInput, start_run, tool
from relaykit.devserver import DevServer
from relaykit.messages import Message
from relaykit.payload_storage import StoreDriver, with_external_storage
from relaykit.runs import RunResult, RunState
from relaykit.storage import INLINE_WRITE_BYTES, InvalidKey, Store, StoreError, scope_for
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from relaykit.transcripts import TranscriptNotFound, TranscriptStore
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW
from tests.support import history_events, scripted_model, serving

ROOT = Path(__file__).resolve().parents[1]
PII = "Jane Roe, IBAN DE44500105175407324931"


@pytest.fixture(autouse=True)
def no_store_left_behind(tmp_path: Path) -> Iterator[None]:
    """Stores hold transcripts: remove each test's temporary folder when it ends."""
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


class AesGcmCodec(PayloadCodec):
    """A small encrypting codec (the key would come from the environment in production)."""

    def __init__(self) -> None:
        self.aead = AESGCM(AESGCM.generate_key(bit_length=256))

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            nonce = os.urandom(12)
            sealed = self.aead.encrypt(nonce, p.SerializeToString(), None)
            out.append(
                Payload(metadata={"encoding": b"binary/test-encrypted"}, data=nonce + sealed)
            )
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for p in payloads:
            if p.metadata.get("encoding") != b"binary/test-encrypted":
                out.append(p)
                continue
            out.append(Payload.FromString(self.aead.decrypt(p.data[:12], p.data[12:], None)))
        return out


def stored_files(directory: Path) -> list[Path]:
    return [p for p in directory.rglob("*") if p.is_file()]


async def client_with(client: Client, **converter: object) -> Client:
    """The shared test client with another data converter."""
    config = client.config()
    config["data_converter"] = converter["data_converter"]
    return Client(**config)


# --- keys and writes --------------------------------------------------------------------------


async def test_a_digest_that_is_not_hex_is_missing_and_never_read_from_outside_the_store(
    tmp_path: Path,
) -> None:
    store_dir = tmp_path / "store"
    (tmp_path / "outside.json").write_text(
        json.dumps({"parent": None, "messages": [{"role": "user", "content": "secret"}]})
    )
    transcripts = TranscriptStore(store_dir)
    for bad in ("../outside", "../../outside", "..", "/etc/passwd", "A" * 32, "0" * 31, "0" * 64):
        with pytest.raises(TranscriptNotFound):
            await transcripts.load("run", bad)
        with pytest.raises(TranscriptNotFound):
            await transcripts.load_static("run", bad)


async def test_a_forged_context_ref_in_a_raw_start_input_resends_inline_without_reading_outside(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # As `temporal workflow start --type AgentRun` with a hand-written input could do.
    store_dir = tmp_path / "store"
    secret = "contents of a file outside the store"
    for name in ("outside.json", "outside"):
        (tmp_path / name).write_text(
            json.dumps({"parent": None, "messages": [{"role": "user", "content": secret}]})
        )
    model = scripted_model(model_server)
    model_server.script(model.name, [text("answered")])
    agent = Agent(name="forged", model=model)
    async with serving(client, agent, transcript_dir=store_dir) as worker:
        state = RunState(
            agent="forged",
            run_path=["forged"],
            transcript=[Message.user("hello")],
            context_ref="../outside",
            context_ref_count=0,
        )
        handle = await client.start_workflow(
            AGENT_RUN_WORKFLOW,
            RunInput(agent="forged", input="hello", state=state),
            id=f"forged-{uuid.uuid4().hex[:8]}",
            task_queue=worker.task_queue,
            result_type=RunResult,
        )
        result = await handle.result()
    assert result.output == "answered"
    sent = json.dumps([r.body for r in model_server.requests(model.name)])
    assert secret not in sent
    assert "hello" in sent


async def test_many_concurrent_saves_of_one_digest_all_succeed(tmp_path: Path) -> None:
    part = {"system": "the same static part every run of an agent sends", "tools": []}
    stores = [TranscriptStore(tmp_path / "store") for _ in range(12)]  # 12 workers
    digest = "ab" * 16

    async def save_many(store: TranscriptStore) -> None:
        for _ in range(100):
            await store.store.put(f"runs/r/static/{digest}", json.dumps(part).encode())
            await store.save_static("r", digest, part)

    await asyncio.gather(*(save_many(s) for s in stores))
    assert await TranscriptStore(tmp_path / "store").load_static("r", digest) == part
    assert not [p for p in stored_files(tmp_path) if p.name.endswith(".tmp")]


async def test_a_small_local_write_stays_on_the_event_loop_and_a_large_one_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A transcript node is written where the model call runs (a thread hop cost more than the
    # write); an object past INLINE_WRITE_BYTES is written on a thread, so the loop never waits.
    store = Store(tmp_path / "store")
    threads: dict[str, int] = {}
    write = store._put_local

    def recorded(key: str, data: bytes) -> None:
        threads[key] = threading.get_ident()
        write(key, data)

    monkeypatch.setattr(store, "_put_local", recorded)
    small, large = b'{"n": 1}', b"x" * (INLINE_WRITE_BYTES + 1)
    await store.put("runs/r/t/ab/small", small)
    await store.put("runs/r/t/ab/large", large)
    assert threads["runs/r/t/ab/small"] == threading.get_ident()
    assert threads["runs/r/t/ab/large"] != threading.get_ident()
    assert await store.get("runs/r/t/ab/small") == small
    assert await store.get("runs/r/t/ab/large") == large
    assert not [p for p in stored_files(tmp_path) if p.name.endswith(".tmp")]


async def test_local_store_files_are_private_and_runs_are_kept_under_their_root(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    @tool
    def look(n: int) -> str:
        """Look."""
        return f"seen {n}"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("look", n=1), call("look", n=2), text("done")])
    agent = Agent(name="private", model=model, tools=[look])
    store_dir = tmp_path / "store"
    async with serving(client, agent, transcript_dir=store_dir) as worker:
        handle = await start_run(client, agent, "go", task_queue=worker.task_queue)
        assert (await handle.result()).output == "done"
    files = stored_files(store_dir)
    assert files
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o600 for p in files)
    folders = [store_dir, *(p for p in store_dir.rglob("*") if p.is_dir())]
    assert all(stat.S_IMODE(p.stat().st_mode) == 0o700 for p in folders)
    assert {p.relative_to(store_dir).parts[:2] for p in files} == {("runs", scope_for(handle.id))}


async def test_transcript_refs_of_the_old_flat_layout_still_resolve(tmp_path: Path) -> None:
    # Nodes a worker of an earlier version wrote: <dir>/<ab>/<digest>.json, static/<digest>.json
    old = TranscriptStore(tmp_path / "elsewhere")
    digest = await old.save("x", None, [Message.user("task"), Message.assistant("a")])
    node = (await old.store.get(f"runs/x/t/{digest[:2]}/{digest}")) or b""
    legacy_dir = tmp_path / "transcripts"
    (legacy_dir / digest[:2]).mkdir(parents=True)
    (legacy_dir / digest[:2] / f"{digest}.json").write_bytes(node)
    (legacy_dir / "static").mkdir()
    (legacy_dir / "static" / f"{'c' * 32}.json").write_text(json.dumps({"system": "old"}))
    for store in (
        TranscriptStore(legacy_dir),
        TranscriptStore(tmp_path / "new", legacy_dir=legacy_dir),
    ):
        assert [m.content for m in await store.load("run-9", digest)] == ["task", "a"]
        assert await store.load_static("run-9", "c" * 32) == {"system": "old"}
        newer = await store.save("run-9", digest, [Message.user("more")])  # chains onto it
        assert [
            m.content
            for m in await TranscriptStore(store.store, legacy_dir=legacy_dir).load("run-9", newer)
        ] == [
            "task",
            "a",
            "more",
        ]


# --- codec --------------------------------------------------------------------------------------


async def test_with_a_codec_no_plaintext_reaches_the_store_or_history(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    codec = AesGcmCodec()
    import dataclasses

    encrypted = await client_with(
        client, data_converter=dataclasses.replace(pydantic_data_converter, payload_codec=codec)
    )

    @tool
    def account() -> str:
        """The customer's account."""
        return f"account holder: {PII}"

    model = scripted_model(model_server)
    model_server.script(model.name, [call("account"), text(f"confirmed for {PII}")])
    agent = Agent(name="banker", model=model, tools=[account])
    store_dir = tmp_path / "store"
    async with serving(encrypted, agent, transcript_dir=store_dir) as worker:
        assert worker.store.codec is codec
        handle = await start_run(encrypted, agent, f"check {PII}", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == f"confirmed for {PII}"
    files = stored_files(store_dir)
    assert files
    for path in files:
        assert b"IBAN" not in path.read_bytes() and b"Jane" not in path.read_bytes()
    for event in await history_events(handle.workflow):
        assert b"IBAN" not in event.SerializeToString()
    # The stored transcript reads back through the codec.
    plain = TranscriptStore(Store(store_dir, codec=codec))
    ref = result.transcript_ref
    assert ref is not None
    assert PII in json.dumps([m.content for m in await plain.load(scope_for(handle.id), ref)])
    with pytest.raises(TranscriptNotFound):  # without the codec: missing, the run resends
        await TranscriptStore(Store(store_dir)).load(scope_for(handle.id), ref)


# --- payloads beyond Temporal's limit ----------------------------------------------------------


async def test_a_3mb_prompt_and_a_3mb_tool_output_complete_a_run(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    store = Store(tmp_path / "store")
    big_client = await client_with(
        client, data_converter=with_external_storage(pydantic_data_converter, store)
    )
    page = "p" * 3_000_000

    @tool(max_output_chars=4_000_000)
    def fetch() -> str:
        """A 3 MB page."""
        return page

    model = scripted_model(model_server)
    model_server.script(model.name, [call("fetch"), text("read both")])
    agent = Agent(name="bigreader", model=model, tools=[fetch])
    prompt = "q" * 3_000_000
    async with serving(big_client, agent, store=store) as worker:
        handle = await start_run(big_client, agent, prompt, task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "read both"
    assert [len(m.content) for m in result.transcript if m.role == "tool"] == [3_000_000]
    last = model_server.requests(model.name)[-1]
    assert sum(len(str(m.get("content"))) for m in last.messages) > 6_000_000
    events = await history_events(handle.workflow)
    assert max(e.ByteSize() for e in events) < 100_000  # references, not blobs
    payloads = [o async for o in store.list(f"runs/{scope_for(handle.id)}/payloads/")]
    assert len(payloads) >= 3  # start input, tool result, model request, result


async def test_a_forged_payload_reference_cannot_read_outside_the_store(tmp_path: Path) -> None:
    from temporalio.converter import StorageDriverClaim, StorageDriverRetrieveContext

    (tmp_path / "outside").write_bytes(b"secret")
    driver = StoreDriver(Store(tmp_path / "store"))
    for key in ("../outside", "runs/x/payloads/../../../outside", "runs/x/t/" + "0" * 64, ""):
        with pytest.raises(InvalidKey):
            await driver.retrieve(
                StorageDriverRetrieveContext(), [StorageDriverClaim({"key": key})]
            )
    with pytest.raises(StoreError, match="not in the store"):
        await driver.retrieve(
            StorageDriverRetrieveContext(),
            [StorageDriverClaim({"key": "runs/x/payloads/" + "0" * 64})],
        )


# --- retention ----------------------------------------------------------------------------------


def relaykit_cli(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relaykit.cli", *args],
        cwd=ROOT,
        env={**os.environ, "NO_COLOR": "1", "COLUMNS": "200", **env},
        capture_output=True,
        text=True,
        timeout=120,
    )


async def test_gc_deletes_closed_runs_after_the_retention_and_keeps_running_ones(
    client: Client, model_server: ScriptedModelServer, temporal_server: DevServer, tmp_path: Path
) -> None:
    model = scripted_model(model_server)
    gate = threading.Event()

    @tool
    def wait() -> str:
        """Wait."""
        return "waited"

    def respond(request):  # type: ignore[no-untyped-def]
        if "quick" in request.last_user_text:
            return text("finished")
        if any(m["role"] == "tool" for m in request.messages):
            return text("slow done", hold=gate)
        return call("wait")

    model_server.respond(model.name, respond)
    agent = Agent(name="keeper", model=model, tools=[wait])
    store_dir = tmp_path / "store"
    env = {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": temporal_server.namespace,
        "RELAYKIT_STORE": store_dir.as_uri(),
    }
    async with serving(client, agent, transcript_dir=store_dir) as worker:
        done = await start_run(client, agent, "quick", task_queue=worker.task_queue)
        await done.result()
        slow = await start_run(client, agent, "slow", task_queue=worker.task_queue)
        await asyncio.to_thread(model_server.wait_for_requests, model.name, 3)
        kept = await asyncio.to_thread(relaykit_cli, "gc", "--retention", "1h", env=env)
        assert kept.returncode == 0, kept.stderr
        assert (store_dir / "runs" / scope_for(done.id)).is_dir()
        assert f"kept {done.id}: closed" in kept.stdout
        gone = await asyncio.to_thread(relaykit_cli, "gc", "--retention", "0s", env=env)
        assert gone.returncode == 0, gone.stderr
        assert f"deleted {done.id}:" in gone.stdout
        assert f"kept {slow.id}: running" in gone.stdout
        assert not (store_dir / "runs" / scope_for(done.id)).exists()
        assert (store_dir / "runs" / scope_for(slow.id)).is_dir()
        gate.set()
        assert (await slow.result()).output == "slow done"
    bad = await asyncio.to_thread(relaykit_cli, "gc", "--retention", "soon", env=env)
    assert bad.returncode == 1 and bad.stderr.strip().startswith("error: not a duration")


async def test_gc_deletes_the_stores_of_runs_temporal_forgot_by_their_last_write(
    temporal_server: DevServer, tmp_path: Path
) -> None:
    # Runs past the namespace's retention are unknown to Temporal: exactly what `gc` is for.
    # Their folder's newest object says when they were last used.
    store_dir = tmp_path / "store"
    store = Store(store_dir)
    old, recent = f"forgotten-old-{uuid.uuid4().hex[:6]}", f"forgotten-new-{uuid.uuid4().hex[:6]}"
    for run_id in (old, recent):
        await store.put(f"runs/{scope_for(run_id)}/transcripts/a", b"node")
        await store.put(f"runs/{scope_for(run_id)}/payloads/b", b"payload")
    ten_days_ago = time.time() - 10 * 86400
    for path in (store_dir / "runs" / scope_for(old)).rglob("*"):
        os.utime(path, (ten_days_ago, ten_days_ago))
    env = {
        "TEMPORAL_ADDRESS": temporal_server.address,
        "TEMPORAL_NAMESPACE": temporal_server.namespace,
        "RELAYKIT_STORE": store_dir.as_uri(),
    }
    dry = await asyncio.to_thread(relaykit_cli, "gc", "--retention", "7d", "--dry-run", env=env)
    assert dry.returncode == 0, dry.stderr
    assert f"would delete {old}: 2 objects" in dry.stdout
    assert (store_dir / "runs" / scope_for(old)).is_dir()
    done = await asyncio.to_thread(relaykit_cli, "gc", "--retention", "7d", env=env)
    assert (done.returncode, done.stderr) == (0, "")
    assert f"deleted {old}: 2 objects" in done.stdout
    kept = next(line for line in done.stdout.splitlines() if line.startswith(f"kept {recent}: "))
    assert kept.startswith(f"kept {recent}: unknown to Temporal, last written ")
    assert kept.endswith(" ago, retention 7d")
    assert done.stdout.strip().endswith("deleted 1 runs, kept 1")
    assert not (store_dir / "runs" / scope_for(old)).exists()
    assert (store_dir / "runs" / scope_for(recent)).is_dir()


async def test_a_new_worker_reads_a_long_chain_in_parallel_rounds(tmp_path: Path) -> None:
    writer = TranscriptStore(tmp_path / "store")
    ref = await writer.save("run", None, [Message.user("task")])
    for i in range(100):
        ref = await writer.save("run", ref, [Message.assistant(f"a{i}"), Message.user(f"u{i}")])
    reads: list[str] = []
    in_flight = [0, 0]  # now, most at once

    class Counting(Store):
        async def get(self, key: str, *, decode: bool = True) -> bytes | None:
            reads.append(key)
            in_flight[0] += 1
            in_flight[1] = max(in_flight)
            try:
                return await super().get(key, decode=decode)
            finally:
                in_flight[0] -= 1

    fresh = TranscriptStore(Counting(tmp_path / "store"))
    messages = await fresh.load("run", ref)
    assert [m.content for m in messages] == [
        "task",
        *(x for i in range(100) for x in (f"a{i}", f"u{i}")),
    ]
    assert len(reads) == 101  # every node once
    assert in_flight[1] >= 16  # in parallel rounds, not one read after another
    # ... and a turn saved by this worker links to the same ancestors, for the next new worker.
    newer = await fresh.save("run", ref, [Message.user("more")])
    again = TranscriptStore(tmp_path / "store")
    assert [m.content for m in await again.load("run", newer)][-2:] == ["u99", "more"]


async def test_connect_and_workers_offload_to_the_configured_store_and_keep_the_codec(
    client: Client, temporal_server: DevServer, tmp_path: Path
) -> None:
    import dataclasses

    from relaykit import Worker, connect

    store = Store(tmp_path / "store")
    connected = await connect(
        temporal_server.address, namespace=temporal_server.namespace, store=store
    )
    storage = connected.data_converter.external_storage
    assert storage is not None and storage.drivers[0].target is store  # type: ignore[attr-defined]
    codec = AesGcmCodec()
    converter = with_external_storage(
        dataclasses.replace(pydantic_data_converter, payload_codec=codec), store
    )
    assert converter.payload_codec is codec and converter.external_storage is not None
    assert with_external_storage(converter, Store("memory:///")) is converter  # already has one
    # A worker on a client without external storage adds it, with its own store and the codec.
    encrypted = await client_with(
        client, data_converter=dataclasses.replace(pydantic_data_converter, payload_codec=codec)
    )
    worker = Worker(
        encrypted, Agent(name="noop", model="openai:x"), store=f"file://{tmp_path / 'other'}"
    )
    assert worker.store.codec is codec
    assert worker.client.data_converter.external_storage.drivers[0].target is worker.store  # type: ignore[union-attr]
    assert worker.client.data_converter.payload_codec is codec


@pytest.mark.parametrize("root_id", [None, "账本"])
async def test_gc_keeps_a_closed_root_while_one_of_its_child_runs_still_runs(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path, root_id: str | None
) -> None:
    # A non-ASCII root id: the children's query once wrote it with json.dumps, whose \u escapes
    # the server compares as written, and found no running child.
    from datetime import timedelta

    from relaykit.retention import collect_garbage

    model = scripted_model(model_server)
    gate = threading.Event()
    model_server.respond(
        model.name,
        lambda r: text("late", hold=gate) if "late" in r.last_user_text else text("root done"),
    )
    agent = Agent(name="rooted", model=model)
    store = Store(tmp_path / "store")
    async with serving(client, agent, store=store) as worker:
        own_id = f"{root_id}-{uuid.uuid4().hex[:8]}" if root_id else None
        root = await start_run(client, agent, "root", task_queue=worker.task_queue, id=own_id)
        await root.result()
        # A detached child (named <root>/<call>, like a background subagent) outlives its root.
        child = await start_run(
            client, agent, "late", task_queue=worker.task_queue, id=f"{root.id}/late"
        )
        await asyncio.to_thread(model_server.wait_for_requests, model.name, 2)
        kept = await collect_garbage(store, client, retention=timedelta(0))
        assert kept.kept[root.id] == f"child run {child.id} is running"
        assert not kept.deleted
        gate.set()
        assert (await child.result()).output == "late"
        for _ in range(50):  # the visibility store learns of the child's end a moment later
            gone = await collect_garbage(store, client, retention=timedelta(0))
            if root.id in gone.deleted:
                break
            await asyncio.sleep(0.2)
        assert root.id in gone.deleted
    assert not [o async for o in store.list("runs/")]
