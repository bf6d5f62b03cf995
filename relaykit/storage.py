"""One storage layer for everything relaykit keeps outside Temporal history, configured by a URL.

Two things live there: transcript chain nodes and request parts (:mod:`relaykit.transcripts`),
and payloads too large for Temporal history (its external payload storage, through
:class:`~relaykit.payload_storage.StoreDriver`). Both use the same store, so a deployment
configures one place::

    RELAYKIT_STORE=file:///var/lib/relaykit     # a private local directory
    RELAYKIT_STORE=s3://bucket/prefix           # S3 or any S3-compatible server (MinIO, ...)
    RELAYKIT_STORE=gs://bucket/prefix           # Google Cloud Storage
    RELAYKIT_STORE=az://account/container/path  # Azure Blob Storage
    RELAYKIT_STORE=memory:///                   # one process only (tests)

The default is ``.relaykit/store`` (or ``RELAYKIT_TRANSCRIPT_DIR`` / ``Worker(transcript_dir=)``
when set, for setups from before this layer). Object stores take their options from the
standard environment (``AWS_ACCESS_KEY_ID``, ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``,
``AWS_ENDPOINT_URL``, ``AWS_ALLOW_HTTP``; ``GOOGLE_*``; ``AZURE_*``) or from the URL's query
(``s3://bucket/prefix?endpoint=http://minio:9000&region=us-east-1&allow_http=true``).

Why obstore (and not the S3/GCS drivers in ``temporalio.contrib``): transcripts need more than
payload offloading (listing and deleting a run's objects, small reads on every turn), and we
want one async API over local files, S3, GCS and Azure rather than one client library per cloud
plus our own local-file code. obstore is a thin binding of the Rust ``object_store`` crate (the
one Arrow, DataFusion and Polars use): async, no boto dependency at runtime, and its
credentials follow each cloud's standard environment. ``StoreDriver`` is our own small
Temporal ``StorageDriver`` on top of it.

A local directory's objects are written, read and checked with plain file calls (an atomic
rename per write, 0600 files); obstore lists and deletes them. So a worker on a local store, which
on a run's path only writes and reads, never loads obstore's native library (about 5 MB of
resident memory); it is imported on first use.

Large strings are stored once. A tool result of a few MB travels in several payloads: the tool
activity's result, the next model request, the transcript node the model call stores, the run's
result. Each is a different object, so content addressing of whole objects would keep every copy.
Instead, a JSON string of at least :data:`BLOB_MIN_BYTES` inside any object written under a
run's folder is cut out and kept once as ``runs/<root>/blobs/<sha256>``; the object itself
becomes a small manifest of inline bytes and blob references, reassembled byte for byte on
read (offloaded payloads are then checked against their digest as before). Objects written
before this, and objects with no large string, are stored whole and read as they are. With a
codec, an offloaded payload arrives encoded (opaque bytes with no strings to share); the store
decodes it, cuts its plaintext the same way and encodes each piece again, so blobs are shared
and no plaintext is written.

Layout: everything a run writes is under ``runs/<root run id>/`` (child runs share their root's
folder), so one prefix holds a whole job and ``relaykit gc`` (:mod:`relaykit.retention`, or a
bucket lifecycle rule) can
delete it when the job is over. Keys are built only from validated parts: digests must be
fixed-length lowercase hex, run ids are percent-encoded into one path segment.

With a payload codec (``codec=``, normally the client's), every object is written as a
codec-encoded Temporal ``Payload``: with an encrypting codec no plaintext reaches a disk or a
bucket. Payloads offloaded by Temporal arrive already encoded by the data converter and are
stored as they are.
"""

from __future__ import annotations

import asyncio
import atexit
import builtins
import contextlib
import dataclasses
import hashlib
import json
import os
import re
import uuid
import weakref
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any
from urllib.parse import parse_qsl, quote, unquote, urlsplit, urlunsplit

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    PayloadCodec,
)

from relaykit.errors import ConfigurationError, RelaykitError
from relaykit.store_blobs import BLOB_MIN_BYTES, Blob, split_large_strings

DEFAULT_STORE_DIR = Path(".relaykit") / "store"
LEGACY_TRANSCRIPT_DIR = Path(".relaykit") / "transcripts"
DEFAULT_OFFLOAD_THRESHOLD = 512 * 1024
"""Payloads at least this large go to the store (Temporal rejects blobs above 2 MB and warns
above 512 KB; several payloads of one event share that limit)."""
RUNS_PREFIX = "runs"
NO_RUN_SCOPE = "_"
"""Scope of writes made outside any workflow (e.g. a standalone activity)."""

_ENCODED_MAGIC = b"RKC1"
"""Prefix of objects written through a codec: the rest is a serialised, encoded ``Payload``."""
_MANIFEST_MAGIC = b"RKB1"
"""Prefix of an object whose large strings are blobs: a 4-byte header length, the JSON header
(``[[inline length] | [blob length, sha256], ...]``), then the inline bytes in order."""
INLINE_WRITE_BYTES = 16 * 1024
"""A local object at most this long is written on the calling thread (a thread hop cost more)."""
_KEY_SEGMENT = re.compile(r"[A-Za-z0-9_%-][A-Za-z0-9_.%-]*\Z")
_SHA256 = re.compile(r"[0-9a-f]{64}\Z")
_URL_CONFIG = {
    "s3": ("endpoint", "region", "virtual_hosted_style_request", "skip_signature"),
    "gs": ("service_account_path",),
    "az": ("use_emulator", "endpoint", "use_fabric_endpoint"),
}
"""Store options a URL query may set (never credentials: those come from the environment)."""
_CLIENT_OPTIONS = ("allow_http", "allow_invalid_certificates", "timeout", "connect_timeout")


class StoreError(RelaykitError):
    """The store cannot be used as configured, or an object in it cannot be read."""


class InvalidKey(StoreError, ValueError):
    """A digest or key that would not stay inside the store (never turned into a path)."""


def check_hex(value: object, length: int) -> str:
    """``value`` if it is exactly ``length`` lowercase hex digits; else :class:`InvalidKey`.

    Digests arrive in activity inputs that anyone allowed to start a workflow can write, so a
    digest is checked before it becomes part of a key."""
    if (
        not isinstance(value, str)
        or len(value) != length
        or not all(c in "0123456789abcdef" for c in value)
    ):
        raise InvalidKey(f"not a {length}-digit hex digest: {str(value)[:40]!r}")
    return value


def root_run_id(workflow_id: str) -> str:
    """The root run of ``workflow_id``: relaykit names child runs ``<parent id>/<call id>``, so
    the root's id is what comes before the first ``/``."""
    return workflow_id.split("/", 1)[0]


MAX_SCOPE_CHARS = 255
"""A longer folder name is cut and ends in a digest: a file system takes 255 bytes per name, so
no folder that a local store could make changes its name."""


def scope_for(workflow_id: str | None) -> str:
    """The key segment of a run's folder: its root run id, percent-encoded (dots too, so no
    id can become ``..``). An id longer than :data:`MAX_SCOPE_CHARS` once encoded (a run id
    may be 1,000 characters, and each non-ASCII one takes nine) keeps its first part, then
    ``.`` and a digest of the whole id: the only scopes with a dot."""
    if not workflow_id:
        return NO_RUN_SCOPE
    root = root_run_id(workflow_id)
    if not root:
        return NO_RUN_SCOPE
    scope = _encoded(root)
    if len(scope) <= MAX_SCOPE_CHARS:
        return scope
    head, room = [], MAX_SCOPE_CHARS - 33
    for char in root:  # whole characters, so the head reads back as the id's beginning
        room -= len(encoded := _encoded(char))
        if room < 0:
            break
        head.append(encoded)
    digest = hashlib.sha256(root.encode("utf-8", "surrogatepass")).hexdigest()[:32]
    return f"{''.join(head)}.{digest}"


def _encoded(text: str) -> str:
    return quote(text, safe="-_").replace(".", "%2E").replace("~", "%7E")


def run_id_of_scope(scope: str) -> str | None:
    """The root run id a scope folder belongs to (``None`` for :data:`NO_RUN_SCOPE` and for the
    scope of a long id, which keeps only the id's beginning: :func:`long_id_start`)."""
    return None if scope == NO_RUN_SCOPE or "." in scope else unquote(scope)


def long_id_start(scope: str) -> str | None:
    """How the root run id of a long id's scope begins (``None`` for other scopes)."""
    return unquote(scope.split(".", 1)[0]) if "." in scope else None


def _check_key(key: str) -> str:
    parts = key.split("/")
    if not parts or not all(_KEY_SEGMENT.match(p) for p in parts):
        raise InvalidKey(f"invalid store key {key[:80]!r}")
    return key


def _redact(url: str) -> str:
    """``url`` without credentials or query (it appears in errors and logs)."""
    parts = urlsplit(url)
    netloc = parts.hostname or ""
    if parts.port:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))


def _local_path(url: str) -> Path | None:
    parts = urlsplit(url)
    if parts.scheme != "file":
        return None
    return Path(unquote(parts.path))


@dataclasses.dataclass(frozen=True)
class StoredObject:
    key: str
    size: int
    last_modified: datetime


class Store:
    """A bucket or directory, addressed by keys, with optional payload-codec encoding.

    Writes are atomic: a reader sees a whole object or none. Several writers of one key at once
    are safe (content-addressed keys: they write the same bytes). Local directories are created
    0700 and files 0600.
    """

    def __init__(
        self,
        url: str | os.PathLike[str] | None = None,
        *,
        codec: PayloadCodec | None = None,
        offload_threshold: int | None = None,
    ) -> None:
        if url is None:
            url = os.environ.get("RELAYKIT_STORE") or None
        if url is None:
            legacy = os.environ.get("RELAYKIT_TRANSCRIPT_DIR")
            url = Path(legacy) if legacy else DEFAULT_STORE_DIR
        if isinstance(url, os.PathLike) or "://" not in str(url):
            url = Path(url).resolve().as_uri()
        self.url = str(url)
        self.codec = codec
        threshold = offload_threshold
        if threshold is None:
            env = os.environ.get("RELAYKIT_OFFLOAD_BYTES")
            try:
                threshold = int(env) if env else DEFAULT_OFFLOAD_THRESHOLD
            except ValueError:
                raise ConfigurationError(
                    f"RELAYKIT_OFFLOAD_BYTES must be a number of bytes, not {env!r}"
                ) from None
        self.offload_threshold = threshold
        self.directory = _local_path(self.url)
        """The local directory of a ``file://`` store (``None`` for object stores)."""
        self._store: Any = None
        self._root_checked = False
        """Whether the store's own folder exists and is private (checked once)."""

    @classmethod
    def from_env(cls, *, codec: PayloadCodec | None = None) -> Store:
        return cls(None, codec=codec)

    def with_codec(self, codec: PayloadCodec | None) -> Store:
        """The same location, encoding with ``codec``."""
        if codec is self.codec:
            return self
        return Store(self.url, codec=codec, offload_threshold=self.offload_threshold)

    def __repr__(self) -> str:
        codec = type(self.codec).__name__ if self.codec else None
        return f"Store({_redact(self.url)!r}, codec={codec})"

    @property
    def location(self) -> str:
        """Where the store is, safe to print (no credentials)."""
        return _redact(self.url)

    def check(self) -> None:
        """Open the store now: raises :class:`ConfigurationError` for a URL that cannot work."""
        if self.directory is not None:
            # What opening a local store checks; obstore itself is loaded only by the operations
            # that need it (listing, deleting), so a worker on a local store never loads it.
            self._make_dir(self.directory)
            return
        self._backend()

    # --- backend --------------------------------------------------------------------------------

    def _backend(self) -> Any:
        if self._store is None:
            self._store = self._open()
            _OPEN_STORES.add(self)
        return self._store

    def _open(self) -> Any:
        if self.directory is not None:
            from obstore.store import LocalStore

            self._make_dir(self.directory)
            return LocalStore(str(self.directory))
        from obstore.store import from_url

        parts = urlsplit(self.url)
        query = dict(parse_qsl(parts.query))
        base = urlunsplit((parts.scheme, parts.netloc, parts.path, "", ""))
        config = {k: v for k, v in query.items() if k in _URL_CONFIG.get(parts.scheme, ())}
        client_options = {k: v for k, v in query.items() if k in _CLIENT_OPTIONS}
        unknown = set(query) - set(config) - set(client_options)
        if unknown:
            raise ConfigurationError(
                f"unknown store option(s) {', '.join(sorted(unknown))} in {self.location}",
                hint="credentials come from the environment (AWS_*, GOOGLE_*, AZURE_*); the URL "
                "takes "
                + ", ".join(sorted({*_URL_CONFIG.get(parts.scheme, ()), *_CLIENT_OPTIONS})),
            )
        try:
            if parts.scheme == "memory":
                return from_url("memory:///")
            # The keys were checked against the scheme's options above; obstore types its config
            # as one TypedDict per backend, which a dict built from a URL cannot name statically.
            return from_url(
                base,
                config=config or None,  # type: ignore[arg-type]
                client_options=client_options or None,  # type: ignore[arg-type]
            )
        except BaseException as exc:  # obstore raises (and panics) its own types
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise
            raise ConfigurationError(
                # obstore's messages run over many lines (a debug dump of its options).
                f"cannot open the store {self.location}: "
                + (str(exc).strip().splitlines() or [type(exc).__name__])[0].rstrip(" :{"),
                hint="set RELAYKIT_STORE to file:///dir, s3://bucket/prefix, gs://… or az://…",
            ) from None

    def _make_dir(self, path: str | os.PathLike[str]) -> None:
        """Create ``path`` and missing parents inside the store as 0700 (most often only the
        last folder is missing: one ``mkdir``)."""
        try:
            os.mkdir(path, 0o700)
        except FileNotFoundError:
            parent = os.path.dirname(path)
            if not parent or parent == os.fspath(path):  # nothing above it to make
                raise
            self._make_dir(parent)
            with contextlib.suppress(FileExistsError):
                os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        if (
            not self._root_checked
            and self.directory is not None
            and os.fspath(path) == os.fspath(self.directory)
        ):
            try:  # a store directory made by an older relaykit was 0755
                if os.stat(path).st_mode & 0o077:
                    os.chmod(path, 0o700)
            except OSError:
                pass
            self._root_checked = True

    # --- bytes ----------------------------------------------------------------------------------

    async def put(
        self, key: str, data: bytes, *, encode: bool = True, document: bytes | None = None
    ) -> None:
        """Write ``data`` under ``key`` (encoded with the codec unless ``encode=False``). The
        large strings of the JSON ``document`` (default: ``data`` itself) found in ``data`` are
        stored once per run folder (see :func:`split_large_strings`)."""
        _check_key(key)
        folder = _run_folder(key)
        if folder is not None and len(data) >= BLOB_MIN_BYTES:
            parts = split_large_strings(data, data if document is None else document)
            if any(isinstance(part, Blob) for part in parts):
                data = await self._put_blobs(folder, parts, encode=encode)
        await self._put_object(key, data, encode=encode)

    async def _put_blobs(self, folder: str, parts: list[bytes | Blob], *, encode: bool) -> bytes:
        """Store the blobs of ``parts`` (each once) and return the manifest that stands for them."""
        header: list[list[int | str]] = []
        inline: list[bytes] = []
        for part in parts:
            if isinstance(part, Blob):
                key = f"{folder}blobs/{part.digest}"
                if not await self.exists(key):
                    await self._put_object(key, part.data, encode=encode)
                header.append([len(part.data), part.digest])
            else:
                header.append([len(part)])
                inline.append(part)
        encoded = json.dumps(header, separators=(",", ":")).encode()
        return b"".join([_MANIFEST_MAGIC, len(encoded).to_bytes(4, "big"), encoded, *inline])

    async def _put_object(self, key: str, data: bytes, *, encode: bool) -> None:
        if encode and self.codec is not None:
            payload = Payload(metadata={"encoding": b"binary/plain"}, data=data)
            encoded = (await self.codec.encode([payload]))[0]
            data = _ENCODED_MAGIC + encoded.SerializeToString()
        if self.directory is not None and len(data) <= INLINE_WRITE_BYTES:
            self._put_local(key, data)
        elif self.directory is not None:  # the event loop never waits on a long write
            await asyncio.to_thread(self._put_local, key, data)
        else:
            import obstore

            await obstore.put_async(self._backend(), key, data)

    def _put_local(self, key: str, data: bytes) -> None:
        # Plain strings and os calls, not pathlib: this runs for every model call a worker
        # makes, on its event loop.
        assert self.directory is not None
        if not self._root_checked:
            self._make_dir(self.directory)
        path = os.path.join(self.directory, key)
        folder, name = os.path.split(path)
        # A unique temporary name per write: concurrent saves of one key never share one.
        tmp = os.path.join(folder, f".{name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileNotFoundError:
            # Its folder is new (or was removed by gc): made now. Folders are not remembered,
            # so a worker holds nothing per run it ever wrote for (a run has up to 256 of them).
            self._make_dir(folder)
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            with os.fdopen(fd, "wb") as file:
                file.write(data)
            os.replace(tmp, path)  # atomic: readers never see half an object
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
            raise

    async def exists(self, key: str) -> bool:
        _check_key(key)
        if self.directory is not None:
            return os.path.exists(os.path.join(self.directory, key))
        import obstore

        try:
            await obstore.head_async(self._backend(), key)
        except FileNotFoundError:
            return False
        return True

    async def get(self, key: str, *, decode: bool = True) -> bytes | None:
        """The object under ``key`` (decoded with the codec), or ``None`` if there is none."""
        data = await self._get_object(key, decode=decode)
        if data is None or not data.startswith(_MANIFEST_MAGIC):
            return data
        return await self._assemble(key, data)

    def _get_local(self, key: str) -> bytes | None:
        # Local files are read (and written, by _put_local) directly: the same file obstore's
        # LocalStore reads (keys are checked, so a key is a path inside the directory), without
        # loading obstore's native library (about 5 MB of a worker's memory) for it.
        assert self.directory is not None
        try:
            return (self.directory / key).read_bytes()
        except (FileNotFoundError, IsADirectoryError):  # obstore: "not found" for both
            return None

    async def _assemble(self, key: str, manifest: bytes) -> bytes:
        folder = _run_folder(key)
        try:
            size = int.from_bytes(manifest[4:8], "big")
            header = json.loads(manifest[8 : 8 + size])
        except ValueError:
            raise StoreError(f"object {key} has a damaged blob manifest") from None
        if folder is None or not isinstance(header, list):
            raise StoreError(f"object {key} has a damaged blob manifest")
        digests = [entry[1] for entry in header if isinstance(entry, list) and len(entry) == 2]
        blobs = await asyncio.gather(
            *(self._get_object(f"{folder}blobs/{check_hex(d, 64)}", decode=True) for d in digests)
        )
        found = dict(zip(digests, blobs, strict=True))
        out: list[bytes] = []
        offset = 8 + size
        for entry in header:
            length = entry[0]
            if len(entry) == 1:
                out.append(manifest[offset : offset + length])
                offset += length
                continue
            blob = found[entry[1]]
            if blob is None or len(blob) != length:
                raise StoreError(
                    f"object {key} refers to a blob the store {self.location} does not hold",
                    hint="a run's folder is deleted whole (relaykit gc); was part of it removed?",
                )
            if hashlib.sha256(blob).hexdigest() != entry[1]:
                raise StoreError(f"a blob of object {key} does not match its digest")
            out.append(blob)
        return b"".join(out)

    async def _get_object(self, key: str, *, decode: bool) -> bytes | None:
        _check_key(key)
        if self.directory is not None:
            data = await asyncio.to_thread(self._get_local, key)
            if data is None:
                return None
        else:
            import obstore

            try:
                result = await obstore.get_async(self._backend(), key)
                data = bytes(await result.bytes_async())
            except FileNotFoundError:
                return None
        if decode and data.startswith(_ENCODED_MAGIC):
            if self.codec is None:
                raise StoreError(
                    f"object {key} was written with a payload codec and this process has none",
                    hint="configure the same codec (RELAYKIT_CODEC) on every worker and client",
                )
            payload = Payload.FromString(data[len(_ENCODED_MAGIC) :])
            data = (await self.codec.decode([payload]))[0].data
        return data

    async def list(self, prefix: str) -> AsyncIterator[StoredObject]:
        """Every object under ``prefix`` (a folder: ``runs/<scope>/``)."""
        if self.directory is not None and not (self.directory / prefix).exists():
            return
        import obstore

        stream = obstore.list(self._backend(), prefix, chunk_size=1000)
        async for chunk in stream:
            for meta in chunk:
                yield StoredObject(meta["path"], meta["size"], meta["last_modified"])

    async def folders(self, prefix: str) -> builtins.list[str]:  # `list` here is Store.list
        """Names of the folders directly under ``prefix``."""
        if self.directory is not None and not (self.directory / prefix).exists():
            return []
        import obstore

        result = await obstore.list_with_delimiter_async(self._backend(), prefix)
        return [p.rstrip("/").rsplit("/", 1)[-1] for p in result["common_prefixes"]]

    async def delete_prefix(self, prefix: str) -> int:
        """Delete every object under ``prefix``; returns how many."""
        import obstore

        keys = [obj.key async for obj in self.list(prefix)]
        for start in range(0, len(keys), 1000):
            await obstore.delete_async(self._backend(), keys[start : start + 1000])
        if self.directory is not None:
            _remove_empty_dirs(self.directory / prefix)
        return len(keys)


_OPEN_STORES: weakref.WeakSet[Store] = weakref.WeakSet()


@atexit.register
def _drop_backends() -> None:
    """obstore's client objects abort the interpreter when they are finalised during its
    shutdown (after their runtime's threads are gone); drop them while the process still runs."""
    for store in list(_OPEN_STORES):
        store._store = None


def _remove_empty_dirs(path: Path) -> None:
    if not path.is_dir():
        return
    for child in path.iterdir():
        if child.is_dir():
            _remove_empty_dirs(child)
        elif child.name.endswith(".tmp"):  # left by a writer killed mid-write
            child.unlink(missing_ok=True)
    try:
        path.rmdir()
    except OSError:
        pass


def run_prefix(scope: str) -> str:
    return f"{RUNS_PREFIX}/{scope}/"


def _run_folder(key: str) -> str | None:
    """``runs/<scope>/`` of a key inside a run's folder (blobs are kept per run, so ``relaykit
    gc`` deletes them with it); ``None`` for keys elsewhere and for blobs themselves."""
    parts = key.split("/")
    if len(parts) < 3 or parts[0] != RUNS_PREFIX or parts[2] == "blobs":
        return None
    return run_prefix(parts[1])
