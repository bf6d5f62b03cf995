"""A run's place in a shared fleet: its priority and its tenant, as Temporal's own Priority.

``start_run(..., priority=1..5, tenant="acme", tenant_weight=1.0)`` records them in the run's
input and starts the workflow with :class:`temporalio.common.Priority` (``priority_key``,
``fairness_key``, ``fairness_weight``). Temporal's matching service orders backlogged tasks by
them: priority first (1 before 5), then, within a priority, tenants share dispatch in proportion
to their weights (fairness needs it switched on in the server's dynamic config:
``matching.enableFairness``; the embedded dev server does). Activities and child workflows
inherit the workflow's priority, so model calls (on their provider queues, see
:mod:`relaykit.models.queues`), tools, agent tools and subagents take the run's place without
relaykit passing it along; a fork passes it from the origin's recorded input.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from temporalio.common import Priority, SearchAttributePair, TypedSearchAttributes

from relaykit.errors import ConfigurationError
from relaykit.runs import RunInput
from relaykit.search_attributes import (
    RELAY_TENANT,
    START_LISTING_MAX_AGE,
    known,
    start_attributes,
)

if TYPE_CHECKING:
    from temporalio.client import Client


def check(priority: int | None, tenant: str | None, tenant_weight: float | None) -> None:
    """One clear error for a value Temporal would refuse or misread."""
    if priority is not None and (isinstance(priority, bool) or priority not in range(1, 6)):
        raise ConfigurationError(
            f"priority must be 1 (first) to 5 (last), got {priority!r}", hint="3 is the default"
        )
    if tenant is not None and not (
        isinstance(tenant, str) and tenant.strip() and len(tenant.encode()) <= 64
    ):
        raise ConfigurationError(f"tenant must be a non-empty name of at most 64 bytes: {tenant!r}")
    if tenant_weight is not None and not (
        isinstance(tenant_weight, int | float) and 0.001 <= tenant_weight <= 1000
    ):
        raise ConfigurationError(
            f"tenant_weight must be between 0.001 and 1000, got {tenant_weight!r}"
        )


def priority_of(run_input: RunInput) -> Priority | None:
    """The Temporal priority a run with this input starts with (``None``: the default)."""
    if run_input.priority is None and run_input.tenant is None and run_input.tenant_weight is None:
        return None
    return Priority(
        priority_key=run_input.priority,
        fairness_key=run_input.tenant,
        fairness_weight=run_input.tenant_weight,
    )


async def start_options(
    client: Client, run_input: RunInput, *also: SearchAttributePair[Any]
) -> dict[str, Any]:
    """``start_workflow`` options of a run: its priority, and the search attributes it starts
    with (its agent and status, as its first workflow task would write them, and its
    ``RelayTenant``; each only when the namespace has it registered), with ``also``."""
    options: dict[str, Any] = {}
    priority = priority_of(run_input)
    if priority is not None:
        options["priority"] = priority
    pairs = [*await start_attributes(client, run_input.agent), *also]
    if run_input.tenant is not None and await has_attribute(client, RELAY_TENANT.name):
        pairs.append(SearchAttributePair(RELAY_TENANT, run_input.tenant))
    if pairs:
        options["search_attributes"] = TypedSearchAttributes(pairs)
    return options


async def has_attribute(client: Client, name: str) -> bool:
    """Whether the namespace has ``name``, from a listing at most a minute old (no operator
    permission: no, and the attribute is left out)."""
    return name in await known(client, max_age=START_LISTING_MAX_AGE)
