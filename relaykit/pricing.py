"""What a model call costs, in USD.

Prices come from ``genai-prices``, the price table the pydantic project maintains, at the version
pinned in ``pyproject.toml``, and only from the table bundled with that version: relaykit never
starts the library's updater, so a worker never fetches prices from the network and two workers
of one deploy price alike. ``ModelSpec(price=Price(...))`` overrides the table (self-hosted or
contracted prices, models it does not know).

A call is priced once, by the model activity that made it, and the cost is recorded with the
call's result (``ModelResponse.usage.cost_usd`` and ``price_source``): a replay reads it back, so
a newer table never changes what a running run decided. The workflow's dollar budget learns the
prices it plans with the same way, recorded once per run (:mod:`relaykit.workflows.spend`).

Not workflow code: imported by the model activity and the workers, never priced in a workflow.
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime
from decimal import Decimal
from importlib.metadata import version
from typing import Any

from relaykit.messages import Usage
from relaykit.models.spec import ModelSpec, Price

PRICE_TABLE = f"genai-prices {version('genai-prices')}"
"""The ``price_source`` of a call priced from the bundled table."""
OVERRIDE = "override"
"""The ``price_source`` of a call priced from ``ModelSpec.price``."""

_PROVIDER_IDS = {"openai": "openai", "anthropic": "anthropic"}
"""relaykit's providers and the table's ids; a ``local`` model has no price in the table."""


@functools.cache
def _bundled() -> Any:
    """The table shipped with the installed version (never the library's auto-updated one)."""
    from genai_prices import data
    from genai_prices.data_snapshot import DataSnapshot

    return DataSnapshot(providers=data.providers, from_auto_update=False)


@functools.cache
def _lookup(provider: str, name: str) -> tuple[Any, Any] | None:
    provider_id = _PROVIDER_IDS.get(provider)
    if provider_id is None:
        return None
    try:
        found: tuple[Any, Any] = _bundled().find_provider_model(name, None, provider_id, None)
    except LookupError:
        return None
    return found


def _dollars(value: Any, *, worst: bool) -> float | None:
    """A per-million price of the table as a float; a tiered price's highest tier when
    ``worst`` (what a limit must plan for), else its base."""
    if value is None:
        return None
    if isinstance(value, Decimal):
        return float(value)
    tiers = getattr(value, "tiers", None) or []
    if worst and tiers:
        return float(max(tier.price for tier in tiers))
    return float(value.base)


def price_of(spec: ModelSpec, *, at: datetime | None = None) -> tuple[Price | None, str | None]:
    """The price a run plans with for ``spec`` and where it comes from; ``(None, None)`` when
    neither an override nor the table knows the model. Tiered prices count at their highest
    tier, so a plan never undercounts what a call may cost."""
    if spec.price is not None:
        return spec.price, OVERRIDE
    found = _lookup(spec.provider, spec.name)
    if found is None:
        return None, None
    _provider, model = found
    prices = model.get_prices(at or datetime.now(UTC))
    input_price = _dollars(getattr(prices, "input_mtok", None), worst=True)
    output_price = _dollars(getattr(prices, "output_mtok", None), worst=True)
    if input_price is None or output_price is None:
        return None, None
    cached = _dollars(getattr(prices, "cache_read_mtok", None), worst=True)
    return Price(input=input_price, output=output_price, cached_input=cached), PRICE_TABLE


def priced(usage: Usage, spec: ModelSpec) -> tuple[Usage, str | None]:
    """``usage`` of one call of ``spec`` with its cost, and where the price came from. A model
    without a price gets no cost and counts as an unpriced request."""
    label = spec.label
    if spec.price is not None:
        cost = spec.price.cost(usage.input_tokens, usage.output_tokens, usage.cached_input_tokens)
        source: str | None = OVERRIDE
    else:
        cost_or_none = _table_cost(usage, spec)
        if cost_or_none is None:
            return usage.model_copy(update={"unpriced_requests": usage.requests or 1}), None
        cost, source = cost_or_none, PRICE_TABLE
    return usage.model_copy(update={"cost_usd": cost, "by_model": {label: cost}}), source


def _table_cost(usage: Usage, spec: ModelSpec) -> float | None:
    found = _lookup(spec.provider, spec.name)
    if found is None:
        return None
    from genai_prices import types

    provider, model = found
    try:
        calculation = model.calc_price(
            types.Usage(
                input_tokens=usage.input_tokens,
                cache_read_tokens=min(usage.cached_input_tokens, usage.input_tokens),
                output_tokens=usage.output_tokens,
            ),
            provider,
            genai_request_timestamp=datetime.now(UTC),
            auto_update_timestamp=None,
        )
    except (LookupError, ValueError, TypeError):
        return None
    return float(calculation.total_price)


def format_usd(amount: float) -> str:
    """Dollars as people read them: cents for amounts from a dollar up, more digits below."""
    if amount >= 1:
        return f"${amount:,.2f}"
    return f"${amount:.4f}" if amount >= 0.0001 or amount == 0 else f"${amount:.6f}"


def cost_text(usage: Usage) -> str:
    """A usage's cost, saying when some of its calls had no price."""
    if usage.requests and usage.unpriced_requests >= usage.requests:
        return "unknown"
    text = format_usd(usage.cost_usd)
    if usage.unpriced_requests:
        text += f" (+{usage.unpriced_requests} unpriced)"
    return text
