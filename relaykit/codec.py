"""Payload codecs: name one once, and every relaykit client, worker and command uses it.

A payload codec (``temporalio.converter.PayloadCodec``) transforms payload bytes on their way to
and from the Temporal server; encryption is the usual reason. Workers and clients must agree on
it: a worker that encrypts and a command that does not can neither read the other's payloads.
So relaykit reads the codec from one place, ``RELAYKIT_CODEC=module:attr`` (an instance, a class
or a zero-argument factory), and :func:`relaykit.connect` composes it with relaykit's pydantic
payload conversion. The codec then covers workflow and activity inputs and results, queries,
updates, signals, heartbeats, memos, summaries, failures (message and stack trace are moved into
the encoded attributes), and the transcript store's files.

``relaykit codec-server`` serves the codec over Temporal's remote codec protocol so the Temporal
UI and ``temporal --codec-endpoint`` can show decoded payloads to whoever runs it
(:func:`codec_app`).
"""

from __future__ import annotations

import dataclasses
import hmac
import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from typing import Any, Literal, overload

from temporalio.api.common.v1 import Payload
from temporalio.contrib.pydantic import PydanticPayloadConverter
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    DefaultPayloadConverter,
    PayloadCodec,
)

from relaykit.errors import ConfigurationError
from relaykit.payload_conversion import SharedPydanticPayloadConverter

logger = logging.getLogger(__name__)

CODEC_ENV = "RELAYKIT_CODEC"
"""``module:attr`` of the payload codec every relaykit process uses."""
CODEC_AUTH_ENV = "RELAYKIT_CODEC_AUTH"
"""The ``Authorization`` header value the codec server requires (unset: no check)."""


class PayloadDecodeError(ConfigurationError):
    """A payload could not be read: it is encoded by a codec this process does not have, or
    the configured codec cannot decode it (another key)."""


def load_codec(spec: str) -> PayloadCodec:
    """The codec named ``module:attr``: an instance, or a class or function called without
    arguments. Raises :class:`ConfigurationError` with one clear line otherwise."""
    module_name, sep, attr = spec.strip().partition(":")
    hint = f"set {CODEC_ENV}=module:attr, e.g. relaykit.codecs.aes:AesGcmCodec"
    if not sep or not module_name or not attr:
        raise ConfigurationError(f"codec {spec!r} is not of the form module:attr", hint=hint)
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ConfigurationError(
            f"cannot import codec module {module_name!r}: {exc}", hint=hint
        ) from None
    target: Any = module
    for part in attr.split("."):
        try:
            target = getattr(target, part)
        except AttributeError:
            raise ConfigurationError(
                f"module {module_name!r} has no attribute {attr!r}", hint=hint
            ) from None
    if not isinstance(target, PayloadCodec) and callable(target):
        try:
            target = target()
        except ConfigurationError:
            raise
        except Exception as exc:  # noqa: BLE001 - a factory's failure becomes one clear line
            raise ConfigurationError(f"codec {spec} could not be created: {exc}") from None
    if not isinstance(target, PayloadCodec):
        raise ConfigurationError(
            f"{spec} is a {type(target).__name__}, not a temporalio PayloadCodec", hint=hint
        )
    return target


def codec_from_env(env: Mapping[str, str] | None = None) -> PayloadCodec | None:
    """The codec ``RELAYKIT_CODEC`` names, or ``None`` when it is unset."""
    spec = (os.environ if env is None else env).get(CODEC_ENV, "").strip()
    return load_codec(spec) if spec else None


def compose_data_converter(
    data_converter: DataConverter | None = None, codec: PayloadCodec | None = None
) -> DataConverter:
    """relaykit's data converter, keeping what the caller configured.

    relaykit's payloads are pydantic models, so a converter with Temporal's default payload
    conversion gets pydantic conversion instead, and one with Temporal's pydantic conversion
    gets the same conversion with encoders shared per process
    (:class:`SharedPydanticPayloadConverter`); a custom payload converter class is kept (it
    must handle pydantic models). The caller's codec, failure converter and external storage
    are kept. ``codec`` adds a codec; giving a different one in ``data_converter`` too is an
    error rather than a silent choice. With a codec and the default failure converter, failure
    messages and stack traces are encoded too: they may quote tool output or prompts.
    """
    base = data_converter or DataConverter()
    if codec is not None and base.payload_codec is not None and base.payload_codec is not codec:
        raise ConfigurationError(
            "two payload codecs given (codec= and data_converter.payload_codec)",
            hint="pass one of them",
        )
    changes: dict[str, Any] = {}
    if base.payload_converter_class in (DefaultPayloadConverter, PydanticPayloadConverter):
        changes["payload_converter_class"] = SharedPydanticPayloadConverter
    if codec is not None:
        changes["payload_codec"] = codec
    if (
        codec or base.payload_codec
    ) is not None and base.failure_converter_class is DefaultFailureConverter:
        changes["failure_converter_class"] = DefaultFailureConverterWithEncodedAttributes
    return dataclasses.replace(base, **changes) if changes else base


@overload
def describe_decode_error(
    exc: BaseException, *, any_error: Literal[True]
) -> PayloadDecodeError: ...
@overload
def describe_decode_error(
    exc: BaseException, *, any_error: bool = False
) -> PayloadDecodeError | None: ...
def describe_decode_error(
    exc: BaseException, *, any_error: bool = False
) -> PayloadDecodeError | None:
    """A clear error for a payload this process could not read, or ``None`` if ``exc`` is not
    one (Temporal raises a bare ``KeyError`` for an unknown encoding). With ``any_error``,
    ``exc`` is known to come from decoding, so any exception is described."""
    if isinstance(exc, PayloadDecodeError):
        return exc
    text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else ""
    if text.startswith("Unknown payload encoding"):
        encoding = text.removeprefix("Unknown payload encoding").strip()
        return PayloadDecodeError(
            f"cannot read the run's payloads: they are encoded as {encoding!r} and no codec here "
            "decodes them",
            hint=f"set {CODEC_ENV}=module:attr to the codec the workers use",
        )
    if any_error:
        return PayloadDecodeError(
            f"cannot read the run's payloads: {type(exc).__name__}: {exc}",
            hint=f"check {CODEC_ENV} and its keys",
        )
    return None


# --- the remote codec protocol -----------------------------------------------------------------


def _payloads_from_json(body: bytes) -> list[Payload]:
    from google.protobuf import json_format
    from temporalio.api.common.v1 import Payloads

    message = Payloads()
    json_format.Parse(body, message)
    return list(message.payloads)


def _payloads_to_json(payloads: Sequence[Payload]) -> str:
    from google.protobuf import json_format
    from temporalio.api.common.v1 import Payloads

    return json_format.MessageToJson(Payloads(payloads=payloads))


DEFAULT_UI_ORIGINS = (
    "http://127.0.0.1:8233",
    "http://localhost:8233",
    "http://127.0.0.1:8080",
    "http://localhost:8080",
)


def codec_app(
    codec: PayloadCodec,
    *,
    origins: Sequence[str] = DEFAULT_UI_ORIGINS,
    authorization: str | None = None,
) -> Any:
    """A Starlette app serving Temporal's remote codec protocol for ``codec``.

    ``POST /encode`` and ``POST /decode`` take and return ``{"payloads": [...]}`` in protobuf
    JSON. Browsers on ``origins`` (the Temporal UI) may call it; with ``authorization`` every
    request must carry exactly that ``Authorization`` header (the UI can pass the user's access
    token, ``temporal --codec-auth`` a fixed value). Whoever can reach this endpoint and pass
    the check can decrypt payloads: serve it on localhost or behind your auth.
    """
    from starlette.applications import Starlette
    from starlette.middleware import Middleware
    from starlette.middleware.cors import CORSMiddleware
    from starlette.requests import Request
    from starlette.responses import JSONResponse, Response
    from starlette.routing import Route

    def refused(request: Request) -> Response | None:
        if authorization is None:
            return None
        given = request.headers.get("authorization", "")
        if hmac.compare_digest(given.encode(), authorization.encode()):
            return None
        # Who was refused and why, so a misconfigured UI or CLI can be told from an attack;
        # never the header itself, which may be a near-miss of the real token.
        client = request.client.host if request.client is not None else "unknown client"
        why = "a different Authorization header" if given else "no Authorization header"
        logger.warning(
            "refused %s %s from %s (401): %s", request.method, request.url.path, client, why
        )
        return JSONResponse({"error": "unauthorized"}, status_code=401)

    async def transform(request: Request, decode: bool) -> Response:
        denied = refused(request)
        if denied is not None:
            return denied
        try:
            payloads = _payloads_from_json(await request.body())
        except Exception:  # noqa: BLE001 - any malformed body is the caller's error
            return JSONResponse(
                {"error": 'expected {"payloads": [...]} in protobuf JSON'}, status_code=400
            )
        try:
            result = await (codec.decode(payloads) if decode else codec.encode(payloads))
        except Exception as exc:  # noqa: BLE001 - e.g. a payload encrypted with another key
            return JSONResponse({"error": f"{type(exc).__name__}: {exc}"}, status_code=422)
        return Response(_payloads_to_json(result), media_type="application/json")

    async def encode(request: Request) -> Response:
        return await transform(request, decode=False)

    async def decode(request: Request) -> Response:
        return await transform(request, decode=True)

    return Starlette(
        routes=[
            Route("/encode", encode, methods=["POST"]),
            Route("/decode", decode, methods=["POST"]),
        ],
        middleware=[
            Middleware(
                CORSMiddleware,
                allow_origins=list(origins),
                allow_methods=["POST", "OPTIONS"],
                allow_headers=["content-type", "x-namespace", "authorization"],
                allow_credentials=True,
            )
        ],
    )
