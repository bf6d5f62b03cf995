"""What one large tool result costs in the store.

``python -m bench.large_payload`` runs one relaykit run against a Temporal dev server started
here (in memory) and the scripted model: the model calls a tool that returns ``--mb`` MB of text
(default 3), then answers in a few words. Afterwards it counts the objects and bytes the run left
in its store folder (a local directory), by kind: offloaded Temporal payloads (``payloads/``),
content-addressed blobs they and the transcript share (``blobs/``), transcript nodes (``t/``),
request parts (``static/``). ``--json PATH`` writes the figures.

The tool result travels four times: as the tool activity's result, inside the next model
request, in the transcript node the model call stores, and in the run's result (its
transcript). Each copy is a different payload, so storing payloads whole by their own digest
keeps all four.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import tempfile
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any


def page(mb: float) -> str:
    """Text with what JSON must escape (quotes, newlines, tabs) and non-ASCII letters."""
    line = 'Ligne {:07d}: "durable" runs\tsurvive crashes; café, naïve, Zürich.\n'
    out: list[str] = []
    size = 0
    n = 0
    while size < mb * 1_000_000:
        text = line.format(n)
        out.append(text)
        size += len(text.encode())
        n += 1
    return "".join(out)


async def measure(
    mb: float = 3.0, store_dir: Path | None = None, *, encrypted: bool = False
) -> dict[str, Any]:
    """Run once with a ``mb`` MB tool result; the store's objects and bytes for that run
    (``encrypted``: with relaykit's AES-GCM codec on client, worker and store)."""
    from relaykit import Agent, ModelSpec, Worker, start_run, tool
    from relaykit.client import connect
    from relaykit.devserver import DevServer
    from relaykit.storage import Store, scope_for
    from relaykit.testing.scripted_server import ScriptedModelServer, call, text

    result_text = page(mb)

    @tool(max_output_chars=10_000_000)
    def fetch_page() -> str:
        """Fetch the big page."""
        return result_text

    own_dir = store_dir is None
    directory = Path(tempfile.mkdtemp(prefix="rk-bytes-")) if own_dir else store_dir
    assert directory is not None
    try:
        with DevServer(port=0, headless=True, in_memory=True) as server, ScriptedModelServer() as model:
            name = f"bytes-{uuid.uuid4().hex[:8]}"
            model.script(name, [call("fetch_page"), text("Read it: 1 page.")])
            agent = Agent(
                name="big_reader",
                instructions="Fetch the page, then answer.",
                model=ModelSpec(name=name, base_url=f"{model.base_url}/v1"),
                tools=[fetch_page],
            )
            codec = None
            if encrypted:
                import os

                from relaykit.codecs.aes import AesGcmCodec

                codec = AesGcmCodec(os.urandom(32))
            store = Store(directory, codec=codec)
            client = await connect(server.address, store=store, codec=codec)
            queue = f"bytes-{uuid.uuid4().hex[:8]}"
            async with Worker(client, agent, task_queue=queue, store=store):
                started = time.perf_counter()
                handle = await start_run(client, agent, "Read the page.", task_queue=queue)
                result = await handle.result()
                seconds = time.perf_counter() - started
            assert result.output == "Read it: 1 page."
            objects = [o async for o in store.list(f"runs/{scope_for(handle.id)}/")]
        kinds: Counter[str] = Counter()
        sizes: Counter[str] = Counter()
        for obj in objects:
            kind = obj.key.split("/")[2]
            kinds[kind] += 1
            sizes[kind] += obj.size
        return {
            "tool_result_bytes": len(result_text.encode()),
            "objects": len(objects),
            "bytes": sum(o.size for o in objects),
            "run_seconds": round(seconds, 3),
            "by_kind": {k: {"objects": kinds[k], "bytes": sizes[k]} for k in sorted(kinds)},
        }
    finally:
        if own_dir:
            shutil.rmtree(directory, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=3.0, help="size of the tool result, in MB")
    parser.add_argument("--json", type=Path, help="write the figures here")
    parser.add_argument("--encrypted", action="store_true", help="with the AES-GCM codec")
    args = parser.parse_args()
    figures = asyncio.run(measure(args.mb, encrypted=args.encrypted))
    mb = figures["tool_result_bytes"] / 1e6
    print(f"tool result: {figures['tool_result_bytes']} bytes ({mb:.2f} MB)")
    print(
        f"store after the run: {figures['objects']} objects, {figures['bytes']} bytes "
        f"({figures['bytes'] / figures['tool_result_bytes']:.2f}x the tool result)"
    )
    print(f"the run (start to result): {figures['run_seconds']:.2f} s")
    for kind, row in figures["by_kind"].items():
        print(f"  {kind:9} {row['objects']:3} objects {row['bytes']:>10} bytes")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
