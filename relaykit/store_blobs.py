"""A stored object's large JSON strings, cut out to be kept once per run folder as blobs (a
tool result inside a model request, a transcript node and a run result share one copy).
:class:`relaykit.storage.Store` writes the blobs and the manifest that stands for them."""

from __future__ import annotations

import dataclasses
import hashlib
import json

BLOB_MIN_BYTES = 64 * 1024
"""A JSON string at least this long (escaped) inside a stored object is kept once, as a blob."""


@dataclasses.dataclass(frozen=True)
class Blob:
    """A large string cut out of an object: its bytes (quotes included) and their SHA-256."""

    data: bytes
    digest: str


def large_strings(document: bytes) -> list[bytes]:
    """The strings of the JSON ``document`` at least :data:`BLOB_MIN_BYTES` long once encoded,
    as they appear in it (quotes included), in document order; none if it is not JSON."""
    try:
        value = json.loads(document)
    except (ValueError, RecursionError):  # not JSON text (or nested too deep): nothing to share
        return []
    found: list[str] = []
    stack = [value]
    while stack:  # depth-first, children pushed in reverse: strings come out in document order
        item = stack.pop()
        if isinstance(item, str):
            if len(item) * 4 >= BLOB_MIN_BYTES:  # may reach the size once encoded
                found.append(item)
        elif isinstance(item, dict):
            for key, child in reversed(item.items()):
                stack.extend((child, key))
        elif isinstance(item, list):
            stack.extend(reversed(item))
    encoded = (json.dumps(text, ensure_ascii=False).encode() for text in found)
    return [piece for piece in encoded if len(piece) >= BLOB_MIN_BYTES]


def split_large_strings(data: bytes, document: bytes | None = None) -> list[bytes | Blob]:
    """``data`` as inline pieces and :class:`Blob` s, which joined give ``data`` back exactly.

    The blobs are the large strings of the JSON ``document`` (default ``data``; an offloaded
    payload passes its JSON data, which its serialised form holds as it is), found in ``data``
    byte for byte. Equal strings in different objects (a tool result inside a model request, a
    transcript node and a run result) give equal blobs: the JSON encoders relaykit uses
    (pydantic's and the standard library's with ``ensure_ascii=False``) escape a string the same
    way. A string escaped another way is not found, and stays inline: a missed share costs
    bytes, never correctness. JSON is parsed by the standard library's C parser and the strings
    are found with ``bytes.find``, so a few MB take milliseconds."""
    parts: list[bytes | Blob] = []
    cursor = 0
    for piece in large_strings(data if document is None else document):
        start = data.find(piece, cursor)
        if start < 0:
            continue
        if start > cursor:
            parts.append(data[cursor:start])
        parts.append(Blob(piece, hashlib.sha256(piece).hexdigest()))
        cursor = start + len(piece)
    if cursor < len(data):
        parts.append(data[cursor:])
    return parts
