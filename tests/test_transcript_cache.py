"""The model workers' transcript cache: one entry per run (the latest prefix), so a fleet of
runs in flight finds each run's transcript in memory instead of reading its chain again."""

from __future__ import annotations

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
