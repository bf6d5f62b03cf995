"""AES-256-GCM payload encryption, keyed from the environment.

Use it with ``RELAYKIT_CODEC=relaykit.codecs.aes:AesGcmCodec`` and a 32-byte key in
``RELAYKIT_CODEC_KEY`` (64 hex characters, or base64), set for every worker, command and codec
server. Generate one with::

    python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())"

Each payload is the encrypted serialized original payload, under a fresh 96-bit nonce, with the
key id in the payload's metadata (and bound to the ciphertext). The key id lets keys rotate:
set the new key in ``RELAYKIT_CODEC_KEY`` and keep the old ones, as ``id:key`` items separated
by commas, in ``RELAYKIT_CODEC_OLD_KEYS`` until no run that used them is kept any more. The id
of a key defaults to a short fingerprint of it (``RELAYKIT_CODEC_KEY_ID`` names it instead), so
old keys may also be listed bare. Payloads that are not encrypted (written before encryption was
turned on) are read as they are.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
from collections.abc import Mapping, Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from temporalio.api.common.v1 import Payload
from temporalio.converter import PayloadCodec

from relaykit.codec import PayloadDecodeError
from relaykit.errors import ConfigurationError

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
KEY_ENV = "RELAYKIT_CODEC_KEY"
KEY_ID_ENV = "RELAYKIT_CODEC_KEY_ID"
OLD_KEYS_ENV = "RELAYKIT_CODEC_OLD_KEYS"
NONCE_BYTES = 12


def parse_key(value: str | bytes, *, source: str = KEY_ENV) -> bytes:
    """A 32-byte key from raw bytes, 64 hex characters or base64 (the value is never echoed
    in errors)."""
    if isinstance(value, bytes) and len(value) == 32:
        return value
    text = value.decode() if isinstance(value, bytes) else value
    text = text.strip()
    key: bytes | None = None
    if len(text) == 64:
        try:
            key = bytes.fromhex(text)
        except ValueError:
            key = None
    if key is None:
        try:
            key = base64.b64decode(
                text.replace("-", "+").replace("_", "/") + "=" * (-len(text) % 4), validate=True
            )
        except (binascii.Error, ValueError):
            key = None
    if key is None or len(key) != 32:
        raise ConfigurationError(
            f"{source} is not a 32-byte key",
            hint="give 64 hex characters or the base64 of 32 random bytes",
        )
    return key


def key_id_of(key: bytes) -> str:
    """A short public fingerprint of a key (it reveals nothing usable about the key)."""
    return "k" + hashlib.sha256(b"relaykit-key-id\0" + key).hexdigest()[:10]


class AesGcmCodec(PayloadCodec):
    """Encrypts every payload with AES-256-GCM. Without arguments the keys come from
    ``RELAYKIT_CODEC_KEY``, ``RELAYKIT_CODEC_KEY_ID`` and ``RELAYKIT_CODEC_OLD_KEYS``."""

    def __init__(
        self,
        key: bytes | str | None = None,
        *,
        key_id: str | None = None,
        old_keys: Mapping[str, bytes | str] | Sequence[bytes | str] = (),
        env: Mapping[str, str] | None = None,
    ) -> None:
        environ = os.environ if env is None else env
        if key is None:
            raw = environ.get(KEY_ENV, "")
            if not raw.strip():
                raise ConfigurationError(
                    f"{KEY_ENV} is not set", hint="the AES-GCM codec needs a 32-byte key"
                )
            key = parse_key(raw)
            key_id = key_id or environ.get(KEY_ID_ENV) or None
            if not old_keys:
                old_keys = _parse_old_keys(environ.get(OLD_KEYS_ENV, ""))
        current = parse_key(key)
        self.key_id = key_id or key_id_of(current)
        self._keys: dict[str, AESGCM] = {}
        items = old_keys.items() if isinstance(old_keys, Mapping) else [(None, k) for k in old_keys]
        for old_id, old in items:
            parsed = parse_key(old, source=OLD_KEYS_ENV)
            self._keys[old_id or key_id_of(parsed)] = AESGCM(parsed)
        self._current = AESGCM(current)
        self._keys[self.key_id] = self._current

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        aad = self.key_id.encode()
        out = []
        for payload in payloads:
            nonce = os.urandom(NONCE_BYTES)
            sealed = self._current.encrypt(nonce, payload.SerializeToString(), aad)
            out.append(
                Payload(
                    metadata={"encoding": ENCODING, KEY_ID_METADATA: aad},
                    data=nonce + sealed,
                )
            )
        return out

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        out = []
        for payload in payloads:
            if payload.metadata.get("encoding") != ENCODING:
                out.append(payload)
                continue
            key_id = payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")
            cipher = self._keys.get(key_id)
            if cipher is None:
                raise PayloadDecodeError(
                    f"a payload is encrypted with key id {key_id!r}, which is not configured here",
                    hint=f"set {KEY_ENV} or {OLD_KEYS_ENV} to include that key",
                )
            data = payload.data
            try:
                plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], key_id.encode())
            except InvalidTag:
                raise PayloadDecodeError(
                    f"a payload with key id {key_id!r} does not decrypt: another key under the "
                    "same id, or altered data",
                    hint=f"check {KEY_ENV}",
                ) from None
            decoded = Payload()
            decoded.ParseFromString(plain)
            out.append(decoded)
        return out


def _parse_old_keys(value: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for item in filter(None, (part.strip() for part in value.split(","))):
        key_id, sep, key = item.partition(":")
        if sep:
            keys[key_id.strip()] = key.strip()
        else:
            keys[key_id_of(parse_key(item, source=OLD_KEYS_ENV))] = item
    return keys
