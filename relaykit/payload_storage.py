"""Temporal external payload storage over relaykit's store: payloads too large for history go
to ``runs/<root run>/payloads/<sha256>`` and history keeps a checked reference
(:mod:`relaykit.storage` holds the store itself)."""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections.abc import Sequence

from temporalio.api.common.v1 import Payload
from temporalio.converter import (
    DataConverter,
    ExternalStorage,
    StorageDriver,
    StorageDriverClaim,
    StorageDriverRetrieveContext,
    StorageDriverStoreContext,
    StorageDriverWorkflowInfo,
)

from relaykit.storage import (
    _ENCODED_MAGIC,
    _SHA256,
    BLOB_MIN_BYTES,
    RUNS_PREFIX,
    InvalidKey,
    Store,
    StoreError,
    run_prefix,
    scope_for,
)

# --- Temporal external payload storage --------------------------------------------------------


class StoreDriver(StorageDriver):
    """Temporal ``StorageDriver`` over a :class:`Store`: payloads above the threshold go to
    ``runs/<root run>/payloads/<sha256>`` and history keeps a small reference.

    Payloads reach the driver already encoded by the data converter's codec, so they are stored
    as they are. A claim names only a key that is checked (shape and content hash) on the way
    back, so a forged reference cannot read outside the store or swap a payload."""

    NAME = "relaykit-store"

    def __init__(self, store: Store) -> None:
        self.target = store

    def name(self) -> str:
        return self.NAME

    def type(self) -> str:
        return "relaykit.StoreDriver"

    async def store(
        self, context: StorageDriverStoreContext, payloads: Sequence[Payload]
    ) -> list[StorageDriverClaim]:
        target = context.target
        workflow_id = target.id if isinstance(target, StorageDriverWorkflowInfo) else None
        scope = scope_for(workflow_id)
        claims = []
        for payload in payloads:
            data = payload.SerializeToString()
            digest = hashlib.sha256(data).hexdigest()
            key = f"{run_prefix(scope)}payloads/{digest}"
            if not await self.target.exists(key):
                await self._put(key, payload, data)
            claims.append(StorageDriverClaim(claim_data={"key": key}))
        return claims

    async def _put(self, key: str, payload: Payload, data: bytes) -> None:
        if payload.metadata.get("encoding") == b"json/plain":
            await self.target.put(key, data, encode=False, document=payload.data)
            return
        codec = self.target.codec
        if codec is not None and len(data) >= BLOB_MIN_BYTES:
            # Encoded (e.g. encrypted) bytes have no strings to share; the plaintext does. It is
            # stored as the store stores everything with a codec: each piece encoded again.
            plain = (await codec.decode([payload]))[0]
            if plain is not payload and plain.metadata.get("encoding") == b"json/plain":
                await self.target.put(key, plain.SerializeToString(), document=plain.data)
                return
        await self.target.put(key, data, encode=False)

    async def retrieve(
        self, context: StorageDriverRetrieveContext, claims: Sequence[StorageDriverClaim]
    ) -> list[Payload]:
        return list(await asyncio.gather(*(self._retrieve(claim) for claim in claims)))

    async def _retrieve(self, claim: StorageDriverClaim) -> Payload:
        key = claim.claim_data.get("key", "")
        parts = key.split("/")
        if (
            len(parts) != 4
            or parts[0] != RUNS_PREFIX
            or parts[2] != "payloads"
            or not _SHA256.match(parts[3])
        ):
            raise InvalidKey(f"invalid payload reference {key[:100]!r}")
        data = await self.target.get(key, decode=False)
        if data is None:
            raise StoreError(
                f"offloaded payload {key} is not in the store {self.target.location}",
                hint="every worker and client must use the same RELAYKIT_STORE",
            )
        if data.startswith(_ENCODED_MAGIC):  # an encoded payload stored as its plaintext's pieces
            return await self._reencoded(key)
        if hashlib.sha256(data).hexdigest() != parts[3]:
            raise StoreError(f"offloaded payload {key} does not match its digest")
        return Payload.FromString(data)

    async def _reencoded(self, key: str) -> Payload:
        """The payload under ``key``, encoded again with the codec. Its bytes differ from the
        ones the digest in ``key`` was taken of (an encrypting codec uses a new nonce), so what
        vouches for them is the codec (AES-GCM authenticates each piece) and each blob's digest."""
        codec = self.target.codec
        plain = await self.target.get(key)  # decoded: raises when this process has no codec
        if plain is None or codec is None:
            raise StoreError(f"offloaded payload {key} cannot be read back")
        return (await codec.encode([Payload.FromString(plain)]))[0]


def with_external_storage(
    converter: DataConverter, store: Store, *, threshold: int | None = None
) -> DataConverter:
    """``converter`` with Temporal external payload storage in ``store``: payloads at least
    ``threshold`` bytes (default ``store.offload_threshold``) are kept in the store and history
    holds a reference, so large prompts and tool outputs do not hit Temporal's 2 MB limit.

    Pure: the converter's payload converter and codec are kept; a converter that already has
    external storage is returned unchanged."""
    if converter.external_storage is not None:
        return converter
    storage = ExternalStorage(
        drivers=[StoreDriver(store)],
        payload_size_threshold=store.offload_threshold if threshold is None else threshold,
    )
    return dataclasses.replace(converter, external_storage=storage)
