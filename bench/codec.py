"""What encryption costs: the AES-GCM codec on payloads of a turn's sizes, and the transcript
store with and without it.

``python -m bench.codec`` times, in this process and without a Temporal server, one encode and
one decode of a payload (1 KB, a model request of 100 turns, 1 MB), and one turn's store save
and an uncached load of a 20-turn transcript, plain and encrypted. Figures are the best of
several repeats.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import tempfile
import timeit
from collections.abc import Callable
from typing import Any

from temporalio.api.common.v1 import Payload

from relaykit.codecs.aes import AesGcmCodec
from relaykit.transcripts import TranscriptStore

from bench.micro import transcript


def best_us(fn: Callable[[], Any], number: int = 100, repeat: int = 5) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number * 1e6


def main() -> None:
    codec = AesGcmCodec(os.urandom(32))
    rows: list[tuple[str, str]] = []
    loop = asyncio.new_event_loop()
    for label, size in (("1 KB", 1_000), ("100 KB", 100_000), ("1 MB", 1_000_000)):
        payload = Payload(metadata={"encoding": b"json/plain"}, data=os.urandom(size))
        [sealed] = loop.run_until_complete(codec.encode([payload]))
        enc = best_us(lambda: loop.run_until_complete(codec.encode([payload])), number=20)
        dec = best_us(lambda: loop.run_until_complete(codec.decode([sealed])), number=20)
        rows.append((f"AES-GCM encode / decode of {label}", f"{enc:.0f} µs / {dec:.0f} µs"))
    loop.close()

    messages = transcript(20)
    for name, store_codec in (("plain", None), ("AES-GCM", codec)):
        directory = tempfile.mkdtemp(prefix="relaykit-bench-codec-")
        try:
            store = TranscriptStore(directory, codec=store_codec)
            ref = [store.save(None, messages[:1])]

            def save() -> None:
                ref[0] = store.save(ref[0], messages[1:3])

            rows.append((f"store save of one turn, {name}", f"{best_us(save):.0f} µs"))
            last = None
            for i in range(1, len(messages), 2):
                last = store.save(last, messages[i : i + 2])
            assert last is not None

            def load() -> None:
                TranscriptStore(directory, codec=store_codec).load(last)

            rows.append((f"store load of 20 turns (no cache), {name}", f"{best_us(load, number=20):.0f} µs"))
        finally:
            shutil.rmtree(directory, ignore_errors=True)

    print("| operation | cost |\n|---|---|")
    for name, value in rows:
        print(f"| {name} | {value} |")


if __name__ == "__main__":
    main()
