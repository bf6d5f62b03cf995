"""Payload conversion a worker shares among the runs it caches (clients use it too, through
:func:`relaykit.codec.compose_data_converter`)."""

from __future__ import annotations

import dataclasses

from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import CompositePayloadConverter, DataConverter, EncodingPayloadConverter

_shared_encodings: tuple[EncodingPayloadConverter, ...] = ()


class SharedPydanticPayloadConverter(PydanticPayloadConverter):
    """Temporal's pydantic payload conversion, with one set of encoding converters per process.

    A worker builds a payload converter for every workflow run it holds in its cache, and
    Temporal's pydantic converter builds its encoders anew each time, each with its own cache of
    pydantic type adapters, filled again by every run: about 10 kB of every waiting run's memory
    (bench/README.md, issue 34). The encoders keep no state of a run (a type adapter depends
    only on its type, and the cache is bounded), so every instance of this class uses the same
    ones. It converts exactly as :class:`PydanticPayloadConverter` does.
    """

    def __init__(self) -> None:
        global _shared_encodings
        if not _shared_encodings:
            _shared_encodings = tuple(PydanticPayloadConverter().converters.values())
        CompositePayloadConverter.__init__(self, *_shared_encodings)


def shared_payload_conversion(converter: DataConverter) -> DataConverter:
    """``converter`` with :class:`SharedPydanticPayloadConverter` where it has Temporal's own
    pydantic payload converter (which converts the same); any other class is kept."""
    if converter.payload_converter_class is PydanticPayloadConverter:
        return dataclasses.replace(
            converter, payload_converter_class=SharedPydanticPayloadConverter
        )
    return converter
