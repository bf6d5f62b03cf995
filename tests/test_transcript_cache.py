"""The model workers' transcript cache: one entry per run (the latest prefix), so a fleet of
runs in flight finds each run's transcript in memory instead of reading its chain again."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from relaykit.messages import Message
from relaykit.transcripts import TranscriptStore


async def test_each_save_replaces_its_parent_so_every_run_in_flight_stays_cached(
    tmp_path: Path,
) -> None:
    store = TranscriptStore(str(tmp_path), cache_size=3)
    heads: dict[str, str] = {}
    for turn in range(5):  # three runs; "a" saves twice a turn (e.g. a compaction's summary)
        for run in ("b", "c", "a", "a"):
            heads[run] = await store.save(run, heads.get(run), [Message.user(f"{run}{turn}")])
    reads: list[str] = []
    original = store.store.get

    async def counted(key: str) -> bytes | None:
        reads.append(key)
        return await original(key)

    store.store.get = counted  # type: ignore[method-assign]
    for run, digest in heads.items():
        transcript = await store.load(run, digest)
        per_turn = 2 if run == "a" else 1
        expected = [f"{run}{turn}" for turn in range(5) for _ in range(per_turn)]
        assert [m.content for m in transcript] == expected
    assert reads == []  # all three served from memory


async def test_a_worker_keeps_nothing_for_runs_it_served_beyond_its_caches(
    tmp_path: Path,
) -> None:
    # A worker lives for months: what it holds for each run it ever served (a run's request
    # part, the folders it wrote into) must not grow with the number of runs, only its caches.
    store = TranscriptStore(str(tmp_path), cache_size=8)
    system = "You are a careful research assistant. " * 40  # about 1.5 kB, like a real prompt

    async def serve(runs: range) -> None:
        for n in runs:
            scope = f"run-{n}"
            digest = f"{n:032x}"
            await store.save_static(scope, digest, {"system": system + str(n), "tools": []})
            head = await store.save(scope, None, [Message.user(f"question {n}")])
            await store.save(scope, head, [Message.user(f"answer {n}")])

    await serve(range(50))  # warm: caches full, lazily built objects built
    tracemalloc.start()
    try:
        await serve(range(50, 350))
        before = tracemalloc.get_traced_memory()[0]
        await serve(range(350, 1350))
        grown = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert grown < 100_000, f"{grown} bytes more after 1,000 more runs"
    assert await store.load_static("run-1349", f"{1349:032x}") is not None
