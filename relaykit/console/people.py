"""Who is signed in to the console, and what each person may do.

Three ways to know a person, chosen when the console starts:

- **tokens per person**: a TOML file (``--users``, or ``RELAYKIT_CONSOLE_USERS_FILE``) with one
  table per person, ``[users.NAME]`` holding ``role`` and ``token`` (or ``token_sha256``, so the
  file need not hold the token itself); or ``RELAYKIT_CONSOLE_USERS="alice=approver:TOKEN,..."``.
  A person signs in once with their token; the session cookie carries their name, an expiry and
  an HMAC, never the token.
- **a trusted header** (``--trust-header X-Forwarded-User``) set by a reverse proxy that
  authenticates people and strips the header from what clients send. Roles come from the same
  file (tokens optional) and ``--default-role`` for names it does not list.
- **nobody configured**: the console listens on loopback only and the person is the operating
  system user who started it, as approver (one person at their own machine).

Roles are ordered, each may do what the one before may:

- ``viewer``: read every page and API (runs, a run's conversation, children, costs, events);
- ``operator``: act on a run's course: steer, send a message, pause, resume, fork, cancel,
  raise a dollar budget;
- ``approver``: decide tool calls waiting for a person (approve, reject with a reason), the
  actions that let a side effect happen.

Every action carries the signed-in person's name as ``by``, recorded in the run's history.
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from relaykit.errors import RelaykitError

Role = Literal["viewer", "operator", "approver"]
ROLES: tuple[Role, ...] = ("viewer", "operator", "approver")

USERS_ENV = "RELAYKIT_CONSOLE_USERS"
USERS_FILE_ENV = "RELAYKIT_CONSOLE_USERS_FILE"
SECRET_ENV = "RELAYKIT_CONSOLE_SECRET"
SESSION_COOKIE = "relaykit_console"
SESSION_SECONDS = 12 * 3600
"""How long a sign-in lasts."""

ACTION_ROLES: dict[str, Role] = {
    "approve": "approver",
    "reject": "approver",
    "steer": "operator",
    "send": "operator",
    "pause": "operator",
    "resume": "operator",
    "fork": "operator",
    "cancel": "operator",
    "budget": "operator",
}
"""The least role each action needs (documented in docs/console.md)."""


def may(role: Role | None, needed: Role) -> bool:
    return role is not None and ROLES.index(role) >= ROLES.index(needed)


@dataclass(frozen=True)
class Person:
    name: str
    role: Role


@dataclass(frozen=True)
class _Entry:
    role: Role
    token_sha256: str | None


def _sha256(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def _role(value: Any, where: str) -> Role:
    if value not in ROLES:
        raise RelaykitError(f"{where}: role {value!r} is not one of {', '.join(ROLES)}")
    role: Role = value
    return role


def parse_users_file(path: str) -> dict[str, _Entry]:
    try:
        data = tomllib.loads(Path(path).read_text())
    except OSError as exc:
        raise RelaykitError(f"cannot read the users file {path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise RelaykitError(f"the users file {path} is not TOML: {exc}") from None
    users = data.get("users")
    if not isinstance(users, dict):
        raise RelaykitError(f"the users file {path} has no [users.NAME] tables")
    entries = {}
    for name, fields in users.items():
        if not isinstance(fields, dict):
            raise RelaykitError(f"{path}: users.{name} must be a table with role and token")
        digest = fields.get("token_sha256")
        if isinstance(fields.get("token"), str) and fields["token"]:
            digest = _sha256(fields["token"])
        entries[name] = _Entry(_role(fields.get("role"), f"{path}: users.{name}"), digest)
    return entries


def parse_users_env(value: str) -> dict[str, _Entry]:
    """``alice=approver:TOKEN,bob=viewer:TOKEN``."""
    entries = {}
    for part in filter(None, (p.strip() for p in value.split(","))):
        name, _, rest = part.partition("=")
        role, _, token = rest.partition(":")
        if not name or not token:
            raise RelaykitError(
                f"{USERS_ENV}: expected NAME=ROLE:TOKEN, got {part.split(':')[0]!r}…"
            )
        entries[name.strip()] = _Entry(_role(role.strip(), USERS_ENV), _sha256(token.strip()))
    return entries


class People:
    """The console's sign-in: who a request comes from, and the CSRF token of their forms."""

    def __init__(
        self,
        users: dict[str, _Entry] | None = None,
        *,
        trust_header: str | None = None,
        default_role: Role | None = None,
        local_user: str | None = None,
        secret: bytes | None = None,
    ) -> None:
        self.users = users or {}
        self.trust_header = trust_header.lower() if trust_header else None
        self.default_role = default_role
        self.local_user = local_user
        self.secret = secret or secrets.token_bytes(32)

    @classmethod
    def configure(
        cls,
        *,
        users_file: str | None,
        trust_header: str | None,
        default_role: Role | None,
        local_user: str,
    ) -> People:
        """From the command line and the environment (``RELAYKIT_CONSOLE_*``)."""
        path = users_file or os.environ.get(USERS_FILE_ENV) or None
        users = parse_users_file(path) if path else {}
        users.update(parse_users_env(os.environ.get(USERS_ENV, "")))
        secret = os.environ.get(SECRET_ENV)
        open_to_local = not users and not trust_header
        return cls(
            users,
            trust_header=trust_header,
            default_role=default_role,
            local_user=local_user if open_to_local else None,
            secret=secret.encode() if secret else None,
        )

    @property
    def needs_sign_in(self) -> bool:
        return self.trust_header is None and self.local_user is None

    @property
    def guarded(self) -> bool:
        """Whether a person must prove who they are (else: loopback only)."""
        return self.local_user is None

    def sign_in(self, token: str) -> str | None:
        """The session cookie's value for ``token``'s owner, or ``None``."""
        digest = _sha256(token.strip()) if token.strip() else ""
        for name, entry in self.users.items():
            if entry.token_sha256 and hmac.compare_digest(digest, entry.token_sha256):
                return self._session(name)
        return None

    def _mac(self, message: str) -> str:
        return hmac.new(self.secret, message.encode(), hashlib.sha256).hexdigest()

    def _session(self, name: str) -> str:
        expires = int(time.time()) + SESSION_SECONDS
        body = f"{name.encode().hex()}.{expires}"
        return f"{body}.{self._mac('session|' + body)}"

    def _from_session(self, value: str) -> str | None:
        body, _, mac = value.rpartition(".")
        if not body or not hmac.compare_digest(mac, self._mac("session|" + body)):
            return None
        name_hex, _, expires = body.partition(".")
        if not expires.isdigit() or int(expires) < time.time():
            return None
        try:
            return bytes.fromhex(name_hex).decode()
        except ValueError:
            return None

    def person(self, headers: Any, cookies: Any) -> Person | None:
        """Who sent the request (``None``: nobody signed in, or a name without a role)."""
        if self.local_user is not None:
            return Person(self.local_user, "approver")
        if self.trust_header is not None:
            name = (headers.get(self.trust_header) or "").strip()
        else:
            name = self._from_session(cookies.get(SESSION_COOKIE, "")) or ""
        if not name:
            return None
        entry = self.users.get(name)
        role = entry.role if entry is not None else self.default_role
        return Person(name, role) if role is not None else None

    def by_bearer(self, headers: Any) -> Person | None:
        """A person's own token in ``Authorization: Bearer …`` (for scripts; no CSRF needed,
        a browser never sends it by itself)."""
        scheme, _, token = (headers.get("authorization") or "").partition(" ")
        if scheme.lower() != "bearer" or not token or self.trust_header or not self.users:
            return None
        digest = _sha256(token.strip())
        for name, entry in self.users.items():
            if entry.token_sha256 and hmac.compare_digest(digest, entry.token_sha256):
                return Person(name, entry.role)
        return None

    def csrf(self, person: Person, cookies: Any) -> str:
        """The CSRF token of ``person``'s forms: tied to their session (or name)."""
        return self._mac(f"csrf|{person.name}|{cookies.get(SESSION_COOKIE, '')}")

    def csrf_ok(self, person: Person, cookies: Any, given: str | None) -> bool:
        return hmac.compare_digest((given or "").encode(), self.csrf(person, cookies).encode())
