"""Where a model request goes and with which key: read from the worker's environment.

A :class:`~relaykit.models.spec.ModelSpec` is stored in Temporal history, so it may name an
environment variable but never hold a key; the key is looked up here, inside the activity.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from temporalio.exceptions import ApplicationError

from relaykit.errors import (
    MODEL_CALL_FAILED,
)
from relaykit.models.spec import ModelSpec

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
ANTHROPIC_DEFAULT_BASE_URL = "https://api.anthropic.com"
ANTHROPIC_VERSION = "2023-06-01"
#: Set by the worker when it runs the bundled local model server.
LOCAL_BASE_URL_ENV = "RELAYKIT_LOCAL_BASE_URL"

_CREDENTIAL_HEADERS = frozenset({"authorization", "x-api-key", "api-key"})

# --------------------------------------------------------------------------------------------
# Endpoints
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Endpoint:
    """Where one model call goes. Built in the worker; never stored in history."""

    provider: str
    url: str
    headers: dict[str, str] = field(repr=False)
    key_env: str | None = None
    """Name of the variable the key came from (or should have), for error hints."""
    secret: str | None = field(default=None, repr=False)
    """Kept only to scrub it from any error text."""

    @property
    def secrets(self) -> tuple[str | None, ...]:
        """Everything to scrub from error text: the key and the credential headers built from it."""
        sent = (v for k, v in self.headers.items() if k.lower() in _CREDENTIAL_HEADERS)
        return (self.secret, *sent)

    @property
    def compatible(self) -> bool:
        """Whether the endpoint speaks OpenAI chat completions."""
        return self.provider != "anthropic"


def config_error(message: str, hint: str) -> ApplicationError:
    return ApplicationError(f"{message} — {hint}", type=MODEL_CALL_FAILED, non_retryable=True)


def _chat_completions_url(base: str) -> str:
    """A bare host (``http://127.0.0.1:8080``) gets ``/v1``, since that is where every
    OpenAI-compatible server mounts its API; any other path is kept as the user wrote it."""
    base = base.rstrip("/")
    if base.endswith("/chat/completions"):
        return base
    if urlsplit(base).path in ("", "/"):
        base += "/v1"
    return base + "/chat/completions"


def _messages_url(base: str) -> str:
    base = base.rstrip("/")
    if base.endswith("/v1/messages"):
        return base
    if base.endswith("/v1"):
        return base + "/messages"
    return base + "/v1/messages"


def _key(
    spec: ModelSpec, default_env: str | None, env: Mapping[str, str]
) -> tuple[str | None, str | None]:
    """The key and the name of its variable. A variable the spec names explicitly must be set:
    naming it says a key is needed, and failing here beats a 401 from the server."""
    if spec.api_key_env:
        value = env.get(spec.api_key_env) or None
        if value is None:
            raise config_error(
                f"{spec.api_key_env} is not set on the worker",
                f"model {spec.label!r} reads its API key from {spec.api_key_env}; set it in the "
                "environment of the worker that runs model activities",
            )
        return value, spec.api_key_env
    if default_env is None:
        return None, None
    return env.get(default_env) or None, default_env


def resolve_endpoint(spec: ModelSpec, env: Mapping[str, str] | None = None) -> Endpoint:
    """The URL and headers for ``spec``, from the worker's environment (``os.environ`` unless
    ``env`` is given)."""
    env = os.environ if env is None else env
    try:
        if spec.provider == "anthropic":
            return _anthropic_endpoint(spec, env)
        return _compatible_endpoint(spec, env)
    except ValueError as exc:  # urlsplit's: retrying cannot make the URL readable
        raise config_error(
            f"cannot call {spec.provider}: its base URL is not a URL ({exc})",
            "check the base URL configured for this model",
        ) from None


def _anthropic_endpoint(spec: ModelSpec, env: Mapping[str, str]) -> Endpoint:
    base = spec.base_url or env.get("ANTHROPIC_BASE_URL") or ANTHROPIC_DEFAULT_BASE_URL
    key, key_env = _key(spec, "ANTHROPIC_API_KEY", env)
    if key is None and base.rstrip("/") == ANTHROPIC_DEFAULT_BASE_URL:
        raise config_error(
            f"{key_env} is not set on the worker",
            f"model {spec.label!r} needs an Anthropic API key in the environment of the "
            "worker that runs model activities",
        )
    headers = {"anthropic-version": ANTHROPIC_VERSION}
    if key is not None:
        headers["x-api-key"] = key
    return Endpoint("anthropic", _messages_url(base), headers, key_env, key)


def _compatible_endpoint(spec: ModelSpec, env: Mapping[str, str]) -> Endpoint:
    if spec.provider == "local":
        local = spec.base_url or env.get(LOCAL_BASE_URL_ENV)
        if not local:
            raise config_error(
                f"the local model server is not running ({LOCAL_BASE_URL_ENV} is not set on "
                f"the worker), so model {spec.label!r} cannot be called",
                "start the worker with its local model server enabled, or point "
                f"{LOCAL_BASE_URL_ENV} at an OpenAI-compatible server",
            )
        base = local
        key, key_env = _key(spec, None, env)
    else:
        base = spec.base_url or env.get("OPENAI_BASE_URL") or OPENAI_DEFAULT_BASE_URL
        key, key_env = _key(spec, "OPENAI_API_KEY", env)
        if key is None and urlsplit(base).hostname == "api.openai.com":
            raise config_error(
                f"{key_env} is not set on the worker",
                f"model {spec.label!r} needs an OpenAI API key in the environment of the worker "
                "that runs model activities (or set OPENAI_BASE_URL for a local server)",
            )
    headers: dict[str, str] = {}
    if key is not None:
        headers["authorization"] = f"Bearer {key}"
    return Endpoint(spec.provider, _chat_completions_url(base), headers, key_env, key)
