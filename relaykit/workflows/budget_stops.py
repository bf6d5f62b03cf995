"""Whether a budget let a call go ahead, as the run decided it (docs/budgets.md, "Durable and
replay-safe").

A call's estimate counts the instructions and tool schemas it sends, and those come from
today's definitions: replayed after a deploy that changed them, a call that went ahead could be
stopped, or the reverse, and the run's commands would no longer match its history. So a run
records its decisions. The first follows the prices' local activity, whose result a replay
reads back within the workflow task that asked for it, where the run first ran on in the next:
a marker written there would not be found on replay, so the first decision is recorded by the
local activity too. Each later stop writes a ``relaykit.budget-stop.<n>`` marker, for a run's
first :data:`~relaykit.workflows.budget_plan.STOP_MARKER_BOUND` stops, then the local activity
records every decision. A call that goes ahead writes nothing.

A deploy can also give an agent a model the run did not price when it started. The run prices it
where it first calls it, and records that price as it recorded the others
(:func:`price_new_model`); a replay of the calls made before the deploy must not price it
there, nor fail the run where they went ahead (:func:`unplanned_price`). Workflow code.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import workflow

from relaykit import errors
from relaykit.budget_state import SpendState
from relaykit.models.spec import ModelRequest
from relaykit.workflows import budget_plan as plan
from relaykit.workflows.call_record import recorded

if TYPE_CHECKING:
    from relaykit.workflows.spend import Spend


async def fitted(
    spend: Spend, request: ModelRequest, reserve: float, floor: int
) -> ModelRequest | None:
    """``request`` with the output limit what remains (less ``reserve``) pays for, or ``None``,
    as the run decided it: runs that record their stops replay what they recorded, never
    today's estimate; runs started before estimate."""
    s = spend.state
    assert s is not None
    if not s.recorded_stops:
        return spend.fit(request, spend.available() - reserve, floor)
    just_priced = await price_new_model(spend, request)
    fit = spend.fit(request, spend.available() - reserve, floor)
    stopped, waited = await decide(s, fit is not None, by_activity=just_priced)
    if stopped:
        return None
    if waited:  # what remains now pays for the output, if anything does
        fit = spend.fit(request, spend.available() - reserve, 1) or fit
    # It went ahead: the activity's input is in history, and a replay does not send it.
    return fit if fit is not None else request


async def decide(state: SpendState, fits: bool, by_activity: bool = False) -> tuple[bool, bool]:
    """(stopped, waited): whether the call is stopped (live: it does not fit; on replay: what
    the run recorded), and whether the record waited for a local activity, during which what
    remains may have changed. ``by_activity``: the call follows the price's local activity, and is
    recorded by the local activity as a run's first decision is (the module docstring)."""
    state.decided += 1
    if state.decided > 1 and state.stops < plan.STOP_MARKER_BOUND and not by_activity:
        marker = f"{plan.STOP_MARKER}.{state.decided - 1}"
        if workflow.unsafe.is_replaying():
            stopped = workflow.patched(marker)  # found in history only if it stopped
        else:
            stopped = not fits and workflow.patched(marker)  # writes the marker
        waited = False
    else:
        stopped, waited = await recorded([plan.GO if fits else plan.STOP]) == [plan.STOP], True
    if stopped:
        state.stops += 1
    return stopped, waited


async def price_new_model(spend: Spend, request: ModelRequest) -> bool:
    """Price the call's model where the run first calls it, when the run did not price it at its
    start (a deploy changed an agent's model); whether it did so now.

    Live, a ``relaykit.budget-priced.<n>`` marker says where, and the recording local activity
    holds today's price, which the run plans with from then on (a model without one fails the
    run with ``UnpricedModel``, as at the start). A replay that does not find the marker there
    is replaying a call made before the deploy, with the model the run had priced then: it
    prices nothing (:func:`unplanned_price` estimates that call)."""
    s = spend.state
    assert s is not None
    budget = spend.run.input.budget
    if request.model.label in s.prices or (budget is not None and budget.unpriced == "free"):
        return False
    s.repriced += 1
    if not workflow.patched(f"{plan.PRICED_MARKER}.{s.repriced}"):
        return False
    prices, unpriced, _choices = plan.read_prices(await recorded([plan.priced(request.model)]))
    if unpriced:
        spend.run.fail(
            f"no price is known for {request.model.label}, which a deploy gave this run after "
            "it started: give it one (ModelSpec(price=Price(...))) or count it as free "
            '(Budget(unpriced="free"))',
            errors.UNPRICED_MODEL,
        )
    s.prices.update(prices)
    return True


def unplanned_price(spend: Spend, request: ModelRequest) -> list[float]:
    """The estimate of a call of a model the run did not price.

    Replayed, the calls made before the deploy that changed it went ahead with a model the run
    had priced (else it would have ended): they are estimated at the dearest recorded price,
    which shapes only the request, never sent again on replay. A run of the release before
    :func:`price_new_model` failed where it first called the model live, and a marker says where:
    the replay fails it there too. Runs that do not record their stops fail, as they always did."""
    s = spend.state
    assert s is not None
    budget = spend.run.input.budget
    if budget is not None and budget.unpriced == "free":
        return [0.0, 0.0, 0.0]
    if s.recorded_stops:  # (runs started before fail here on replay too, as they did)
        s.unplanned += 1
        if not workflow.patched(f"{plan.UNPLANNED_MARKER}.{s.unplanned}"):
            return [max((row[i] for row in s.prices.values()), default=0.0) for i in range(3)]
    spend.run.fail(
        f"no price was recorded for {request.model.label} when this run started",
        errors.UNPRICED_MODEL,
    )
