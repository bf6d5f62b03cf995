"""Content-addressed transcript storage for model activities (activity side).

Why: if every model activity input carried the whole transcript, a run's history would grow
quadratically with its number of turns and long research jobs would hit Temporal's history
limits. Instead the workflow sends a *reference* to the transcript prefix the model activity
already saw, plus only the messages added since; the activity rebuilds the full transcript from
this store, calls the model, and stores the new prefix. The bytes a turn adds to history then no
longer grow with the transcript.

The store is a chain of nodes ``digest → (parent digest, messages)``; a digest is the SHA-256 of
the parent digest and the canonical JSON of the messages, so equal prefixes share nodes and the
chain doubles as an audit log of everything the model was sent. Nodes live in a directory
(default ``.relaykit/transcripts``; ``RELAYKIT_TRANSCRIPT_DIR``) that every worker running model
activities for a run should share (a network volume, or a synced bucket). A worker that cannot
find a prefix answers ``TranscriptMissing`` and the run resends the transcript inline: a missing
store costs bytes, never correctness.

With a payload ``codec`` (the client's, see :mod:`relaykit.codec`) every node is encoded with it
before it reaches the disk, so an encrypting codec keeps transcripts encrypted at rest too.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Coroutine
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from relaykit.messages import Message

DEFAULT_DIR = Path(".relaykit") / "transcripts"
DIGEST_CHARS = 32
"""Digests are SHA-256 cut to 128 bits: collision-safe for content addressing, and they travel
in every turn's activity input."""
TRANSCRIPT_MISSING = "TranscriptMissing"
"""ApplicationError type a model activity raises when it cannot rebuild a prefix."""


class TranscriptNotFound(LookupError):
    pass


def _canonical(messages: list[Message]) -> str:
    return json.dumps(
        [m.model_dump(mode="json", exclude={"agent"}) for m in messages],
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
    )


def static_digest(part: dict[str, object]) -> str:
    """Digest of a request's unchanging part (computed in workflow code: pure and stable)."""
    text = json.dumps(part, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode()).hexdigest()[:DIGEST_CHARS]


def _digest(parent: str | None, canonical: str) -> str:
    hasher = hashlib.sha256()
    hasher.update((parent or "").encode())
    hasher.update(b"\0")
    hasher.update(canonical.encode())
    return hasher.hexdigest()[:DIGEST_CHARS]


ENCODED_MAGIC = b"RKP1"
"""First bytes of a node written through a codec (then a serialized, encoded ``Payload``)."""


_codec_loops = threading.local()


def _run_codec(coro: Coroutine[Any, Any, list[Payload]]) -> list[Payload]:
    """Run a codec call from the store's synchronous methods (which run off the event loop, in
    worker threads). Each thread keeps one loop: a new loop per node costs milliseconds."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        loop = getattr(_codec_loops, "loop", None)
        if loop is None:
            loop = _codec_loops.loop = asyncio.new_event_loop()
        return loop.run_until_complete(coro)
    with ThreadPoolExecutor(1) as pool:  # called on an event loop: run it beside it
        return pool.submit(asyncio.run, coro).result()


class TranscriptStore:
    """A directory of chain nodes, with a small in-memory cache of whole transcripts."""

    def __init__(
        self,
        directory: str | os.PathLike[str] | None = None,
        *,
        cache_size: int = 64,
        codec: PayloadCodec | None = None,
    ):
        self.directory = Path(directory or os.environ.get("RELAYKIT_TRANSCRIPT_DIR") or DEFAULT_DIR)
        self.codec = codec
        self._cache: OrderedDict[str, list[Message]] = OrderedDict()
        self._cache_size = cache_size
        self._static: dict[str, dict[str, object]] = {}

    def _path(self, digest: str) -> Path:
        return self.directory / digest[:2] / f"{digest}.json"

    def save(self, parent: str | None, messages: list[Message]) -> str:
        """Store ``messages`` after the prefix ``parent``; return the new prefix's digest."""
        canonical = _canonical(messages)
        digest = _digest(parent, canonical)
        path = self._path(digest)
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            parent_json = json.dumps(parent)
            tmp.write_bytes(self._encode(f'{{"parent":{parent_json},"messages":{canonical}}}'))
            os.replace(tmp, path)  # atomic: readers never see half a node
        if parent is None or parent in self._cache:
            base = self._cache.get(parent, []) if parent else []
            self._remember(digest, [*base, *messages])
        return digest

    def cached(self, digest: str) -> list[Message] | None:
        """The transcript ``digest`` if it is in memory (no file access)."""
        cached = self._cache.get(digest)
        if cached is None:
            return None
        self._cache.move_to_end(digest)
        return list(cached)

    def load(self, digest: str) -> list[Message]:
        """The whole transcript whose prefix digest is ``digest``."""
        cached = self._cache.get(digest)
        if cached is not None:
            self._cache.move_to_end(digest)
            return list(cached)
        chunks: list[list[Message]] = []
        cursor: str | None = digest
        while cursor is not None:
            if cursor in self._cache:
                chunks.append(self._cache[cursor])
                break
            try:
                node = json.loads(self._decode(self._path(cursor).read_bytes(), cursor))
            except FileNotFoundError:
                raise TranscriptNotFound(cursor) from None
            chunks.append([Message.model_validate(m) for m in node["messages"]])
            cursor = node["parent"]
        messages = [m for chunk in reversed(chunks) for m in chunk]
        self._remember(digest, messages)
        return list(messages)

    def save_static(self, digest: str, part: dict[str, object]) -> None:
        """Store a request's unchanging part under the digest the workflow computed."""
        path = self.directory / "static" / f"{digest}.json"
        if not path.exists():
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_bytes(self._encode(json.dumps(part)))
            os.replace(tmp, path)
        self._static[digest] = part

    def load_static(self, digest: str) -> dict[str, object]:
        cached = self._static.get(digest)
        if cached is not None:
            return cached
        try:
            raw = (self.directory / "static" / f"{digest}.json").read_bytes()
            part = json.loads(self._decode(raw, digest))
        except FileNotFoundError:
            raise TranscriptNotFound(digest) from None
        self._static[digest] = part
        return part

    def _encode(self, text: str) -> bytes:
        if self.codec is None:
            return text.encode()
        payload = Payload(metadata={"encoding": b"json/plain"}, data=text.encode())
        [encoded] = _run_codec(self.codec.encode([payload]))
        return ENCODED_MAGIC + encoded.SerializeToString()

    def _decode(self, raw: bytes, digest: str) -> str:
        if not raw.startswith(ENCODED_MAGIC):
            return raw.decode("utf-8")
        if self.codec is None:  # written by a worker with a codec: as good as missing here
            raise TranscriptNotFound(digest)
        payload = Payload()
        payload.ParseFromString(raw[len(ENCODED_MAGIC):])
        [decoded] = _run_codec(self.codec.decode([payload]))
        return decoded.data.decode("utf-8")

    def _remember(self, digest: str, messages: list[Message]) -> None:
        self._cache[digest] = messages
        self._cache.move_to_end(digest)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)
