"""The model workers' transcript cache: one entry per run (the latest prefix), so a fleet of
runs in flight finds each run's transcript in memory instead of reading its chain again."""

from __future__ import annotations

import tracemalloc
from pathlib import Path

from relaykit.messages import Message
from relaykit.transcripts import TranscriptStore


def _counting_reads(store: TranscriptStore) -> list[str]:
    reads: list[str] = []
    original = store.store.get

    async def counted(key: str) -> bytes | None:
        reads.append(key)
        return await original(key)

    store.store.get = counted  # type: ignore[method-assign]
    return reads


async def test_each_save_replaces_its_parent_so_every_run_in_flight_stays_cached(
    tmp_path: Path,
) -> None:
    store = TranscriptStore(str(tmp_path), cache_size=3)
    heads: dict[str, str] = {}
    for turn in range(5):  # three runs; "a" saves twice a turn (e.g. a compaction's summary)
        for run in ("b", "c", "a", "a"):
            heads[run] = await store.save(run, heads.get(run), [Message.user(f"{run}{turn}")])
    reads = _counting_reads(store)
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


async def test_the_cache_holds_at_most_its_bytes_of_transcripts_newest_first(
    tmp_path: Path,
) -> None:
    # Long research runs have transcripts of hundreds of kilobytes: the cache is bounded in
    # bytes too, and a run whose transcript fell out of it reads its chain from the store.
    store = TranscriptStore(str(tmp_path), cache_size=100, cache_bytes=25_000)
    heads: dict[str, str] = {}
    for run in ("a", "b", "c"):  # about 10 kB each: the two newest fit
        for turn in range(5):
            text = f"{run}{turn} " + "finding " * 250
            heads[run] = await store.save(run, heads.get(run), [Message.user(text)])
    reads = _counting_reads(store)
    for run in ("c", "b"):
        assert len(await store.load(run, heads[run])) == 5
    assert reads == []
    loaded = await store.load("a", heads["a"])  # evicted: its chain comes from the store
    assert [m.content.split()[0] for m in loaded] == [f"a{turn}" for turn in range(5)]
    assert len(reads) == 5


async def test_a_transcript_larger_than_the_cache_still_stays_while_it_is_the_newest(
    tmp_path: Path,
) -> None:
    store = TranscriptStore(str(tmp_path), cache_bytes=1_000)
    head = None
    for turn in range(3):
        head = await store.save("big", head, [Message.user("x" * 5_000 + str(turn))])
    assert head is not None
    reads = _counting_reads(store)
    assert len(await store.load("big", head)) == 3
    assert reads == []
