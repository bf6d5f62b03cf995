"""A run's dollar budget as the run holds it and as its messages carry it: the state carried
across continue-as-new, a child's ask and its parent's answer, a person's change and what they
see (:mod:`relaykit.workflows.spend` decides with them; docs/budgets.md). Compatibility data:
each is in histories, in signals, updates or a continue-as-new input."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field


class BudgetAsk(BaseModel):
    """A child at its reservation asks its parent for more (the ``budget_ask`` signal, by
    workflow id, so it reaches the parent's current run after a continue-as-new;
    compatibility data)."""

    workflow_id: str
    """The child that asks (the key of its reservation in the parent)."""
    seq: int
    """Which of the child's asks this is (the answer names it)."""
    need: float = Field(0.0, ge=0)
    """The least, in USD, that lets the child make its next call."""
    spent: float = 0.0
    """What the child has spent so far (what a person reading the parent's events sees)."""


class SpendState(BaseModel):
    """A run's dollar budget as it stands (``relaykit.workflows.spend``), carried across
    continue-as-new. Spend itself is ``RunState.usage.cost_usd``."""

    limit: float
    """What the run may spend, in USD (raised by a person with ``set_budget``)."""
    finish_reserve: float = 0.0
    """Kept back from ordinary calls for the last call that asks for the best answer so far."""
    prices: dict[str, list[float]] = Field(default_factory=dict)
    """Per model label: USD per million (input, cached input, output) tokens, as the run
    recorded them when it started (a newer price table never changes its plan)."""
    reserved: dict[str, float] = Field(default_factory=dict)
    """Per running child (workflow id): what it was given; returned when it ends."""
    known_input: int = 0
    """Input plus output tokens of the run's last call: the stored prefix the next call sends."""
    phase: Literal["spending", "reached", "finishing", "finished"] = "spending"
    """``reached``: the run waits at its limit (``budget_reached``) for a person; ``finishing``:
    its next call is its last, without tools, paid from the reserve; ``finished``: it was made."""
    changes: list[dict[str, Any]] = Field(default_factory=list)
    """Who changed the limit, when, and to what (the ``set_budget`` updates)."""
    # The tree (a child at its reservation asks its parent): runs that recorded ``grants``.
    grants: bool = False
    """Recorded at the start: this run's children ask it for more at their reservation, and
    it asks its own parent (``RunInput.budget_from``) at its own; ``False`` for runs started
    before, whose children finish (or fail) at their reservation."""
    shares: dict[str, float] = Field(default_factory=dict)
    """Per running child: the share of what remains that its reservation (and each grant) is."""
    asks: dict[str, BudgetAsk] = Field(default_factory=dict)
    """Per child: its ask not answered yet (in the order they came); carried across
    continue-as-new, answered by the run that has the money."""
    asking: int | None = None
    """The number of this run's own ask to its parent while it waits for the answer."""
    asked: int = 0
    """How many asks this run has sent its parent (numbers them)."""
    acknowledged: bool = False
    """The parent has the outstanding ask (it answered ``wait``): no timeout any more."""
    verdict: str | None = None
    """The parent's last answer: ``grant``, ``finish`` or ``fail``."""
    resume_status: str | None = None
    """The status to go back to when the run stops waiting for money."""
    recorded_stops: bool = False
    """Recorded at the start: each call the budget stops is recorded, and a replay follows the
    record, never today's estimate (which a deploy's instructions or tools change); ``False``
    for runs started before."""
    decided: int = 0
    stops: int = 0
    unplanned: int = 0
    repriced: int = 0
    """Calls the budget decided, of those the ones it stopped, estimates asked for a model the
    run did not price at its start, and calls of such a model (they number their records)."""
    paused_for_children: bool = False
    """The run waits at its limit because its children's asks do not fit (not its own call)."""


class BudgetAnswer(BaseModel):
    """A parent's answer to a :class:`BudgetAsk` (the ``budget_answer`` signal; compatibility
    data). ``wait``: the parent has the ask and waits itself (a person, or its own parent);
    ``grant``: ``amount`` more; ``finish`` / ``fail``: nothing more, the child makes its last
    call for the best answer, or fails with ``BudgetExceeded``."""

    seq: int
    verdict: Literal["grant", "wait", "finish", "fail"]
    amount: float = 0.0
    reason: str = ""


class BudgetChange(BaseModel):
    """The argument of the ``set_budget`` update (compatibility data): a new dollar limit
    (``max_usd``) or a raise of it (``raise_by``), or ``finish`` (one last call for the best
    answer so far), and who asked (recorded in the run's history and events)."""

    max_usd: float | None = Field(None, ge=0)
    raise_by: float | None = Field(None, gt=0)
    finish: bool = False
    by: str = Field("", max_length=200)


class BudgetView(BaseModel):
    """A run's dollar budget as a person sees it (the ``set_budget`` update's answer)."""

    limit: float
    spent: float
    reserved: float = 0.0
    phase: str = "spending"
    """``spending``, ``reached`` (waits for a person), ``finishing``, ``finished``, or
    ``waiting_for_parent`` (a child run waits for its parent to grant more)."""
    parent: str | None = None
    """The run a child asks for more at its limit (``waiting_for_parent``: the one it waits for)."""
