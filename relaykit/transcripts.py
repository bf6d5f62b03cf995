"""Content-addressed transcript storage for model activities (activity side).

Why: if every model activity input carried the whole transcript, a run's history would grow
quadratically with its number of turns and long research jobs would hit Temporal's history
limits. Instead the workflow sends a *reference* to the transcript prefix the model activity
already saw, plus only the messages added since; the activity rebuilds the full transcript from
this store, calls the model, and stores the new prefix. The bytes a turn adds to history then no
longer grow with the transcript.

The store is a chain of nodes ``digest → (parent digest, messages)``; a digest is the SHA-256 of
the parent digest and the canonical JSON of the messages, so equal prefixes share nodes and the
chain doubles as an audit log of everything the model was sent. Nodes live in the configured
:class:`~relaykit.storage.Store` (``RELAYKIT_STORE``: a local directory or a bucket every model
worker reaches), under the run's root run (``runs/<root>/t/…``, request parts under
``runs/<root>/static/…``), so a finished job's nodes are deleted together
(``relaykit gc``). A worker that cannot find a prefix answers ``TranscriptMissing`` and the run
resends the transcript inline: a missing store costs bytes, never correctness. Digests are
checked to be 32 hex digits before they become keys; anything else is "missing" too.

Runs started before the store was keyed by run keep working: nodes written in the old flat
layout (``<dir>/<ab>/<digest>.json``, ``<dir>/static/<digest>.json``) are still read from the
store's directory or from ``legacy_dir``.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
from collections import OrderedDict
from pathlib import Path
from typing import Any, NamedTuple

from relaykit.messages import Message
from relaykit.storage import (
    LEGACY_TRANSCRIPT_DIR,
    InvalidKey,
    Store,
    StoreError,
    check_hex,
    run_prefix,
)

DIGEST_CHARS = 32
"""Digests are SHA-256 cut to 128 bits: collision-safe for content addressing, and they travel
in every turn's activity input."""
SKIP = 32
"""How many ancestors a node lists: a worker new to a run reads its chain in rounds of this many
parallel reads (a 300-turn run: 10 rounds instead of 300 reads one after another)."""
DEFAULT_CACHE_SIZE = 512
"""Transcripts a worker keeps in memory, one per run (the latest prefix each: a save replaces
its parent). Sized for hundreds of runs in flight at once: with fewer entries than runs every
model call read its run's chain from the store again (64 entries cost a 200-run fleet about
3 ms of worker CPU per turn in thread hops)."""
DEFAULT_CACHE_BYTES = 64 * 2**20
"""And at most about this many bytes of them (the length of their stored JSON; a transcript in
memory takes a few times that): a fleet of long research runs, each with a transcript of
hundreds of kilobytes, would otherwise hold 512 of them. The newest stays whatever its size."""
TRANSCRIPT_MISSING = "TranscriptMissing"
"""ApplicationError type a model activity raises when it cannot rebuild a prefix."""
REQUEST_PART_MISSING = "RequestPartMissing"
"""ApplicationError type a model activity raises when a request's unchanging part (system
prompt, tool schemas, settings) is not in the store: the run sends that part again and keeps
its transcript chain."""


class TranscriptNotFound(LookupError):
    pass


class _Node(NamedTuple):
    """A chain node read from the store, and its size there."""

    data: dict[str, Any]
    size: int


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


def valid_digest(digest: object) -> str:
    """``digest`` if it can be a key; else :class:`TranscriptNotFound` (the caller resends)."""
    try:
        return check_hex(digest, DIGEST_CHARS)
    except InvalidKey:
        raise TranscriptNotFound(str(digest)[:40]) from None


class TranscriptStore:
    """Chain nodes in a :class:`Store`, with a small in-memory cache of whole transcripts.

    ``store`` is a Store, a URL or a directory (default: ``RELAYKIT_STORE``). Methods take the
    ``scope`` of the run (:func:`relaykit.storage.scope_for` of its workflow id)."""

    def __init__(
        self,
        store: Store | str | os.PathLike[str] | None = None,
        *,
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        legacy_dir: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = store if isinstance(store, Store) else Store(store)
        self._cache: OrderedDict[str, list[Message]] = OrderedDict()
        self._cache_size = cache_size
        self._cache_bytes = cache_bytes
        self._sizes: dict[str, int] = {}
        """Each cached transcript's length as stored JSON (what ``cache_bytes`` bounds)."""
        self._cached_bytes = 0
        self._chains: OrderedDict[str, list[str]] = OrderedDict()
        """Nearest ancestors of recent prefixes (what a new node lists, see :meth:`load`)."""
        # Where nodes of the old flat layout may be: the store's own directory (an old
        # transcript_dir reused as the store) and the old default directory.
        legacy = [self.store] if self.store.directory is not None else []
        old_dir = legacy_dir or os.environ.get("RELAYKIT_TRANSCRIPT_DIR") or LEGACY_TRANSCRIPT_DIR
        if Path(old_dir).resolve() != self.store.directory and Path(old_dir).is_dir():
            legacy.append(Store(Path(old_dir), codec=self.store.codec))
        self._legacy = legacy

    @property
    def directory(self) -> Path | None:
        return self.store.directory

    @property
    def location(self) -> str:
        return self.store.location

    def _key(self, scope: str, digest: str) -> str:
        return f"{run_prefix(scope)}t/{digest[:2]}/{digest}"

    def _static_key(self, scope: str, digest: str) -> str:
        return f"{run_prefix(scope)}static/{digest}"

    async def save(self, scope: str, parent: str | None, messages: list[Message]) -> str:
        """Store ``messages`` after the prefix ``parent``; return the new prefix's digest."""
        if parent is not None:
            valid_digest(parent)
        canonical = _canonical(messages)
        digest = _digest(parent, canonical)
        key = self._key(scope, digest)
        ancestors = [] if parent is None else [parent, *self._chains.get(f"{scope}/{parent}", [])]
        ancestors = ancestors[:SKIP]
        if f"{scope}/{digest}" not in self._cache and (
            self.store.directory is None or not await self.store.exists(key)
        ):  # a bucket's put of the same bytes is idempotent: one request instead of two
            parent_json = json.dumps(parent)
            skip = json.dumps(ancestors[1:])
            node = f'{{"parent":{parent_json},"ancestors":{skip},"messages":{canonical}}}'
            await self.store.put(key, node.encode())
        self._remember_chain(f"{scope}/{digest}", ancestors)
        # The next load asks for the new prefix, so the run keeps one entry: the one it needs.
        base = None if parent is None else self._forget(f"{scope}/{parent}")
        if parent is None or base is not None:
            base_messages, base_size = base or ([], 0)
            self._remember(
                f"{scope}/{digest}", [*base_messages, *messages], base_size + len(canonical)
            )
        return digest

    def cached(self, scope: str, digest: str) -> list[Message] | None:
        """The transcript ``digest`` if it is in memory (no store access)."""
        cached = self._cache.get(f"{scope}/{digest}")
        if cached is None:
            return None
        self._cache.move_to_end(f"{scope}/{digest}")
        return list(cached)

    async def load(self, scope: str, digest: str) -> list[Message]:
        """The whole transcript whose prefix digest is ``digest``.

        A worker that has not seen the run (a new one after a deploy) reads the chain from the
        store. Each node lists up to :data:`SKIP` ancestors, so the chain is read in rounds of
        that many parallel reads rather than one read after another."""
        valid_digest(digest)
        cached = self.cached(scope, digest)
        if cached is not None:
            return cached
        nodes: dict[str, _Node] = {}
        chunks: list[list[Message]] = []
        order: list[str] = []
        size = 0
        cursor: str | None = digest
        while cursor is not None:
            cursor = valid_digest(cursor)
            hit = self._cache.get(f"{scope}/{cursor}")
            if hit is not None:
                chunks.append(hit)
                size += self._sizes.get(f"{scope}/{cursor}", 0)
                order.extend([cursor, *self._chains.get(f"{scope}/{cursor}", [])])
                break
            found = nodes.pop(cursor, None) or await self._read_node(scope, cursor)
            node, size = found.data, size + found.size
            chunks.append([Message.model_validate(m) for m in node["messages"]])
            order.append(cursor)
            parent = node["parent"]
            ahead = [parent, *node.get("ancestors", [])] if parent is not None else []
            wanted = [
                d
                for d in ahead
                if isinstance(d, str) and d not in nodes and f"{scope}/{d}" not in self._cache
            ]
            if len(wanted) > 1 and parent not in nodes:
                for d in wanted:
                    valid_digest(d)
                read = await asyncio.gather(
                    *(self._read_node(scope, d) for d in wanted), return_exceptions=True
                )
                nodes.update(
                    (d, n) for d, n in zip(wanted, read, strict=True) if isinstance(n, _Node)
                )
            cursor = parent
        messages = [m for chunk in reversed(chunks) for m in chunk]
        self._remember(f"{scope}/{digest}", messages, size)
        self._remember_chain(f"{scope}/{digest}", order[1 : SKIP + 1])
        return list(messages)

    def _remember_chain(self, key: str, ancestors: list[str]) -> None:
        self._chains[key] = ancestors
        self._chains.move_to_end(key)
        while len(self._chains) > 4 * self._cache_size:
            self._chains.popitem(last=False)

    async def _read_node(self, scope: str, digest: str) -> _Node:
        data = await self._get(self._key(scope, digest), f"{digest[:2]}/{digest}.json")
        if data is None:
            raise TranscriptNotFound(digest)
        try:
            node = json.loads(data)
            if not isinstance(node, dict) or not isinstance(node.get("messages"), list):
                raise ValueError("not a transcript node")
        except ValueError:
            raise TranscriptNotFound(digest) from None
        return _Node(node, len(data))

    async def _get(self, key: str, legacy_key: str) -> bytes | None:
        try:
            data = await self.store.get(key)
            for legacy in self._legacy if data is None else ():
                data = await legacy.get(legacy_key)
                if data is not None:
                    break
        except StoreError:  # e.g. written with a codec this worker lacks: resend inline
            return None
        return data

    async def save_static(self, scope: str, digest: str, part: dict[str, object]) -> None:
        """Store a request's unchanging part under the digest the workflow computed."""
        valid_digest(digest)
        key = self._static_key(scope, digest)
        if not await self.store.exists(key):
            await self.store.put(key, json.dumps(part).encode())

    async def load_static(self, scope: str, digest: str) -> dict[str, object]:
        """A request's unchanging part, from the store. Not cached here: the model activities
        keep parts by digest, parsed, shared by every run of an agent (a copy per run here was
        kilobytes a worker held for each run it served)."""
        valid_digest(digest)
        data = await self._get(self._static_key(scope, digest), f"static/{digest}.json")
        if data is None:
            raise TranscriptNotFound(digest)
        try:
            part = json.loads(data)
        except ValueError:
            raise TranscriptNotFound(digest) from None
        if not isinstance(part, dict):
            raise TranscriptNotFound(digest)
        return part

    def _remember(self, key: str, messages: list[Message], size: int) -> None:
        self._forget(key)
        self._cache[key] = messages
        self._sizes[key] = size
        self._cached_bytes += size
        while len(self._cache) > 1 and (
            len(self._cache) > self._cache_size or self._cached_bytes > self._cache_bytes
        ):
            self._forget(next(iter(self._cache)))

    def _forget(self, key: str) -> tuple[list[Message], int] | None:
        """Drop ``key`` from the cache; its transcript and size if it was there."""
        messages = self._cache.pop(key, None)
        if messages is None:
            return None
        size = self._sizes.pop(key, 0)
        self._cached_bytes -= size
        return messages, size
