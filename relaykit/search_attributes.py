"""The custom search attributes relaykit writes on its runs.

They let people find runs in the Temporal UI and with ``temporal workflow list --query`` (for
example ``RelayStatus = 'waiting_approval'`` or ``RelayTokens > 100000``), and let a parent run's
children be listed with ``RelayParentRun = '<workflow id>'``.

A Temporal cluster rejects a workflow that sets a search attribute it does not know, so every
attribute here must be registered on the namespace before a worker with search attributes
enabled runs:

- the embedded dev server (:class:`relaykit.devserver.DevServer`) passes them to
  ``temporal server start-dev --search-attribute NAME=Type`` and checks them again once it is up;
- a production cluster needs them registered once per namespace, by an operator::

      temporal operator search-attribute create --namespace default \\
          --name RelayAgent --type Keyword --name RelayStatus --type Keyword \\
          --name RelayTokens --type Int --name RelayParentRun --type Keyword \\
          --name RelayForkOf --type Keyword --name RelayTenant --type Keyword \\
          --name RelayCostUSD --type Double --name RelayEvalOf --type Keyword \\
          --name RelayWaitingFor --type Keyword --name RelayLastActivity --type Datetime \\
          --name RelayWaitingCalls --type KeywordList

  (:func:`operator_create_args` builds that command; :func:`ensure_registered` does the same
  from a client that is allowed to call the operator service; the repository's
  ``docker-compose.yml`` runs it in a one-shot setup container.)

Registering is idempotent when the type matches. Renaming or retyping an attribute is a breaking
change for every cluster that already has it, so names and types here are frozen.

This module is imported by workflow code: it must stay free of I/O and of imports that the
workflow sandbox would reject at import time.
"""

from __future__ import annotations

import hashlib
import json
import time
import weakref
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Final

from temporalio.common import (
    SearchAttributeIndexedValueType,
    SearchAttributeKey,
    SearchAttributePair,
    SearchAttributeUpdate,
    TypedSearchAttributes,
)

if TYPE_CHECKING:
    from temporalio.client import Client

RELAY_AGENT: Final = SearchAttributeKey.for_keyword("RelayAgent")
"""The agent currently holding the run (changes on every handoff)."""

RELAY_STATUS: Final = SearchAttributeKey.for_keyword("RelayStatus")
"""The run's status: ``running``, ``waiting_approval``, ``paused``, ``budget_reached``,
``waiting_parent_budget`` (a child run waiting for its parent to grant more), ``completed``,
``failed`` or ``cancelled`` (the values of :data:`relaykit.runs.RunStatus`)."""

RELAY_TOKENS: Final = SearchAttributeKey.for_int("RelayTokens")
"""Tokens used so far (input + output, children included)."""

RELAY_PARENT_RUN: Final = SearchAttributeKey.for_keyword("RelayParentRun")
"""For a child run: the workflow id of the run that started it (unset on root runs)."""

RELAY_COST_USD: Final = SearchAttributeKey.for_float("RelayCostUSD")
"""What the run has spent so far in USD (children included; calls without a price count
nothing), e.g. ``RelayCostUSD > 1``. Written with the others, only when the namespace has it
(namespaces registered before it existed still get the others)."""

RELAY_FORK_OF: Final = SearchAttributeKey.for_keyword("RelayForkOf")
"""For a run started by :func:`relaykit.fork_run`: ``"<run id>@<turn>"`` of its origin. Set
when the fork starts, and only when the namespace has it (namespaces registered before it
existed still get the others)."""

RELAY_TENANT: Final = SearchAttributeKey.for_keyword("RelayTenant")
"""The tenant a run was started for (``start_run(..., tenant=...)``, also on forks). Set when the
run starts, and only when the namespace has it."""

RELAY_EVAL_OF: Final = SearchAttributeKey.for_keyword("RelayEvalOf")
"""For a candidate run of an evaluation (:mod:`relaykit.evals`): the workflow id of the recorded
run it answers again. Set when the candidate starts, only when the namespace has it; runs that
have it are left out of ``relaykit runs`` and the inbox."""
RELAY_WAITING_FOR: Final = SearchAttributeKey.for_keyword("RelayWaitingFor")
"""What an open run waits for a person for: ``approval``, ``unknown_outcome`` (a decision on a
``"write"`` call lost in flight), ``budget`` or ``paused`` (:data:`WAITING_REASONS`); unset
while it works. Written with the others, only when the namespace has it and
:data:`RELAY_LAST_ACTIVITY` (runs of namespaces registered before they existed get the others),
so ``RelayStatus = 'waiting_approval'`` alone also finds runs started before."""

RELAY_LAST_ACTIVITY: Final = SearchAttributeKey.for_datetime("RelayLastActivity")
"""When the run last changed what a person sees in a list (its agent, status or what it waits
for), in workflow time; written with :data:`RELAY_WAITING_FOR`. Not every turn: each upsert is a
history event."""

WAITING_REASONS: Final = ("approval", "unknown_outcome", "budget", "paused")
"""The values of :data:`RELAY_WAITING_FOR` (compatibility data: queries name them)."""

RELAY_WAITING_CALLS: Final = SearchAttributeKey.for_keyword_list("RelayWaitingCalls")
"""The call ids waiting for a person in the run (its own and its agent-tool children's), e.g.
``RelayWaitingCalls = 'call_7'``: answering many approvals checks them here, from the server,
without a query to a busy worker (:mod:`relaykit.bulk_approvals`). Written with the others, only
when the namespace has it. A list too long for one attribute value ends in
:data:`MORE_CALLS` (:func:`waiting_call_ids`); readers then ask the run."""

MORE_CALLS: Final = "…"
"""The last entry of a cut ``RelayWaitingCalls`` (no call id has this character)."""

UPSERTED: Final[list[SearchAttributeKey[Any]]] = [
    RELAY_AGENT,
    RELAY_STATUS,
    RELAY_TOKENS,
    RELAY_PARENT_RUN,
]
"""What runs write themselves: a worker lets runs upsert only when all of these are registered."""

LIST_ATTRIBUTES: Final[list[SearchAttributeKey[Any]]] = [RELAY_WAITING_FOR, RELAY_LAST_ACTIVITY]
"""Upserted together, only when the namespace has both (:func:`upsert_choices`)."""

ALL: Final[list[SearchAttributeKey[Any]]] = [
    *UPSERTED,
    RELAY_FORK_OF,
    RELAY_TENANT,
    RELAY_COST_USD,
    RELAY_EVAL_OF,
    *LIST_ATTRIBUTES,
    RELAY_WAITING_CALLS,
]
"""Every attribute relaykit may write, i.e. what a namespace should have registered."""


MAX_VALUE_BYTES: Final = 2048
"""The Temporal server's default limit on one search attribute value
(``limit.searchAttributeValueSize``), measured as the SDK encodes it: JSON, with every non-ASCII
character escaped (``账`` is six bytes)."""


def keyword(value: str) -> str:
    """``value`` as a Keyword attribute can hold it: unchanged when it fits, else cut and ended
    with a digest of the whole (``…`` and 16 hex digits).

    Agent names are free text and workflow ids may be 1,000 non-ASCII characters: written whole,
    such a value made the server refuse the command that carried it, and the run failed at a
    handoff or when it started a child. Filters that name a value pass it through here too, so
    ``RelayAgent = '<name>'`` finds the run whatever the name's length."""
    if len(json.dumps(value)) <= MAX_VALUE_BYTES:
        return value
    suffix = "…" + hashlib.sha256(value.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    room = MAX_VALUE_BYTES - len(json.dumps(suffix))
    kept: list[str] = []
    for char in value:
        room -= len(json.dumps(char)) - 2
        if room < 0:
            break
        kept.append(char)
    return "".join(kept) + suffix


def waiting_call_ids(call_ids: Sequence[str]) -> list[str]:
    """``call_ids`` as ``RelayWaitingCalls`` can hold them: whole when they fit in one value,
    else the first that fit and then :data:`MORE_CALLS`. Forty calls waiting at once used to
    pass the server's limit, and the server terminated the run."""
    ids = list(call_ids)
    if len(json.dumps(ids, separators=(",", ":"))) <= MAX_VALUE_BYTES:
        return ids
    room = MAX_VALUE_BYTES - len(json.dumps([MORE_CALLS]))
    kept: list[str] = []
    for call_id in ids:
        room -= len(json.dumps(call_id)) + 1  # and its comma
        if room < 0:
            break
        kept.append(call_id)
    return [*kept, MORE_CALLS]


def listed_calls(value: Sequence[str] | None) -> list[str] | None:
    """The call ids a ``RelayWaitingCalls`` value names, or ``None`` when it does not name them
    all (unset, empty or cut): ask the run instead."""
    if not value or value[-1] == MORE_CALLS:
        return None
    return list(value)


def query_literal(value: str) -> str:
    """A string literal of a visibility query. (Not ``json.dumps``: the server reads a
    ``\\u8d26`` escape as those six characters, so a non-ASCII id matched nothing.)"""
    return "'" + value.replace("\\", "\\\\").replace("'", "\\'") + "'"


def started_pairs(
    agent: str, *, now: datetime, cost: bool, listed: bool
) -> list[SearchAttributePair[Any]]:
    """What a run's first upsert would write, for its start request to carry instead.

    A run recorded with ``changed_attributes`` upserts only what differs from its attributes,
    so one started with these has nothing to write at its first workflow task: one command,
    one history event and one visibility write fewer per run, and the run is listed with its
    agent and status from the moment it starts. ``cost`` and ``listed`` say whether the
    namespace has ``RelayCostUSD`` and :data:`LIST_ATTRIBUTES`."""
    pairs: list[SearchAttributePair[Any]] = [
        SearchAttributePair(RELAY_AGENT, keyword(agent)),
        SearchAttributePair(RELAY_STATUS, "running"),  # a new run's RunState.status
        SearchAttributePair(RELAY_TOKENS, 0),
    ]
    if cost:
        pairs.append(SearchAttributePair(RELAY_COST_USD, 0.0))
    if listed:
        pairs.append(SearchAttributePair(RELAY_LAST_ACTIVITY, now))
    return pairs


def changed_only(
    updates: Sequence[SearchAttributeUpdate[Any]], current: TypedSearchAttributes
) -> list[SearchAttributeUpdate[Any]]:
    """The ``updates`` that change ``current`` (an unset attribute and an empty list are the
    same). ``RelayLastActivity`` stays only with a change of what a list shows: the agent, the
    status or what the run waits for."""
    changed = [
        update
        for update in updates
        if update.key != RELAY_LAST_ACTIVITY
        and _unset_if_empty(current.get(update.key)) != _unset_if_empty(update.value)
    ]
    if any(update.key in (RELAY_AGENT, RELAY_STATUS, RELAY_WAITING_FOR) for update in changed):
        changed += [update for update in updates if update.key == RELAY_LAST_ACTIVITY]
    return changed


def _unset_if_empty(value: Any) -> Any:
    return None if value == [] else value


# The spelling that `temporal` CLI flags (--search-attribute, --type) accept.
_CLI_TYPE_NAMES: Final[dict[SearchAttributeIndexedValueType, str]] = {
    SearchAttributeIndexedValueType.TEXT: "Text",
    SearchAttributeIndexedValueType.KEYWORD: "Keyword",
    SearchAttributeIndexedValueType.INT: "Int",
    SearchAttributeIndexedValueType.DOUBLE: "Double",
    SearchAttributeIndexedValueType.BOOL: "Bool",
    SearchAttributeIndexedValueType.DATETIME: "Datetime",
    SearchAttributeIndexedValueType.KEYWORD_LIST: "KeywordList",
}


def cli_type_name(key: SearchAttributeKey[Any]) -> str:
    """The type as the ``temporal`` CLI spells it (``Keyword``, ``Int``, ...)."""
    return _CLI_TYPE_NAMES[key.indexed_value_type]


def specs(keys: Sequence[SearchAttributeKey[Any]] = ALL) -> list[str]:
    """``NAME=Type`` strings, the form ``temporal server start-dev --search-attribute`` takes
    (and the form the compose setup service lists them in)."""
    return [f"{key.name}={cli_type_name(key)}" for key in keys]


def start_dev_args(keys: Sequence[SearchAttributeKey[Any]] = ALL) -> list[str]:
    """``--search-attribute NAME=Type`` flags for ``temporal server start-dev``."""
    args: list[str] = []
    for spec in specs(keys):
        args += ["--search-attribute", spec]
    return args


def operator_create_args(
    namespace: str = "default",
    *,
    address: str | None = None,
    keys: Sequence[SearchAttributeKey[Any]] = ALL,
) -> list[str]:
    """The ``temporal operator search-attribute create`` command (as argv, without the
    executable) that registers ``keys`` on ``namespace`` of a production cluster.

    One command registers them all; running it again is harmless.
    """
    args = ["operator", "search-attribute", "create", "--namespace", namespace]
    if address is not None:
        args += ["--address", address]
    for key in keys:
        args += ["--name", key.name, "--type", cli_type_name(key)]
    return args


async def ensure_registered(
    client: Client,
    namespace: str | None = None,
    keys: Sequence[SearchAttributeKey[Any]] = ALL,
) -> list[str]:
    """Register whichever of ``keys`` ``namespace`` lacks; return the names it added.

    Needed even on the dev server: ``start-dev --search-attribute`` only applies when it creates
    the namespace, so a database file from an older relaykit would miss attributes added since.
    Raises :class:`ValueError` when an attribute exists with another type, because relaykit's
    upserts would then fail on every run.
    """
    from temporalio.api.enums.v1 import IndexedValueType
    from temporalio.api.operatorservice.v1 import (
        AddSearchAttributesRequest,
        ListSearchAttributesRequest,
    )

    ns = namespace or client.namespace
    listed = await client.operator_service.list_search_attributes(
        ListSearchAttributesRequest(namespace=ns)
    )
    existing: dict[str, int] = {**listed.system_attributes, **listed.custom_attributes}
    missing: dict[str, IndexedValueType.ValueType] = {}
    for key in keys:
        wanted = int(key.indexed_value_type)
        have = existing.get(key.name)
        if have is None:
            missing[key.name] = IndexedValueType.ValueType(wanted)
        elif have != wanted:
            # IntEnum keys hash like ints, so the raw proto value looks them up directly.
            have_name = _CLI_TYPE_NAMES.get(have, str(have))  # type: ignore[call-overload]
            raise ValueError(
                f"search attribute {key.name} exists on namespace {ns!r} with type "
                f"{have_name}, relaykit needs {cli_type_name(key)}"
            )
    if missing:
        await client.operator_service.add_search_attributes(
            AddSearchAttributesRequest(search_attributes=missing, namespace=ns)
        )
    return list(missing)


_TYPES: Final[dict[str, int]] = {key.name: int(key.indexed_value_type) for key in ALL}
_listed: weakref.WeakKeyDictionary[Any, tuple[float, frozenset[str]]] = weakref.WeakKeyDictionary()
START_LISTING_MAX_AGE = 60.0
"""How old a namespace's listing may be when a run's start reads it (seconds): starting many
runs costs one listing a minute, not one per start. An attribute registered since the listing
is upserted by the run instead; one removed since fails the start (as it would fail every
run's upserts)."""


async def known(client: Any, *, max_age: float = 0.0) -> frozenset[str]:
    """The custom search attributes the client's namespace has, relaykit's only where they have
    the type relaykit writes (a mistyped one would fail every upsert and start that sets it, so
    it counts as missing); none when the namespace cannot be listed, e.g. without operator
    permission on a cloud namespace. A listing at most ``max_age`` seconds old is reused."""
    from temporalio.api.operatorservice.v1 import ListSearchAttributesRequest

    now = time.monotonic()
    cached = _listed.get(client)
    if cached is not None and now - cached[0] <= max_age:
        return cached[1]
    try:
        response = await client.operator_service.list_search_attributes(
            ListSearchAttributesRequest(namespace=client.namespace)
        )
    except Exception:  # noqa: BLE001 - e.g. no operator permission on a cloud namespace
        return frozenset()
    names = frozenset(
        name for name, kind in response.custom_attributes.items() if _TYPES.get(name, kind) == kind
    )
    _listed[client] = (now, names)
    return names


async def start_attributes(client: Any, agent: str) -> list[SearchAttributePair[Any]]:
    """:func:`started_pairs` for a run started by this client, for the attributes its namespace
    has (none unless it has all that runs upsert, the rule workers follow)."""
    names = await known(client, max_age=START_LISTING_MAX_AGE)
    if not all(key.name in names for key in UPSERTED):
        return []
    return started_pairs(
        agent,
        now=datetime.now(UTC),
        cost=RELAY_COST_USD.name in names,
        listed=all(key.name in names for key in LIST_ATTRIBUTES),
    )


async def upsert_choices(client: Any, enabled: bool | None = None) -> tuple[bool, bool, bool, bool]:
    """What a worker on the client's namespace lets new runs upsert, from one listing: (its
    search attributes at all, ``RelayCostUSD``, :data:`LIST_ATTRIBUTES`, ``RelayWaitingCalls``).
    ``enabled`` overrides the first (``Worker(search_attributes=...)``); each later one needs the
    first and the namespace to have it. Upserting an unregistered attribute fails every workflow
    task, so workers (and the replay check, which must replay as they would) let runs upsert only
    what the namespace has (``RelayForkOf``, ``RelayTenant`` and ``RelayEvalOf``, set only at a
    start, are not needed for it)."""
    names = await known(client)
    on = all(key.name in names for key in UPSERTED) if enabled is None else enabled
    return (
        on,
        on and RELAY_COST_USD.name in names,
        on and all(key.name in names for key in LIST_ATTRIBUTES),
        on and RELAY_WAITING_CALLS.name in names,
    )


async def eval_registered(client: Any) -> bool:
    """Whether the client's namespace has ``RelayEvalOf`` (added after the others)."""
    return RELAY_EVAL_OF.name in await known(client)
