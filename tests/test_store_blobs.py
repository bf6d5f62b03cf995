"""Large strings are stored once: a big tool result costs its size in the store, not four times
its size (tool result, model request, transcript node and run result each carry it)."""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from temporalio.client import Client
from temporalio.contrib.pydantic import pydantic_data_converter

from bench.large_payload import page
from relaykit import Agent, start_run, tool
from relaykit.payload_storage import with_external_storage
from relaykit.storage import Store, StoreError, scope_for
from relaykit.testing.scripted_server import ScriptedModelServer, call, text
from tests.support import scripted_model, serving
from tests.test_storage import AesGcmCodec, client_with, stored_files


@pytest.fixture(autouse=True)
def no_store_left_behind(tmp_path: Path) -> Iterator[None]:
    yield
    shutil.rmtree(tmp_path, ignore_errors=True)


async def test_a_3mb_tool_result_takes_its_size_in_the_store_once_not_once_per_payload(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    # The result travels in four payloads; the store must hold its bytes once (about 12 MB
    # before large strings were shared, for a 3 MB result).
    store = Store(tmp_path / "store")
    big_client = await client_with(
        client, data_converter=with_external_storage(pydantic_data_converter, store)
    )
    result_text = page(3)

    @tool(max_output_chars=4_000_000)
    def fetch_page() -> str:
        """The big page."""
        return result_text

    model = scripted_model(model_server)
    model_server.script(model.name, [call("fetch_page"), text("Read it.")])
    agent = Agent(name="blob_reader", model=model, tools=[fetch_page])
    async with serving(big_client, agent, store=store) as worker:
        handle = await start_run(big_client, agent, "Read the page.", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "Read it."
    assert [m.content for m in result.transcript if m.role == "tool"] == [result_text]
    assert model_server.requests(model.name)[-1].tool_results == [result_text]
    objects = [o async for o in store.list(f"runs/{scope_for(handle.id)}/")]
    size = len(result_text.encode())
    assert sum(o.size for o in objects) < 1.2 * size, [(o.key, o.size) for o in objects]
    assert [o.key.split("/")[2] for o in objects if o.size > 100_000] == ["blobs"]


async def test_with_an_encrypting_codec_a_3mb_tool_result_is_stored_once_and_never_in_plaintext(
    client: Client, model_server: ScriptedModelServer, tmp_path: Path
) -> None:
    codec = AesGcmCodec()
    store = Store(tmp_path / "store", codec=codec)
    converter = dataclasses.replace(pydantic_data_converter, payload_codec=codec)
    encrypted = await client_with(client, data_converter=with_external_storage(converter, store))
    result_text = "Jane Roe, IBAN DE44500105175407324931; " * 80_000  # 3.2 MB

    @tool(max_output_chars=4_000_000)
    def statement() -> str:
        """The account statement."""
        return result_text

    model = scripted_model(model_server)
    model_server.script(model.name, [call("statement"), text("Statement read.")])
    agent = Agent(name="statement_reader", model=model, tools=[statement])
    async with serving(encrypted, agent, store=store) as worker:
        handle = await start_run(encrypted, agent, "Read it.", task_queue=worker.task_queue)
        result = await handle.result()
    assert result.output == "Statement read."
    assert [m.content for m in result.transcript if m.role == "tool"] == [result_text]
    objects = [o async for o in store.list(f"runs/{scope_for(handle.id)}/")]
    assert sum(o.size for o in objects) < 1.2 * len(result_text), [(o.key, o.size) for o in objects]
    for path in stored_files(tmp_path / "store"):
        assert b"IBAN" not in path.read_bytes()


async def test_an_object_with_a_large_string_reads_back_byte_for_byte_and_whole_objects_still_read(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "store")
    big = 'é"\\\n\t' * 20_000
    node = json.dumps(
        [{"role": "tool", "content": big}, {"role": "user", "content": "ok"}], ensure_ascii=False
    ).encode()
    await store.put("runs/r1/t/" + "a" * 32, node)
    await store.put("runs/r1/t/" + "b" * 32, node + b" ")
    assert await store.get("runs/r1/t/" + "a" * 32) == node
    assert await store.get("runs/r1/t/" + "b" * 32) == node + b" "
    blobs = [o async for o in store.list("runs/r1/blobs/")]
    assert len(blobs) == 1  # two objects, one copy of the string
    # An object written whole (before large strings were shared, or outside a run's folder).
    await store.put("elsewhere/x", node)
    assert await store.get("elsewhere/x") == node
    assert not [o async for o in store.list("elsewhere/blobs/")]


async def test_a_manifest_whose_blob_is_gone_is_a_store_error_not_a_wrong_answer(
    tmp_path: Path,
) -> None:
    store = Store(tmp_path / "store")
    await store.put("runs/r2/t/" + "c" * 32, json.dumps({"content": "x" * 200_000}).encode())
    for blob in (tmp_path / "store" / "runs" / "r2" / "blobs").iterdir():
        blob.unlink()
    with pytest.raises(StoreError, match="does not hold"):
        await store.get("runs/r2/t/" + "c" * 32)


async def test_with_a_codec_shared_strings_are_encrypted_too(tmp_path: Path) -> None:
    store = Store(tmp_path / "store", codec=AesGcmCodec())
    secret = "Jane Roe, IBAN DE44500105175407324931. " * 5_000
    node = json.dumps({"content": secret}, ensure_ascii=False).encode()
    await store.put("runs/r3/t/" + "d" * 32, node)
    await store.put("runs/r3/t/" + "e" * 32, node)
    assert await store.get("runs/r3/t/" + "e" * 32) == node
    assert len([o async for o in store.list("runs/r3/blobs/")]) == 1
    for path in stored_files(tmp_path / "store"):
        assert b"Jane Roe" not in path.read_bytes()
