"""A run's dollar budget (``Budget(max_usd=...)``): planned before each call, reserved before each
fan-out, and what happens at the limit.

What a call *cost* is decided by the model activity that made it (:mod:`relaykit.pricing`) and
arrives in the run's usage; this module decides what the run may still *start*:

- **Prices**, once per run: at its first workflow task the run prices the models it can reach
  (its agent, handoff targets, agent tools, subagents) and records them through the
  ``relaykit.record_decisions`` local activity, so a replay plans with the prices the run
  planned with, whatever table today's worker has. A model without a price refuses the start
  (``UnpricedModel``) unless ``Budget(unpriced="free")``.
- **Each call's worst case** must fit what remains (the limit, less what was spent, less what
  children hold, less the reserve kept for a last answer): its known input (the stored prefix
  the last call ended with, ``known_input``, plus what the request sends inline, at two bytes a
  token) at the input price, plus its output limit at the output price. The output limit is
  cut to what the money left pays for (``ModelRequest.output_cap``), so a call never costs
  more than it was allowed.
- **A fan-out** (agent tool, subagent) is given a reservation: ``Budget.child_share`` of what
  remains, by default an equal part among the children that may run at once and the parent.
  The child's own limit is that reservation, and it counts as spent by the parent until the
  child ends; then its real cost replaces it (in the same workflow step), so children running
  at once can never overspend together.
- **At the limit**, ``Budget.on_limit``: ``"pause"`` waits in ``budget_reached`` (no timer, no
  activity: it costs nothing) until a person raises the limit (the ``set_budget`` update) or
  asks for the last answer; ``"finish"`` makes that last call at once: no tools, a reminder to
  answer with what it has, paid from the reserve; ``"fail"`` ends the run with
  ``BudgetExceeded`` naming the spend and the limit. A child at its reservation finishes (or
  fails, when its parent's budget fails).

All of it lives in ``RunState.spend``, which continue-as-new carries. Runs started before
``relaykit.run-setup.v3`` (``RunSetup.dollar_budgets`` off) never come here.

Workflow code: deterministic, no I/O (the prices are recorded by a local activity).
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any, NoReturn

from temporalio import workflow

from relaykit import errors
from relaykit.agent import Agent, AgentTool, Budget, as_handoff
from relaykit.messages import Message
from relaykit.models.spec import ModelRequest
from relaykit.runs import RECORD_DECISIONS_ACTIVITY, SpendState
from relaykit.workflows.run_state import Run

DEFAULT_OUTPUT_ALLOWANCE = 4096
"""The output limit a call plans with when its agent sets no ``max_tokens``."""
MIN_OUTPUT = 256
"""A call that could not write this many tokens (or its own smaller limit) is not started."""
MIN_FINAL_OUTPUT = 32
"""The last answer's floor: below it the run has nothing left to answer with."""
BYTES_PER_TOKEN = 2
"""What the estimate of text not yet counted by a provider assumes (fewer than any tokenizer
of English, so the estimate errs high)."""
FINAL_REMINDER = (
    "The budget for this run is spent. Do not call tools: answer now, as well as you can, with "
    "what you have found so far, and say what is left undone."
)


def usd(amount: float) -> str:
    return f"${amount:.4f}" if amount < 1 else f"${amount:,.2f}"


class Spend:
    """The dollar budget of one run (a no-op for runs without one)."""

    def __init__(self, run: Run) -> None:
        self.run = run

    @property
    def state(self) -> SpendState | None:
        return self.run.state.spend

    # --- the start: prices --------------------------------------------------------------------

    async def start(self) -> None:
        """Record the prices of the models this run can reach (first workflow task of a run
        with a dollar limit); refuse a model without one."""
        run, budget = self.run, self.run.input.budget
        if self.state is not None or budget is None or budget.max_usd is None:
            return
        if not run.setup_flag("dollar_budgets"):
            return
        planned: list[str] = []
        # The table is read-only data: imported (on first use) outside the sandbox, once.
        with workflow.unsafe.imports_passed_through():
            from relaykit.pricing import price_of

            for label, spec in reachable_models(run).items():
                price, _source = price_of(spec, at=workflow.now())
                row = None if price is None else [price.input, price.cached_input, price.output]
                planned.append(json.dumps([label, row]))
        recorded: list[str] = await workflow.execute_local_activity(
            RECORD_DECISIONS_ACTIVITY,
            planned,
            result_type=list[str],
            start_to_close_timeout=timedelta(seconds=10),
        )
        prices: dict[str, list[float]] = {}
        unpriced: list[str] = []
        for code in recorded:
            label, row = json.loads(code)
            if row is None:
                unpriced.append(label)
                row = [0.0, 0.0, 0.0]
            p_in, p_cached, p_out = (float(v) if v is not None else None for v in row)
            assert p_in is not None and p_out is not None
            prices[label] = [p_in, p_in if p_cached is None else p_cached, p_out]
        if unpriced and budget.unpriced != "free":
            run.fail(
                f"this run has a dollar limit ({usd(budget.max_usd)}) but no price is known for "
                f"{', '.join(sorted(unpriced))}: give it one (ModelSpec(price=Price(...))) or "
                'count it as free (Budget(unpriced="free"))',
                errors.UNPRICED_MODEL,
            )
        run.state.spend = SpendState(
            limit=budget.max_usd,
            finish_reserve=budget.max_usd * budget.finish_reserve,
            prices=prices,
        )

    # --- before each call ---------------------------------------------------------------------

    def available(self) -> float:
        """What the run may still commit: the limit less what it spent and what children hold."""
        s = self.state
        assert s is not None
        return s.limit - self.run.state.usage.cost_usd - sum(s.reserved.values())

    async def admit(self, request: ModelRequest) -> ModelRequest:
        """``request`` as it may be sent within the budget (its output limit cut to what the
        money left pays for); at the limit, what ``Budget.on_limit`` says."""
        s = self.state
        if s is None:
            return request
        while True:
            if s.phase == "finishing":  # the last call: no tools, the reserve too
                fitted = self.fit(request, self.available(), MIN_FINAL_OUTPUT)
                if fitted is None:
                    return self._fail(request)
                s.phase = "finished"
                return fitted.model_copy(update={"final_call": True, "reminder": FINAL_REMINDER})
            fitted = self.fit(request, self.available() - s.finish_reserve, MIN_OUTPUT)
            if fitted is not None:
                return fitted
            await self._at_limit(request)

    def fit(self, request: ModelRequest, room: float, floor: int) -> ModelRequest | None:
        """``request`` with the output limit ``room`` dollars pay for, or ``None`` when its
        input and ``floor`` output tokens (or its own smaller limit) do not fit."""
        s = self.state
        assert s is not None
        p_in, _cached, p_out = s.prices.get(request.model.label) or self._unplanned(request)
        input_cost = self.input_tokens(request) * p_in / 1_000_000
        own = request.settings.max_tokens or DEFAULT_OUTPUT_ALLOWANCE
        if p_out > 0:
            affordable = math.floor((room - input_cost) * 1_000_000 / p_out)
        else:
            affordable = own if room >= input_cost else -1
        cap = min(own, affordable)
        if cap < min(floor, own):
            return None
        return request.model_copy(update={"output_cap": cap})

    def input_tokens(self, request: ModelRequest) -> int:
        """The call's known input: the stored prefix's tokens as the last call counted them,
        plus an over-estimate of what it sends inline."""
        s = self.state
        assert s is not None
        size = len(request.system.encode()) + len((request.reminder or "").encode())
        size += sum(_message_bytes(m) for m in request.messages)
        if request.tools:
            size += len(json.dumps([t.model_dump(mode="json") for t in request.tools]))
        known = s.known_input if request.base_ref or request.static_ref else 0
        return known + size // BYTES_PER_TOKEN + 16

    def after_call(self, input_tokens: int, output_tokens: int) -> None:
        """What the stored prefix now holds, for the next call's estimate."""
        if self.state is not None:
            self.state.known_input = input_tokens + output_tokens

    def _unplanned(self, request: ModelRequest) -> list[float]:
        """A model the run did not price at its start (a definition changed since)."""
        budget = self.run.input.budget
        if budget is not None and budget.unpriced == "free":
            return [0.0, 0.0, 0.0]
        self.run.fail(
            f"no price was recorded for {request.model.label} when this run started",
            errors.UNPRICED_MODEL,
        )

    # --- at the limit -------------------------------------------------------------------------

    async def _at_limit(self, request: ModelRequest) -> None:
        run, s = self.run, self.state
        assert s is not None
        budget = run.input.budget or Budget()
        if s.phase == "finished" or budget.on_limit == "fail":
            self._fail(request)
        data = {"spent": run.state.usage.cost_usd, "limit": s.limit}
        if budget.on_limit == "finish":
            s.phase = "finishing"
            run.emit("budget_reached", {**data, "then": "finish"})
            return
        s.phase = "reached"
        previous = run.state.status
        run.set_status("budget_reached")
        run.emit("budget_reached", {**data, "then": "pause"})
        held = sum(s.reserved.values())
        # A person changes the limit, or a child ends and returns what it held: check again.
        await workflow.wait_condition(
            lambda: s.phase != "reached" or sum(s.reserved.values()) < held
        )
        if s.phase == "reached":
            s.phase = "spending"
        run.set_status(previous if previous != "budget_reached" else "running")

    def _fail(self, request: ModelRequest) -> NoReturn:
        s = self.state
        assert s is not None
        spent = self.run.state.usage.cost_usd
        self.run.fail(
            f"dollar budget exceeded: spent {usd(spent)} of the {usd(s.limit)} limit, and the "
            f"next call of {request.model.label} may cost more than what remains",
            errors.BUDGET_EXCEEDED,
        )

    # --- what a person changes (the set_budget update) ----------------------------------------

    def change(self, max_usd: float | None, raise_by: float | None, finish: bool, by: str) -> None:
        run, s = self.run, self.state
        assert s is not None
        previous = s.limit
        if max_usd is not None:
            s.limit = max_usd
        if raise_by is not None:
            s.limit += raise_by
        if s.limit != previous:
            s.finish_reserve = s.limit * (run.input.budget or Budget()).finish_reserve
        change = {"by": by, "limit": s.limit, "previous": previous, "finish": finish}
        s.changes.append({**change, "at": workflow.now().isoformat()})
        if finish:
            s.phase = "finishing"
        elif s.phase in ("reached", "finished"):
            s.phase = "spending"  # the next call is checked against the new limit
        run.emit("budget_changed", change)

    # --- fan-out: reservations ----------------------------------------------------------------

    def child_budget(self, child: Budget | None, child_id: str, parts: int) -> Budget | None:
        """A child's budget: its own limits, tightened by what this run has left; with a dollar
        limit, a reservation held for it until :meth:`release`."""
        run = self.run
        mine = run.input.budget
        if mine is None:
            return child
        used = run.state.usage
        left_tokens = (
            None
            if mine.max_total_tokens is None
            else max(mine.max_total_tokens - used.total_tokens, 0)
        )
        left_requests = (
            None if mine.max_requests is None else max(mine.max_requests - used.requests, 0)
        )
        budget = Budget(
            max_total_tokens=_tighter(child.max_total_tokens if child else None, left_tokens),
            max_requests=_tighter(child.max_requests if child else None, left_requests),
        )
        s = self.state
        if s is None:
            return budget
        share = mine.child_share or 1 / (parts + 1)
        reservation = max(self.available() - s.finish_reserve, 0.0) * share
        if child is not None and child.max_usd is not None:
            reservation = min(reservation, child.max_usd)
        s.reserved[child_id] = reservation
        return budget.model_copy(
            update={
                "max_usd": reservation,
                "on_limit": "fail" if mine.on_limit == "fail" else "finish",
                "finish_reserve": mine.finish_reserve,
                "unpriced": mine.unpriced,
                "child_share": mine.child_share,
            }
        )

    def release(self, child_id: str) -> None:
        """A child ended: what it held returns (its cost arrives with its usage, in the same
        workflow step)."""
        if self.state is not None:
            self.state.reserved.pop(child_id, None)


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


def _message_bytes(message: Message) -> int:
    size = len((message.content or "").encode()) + 8
    for call in message.tool_calls:
        size += len(call.name) + len((call.arguments or "").encode()) + 8
    return size


def reachable_models(run: Run) -> dict[str, Any]:
    """The models of the agents a run can reach from its current agent: handoff targets,
    agent tools and subagents, transitively."""
    graph = run.graph
    models: dict[str, Any] = {}
    seen: set[str] = set()
    todo: list[Agent] = [run.current_agent]
    while todo:
        agent = todo.pop()
        if agent.name in seen:
            continue
        seen.add(agent.name)
        agent = graph.agents.get(agent.name, agent)
        spec = graph.model_for(agent)
        models.setdefault(spec.label, spec)
        todo.extend(as_handoff(entry).target for entry in agent.handoffs)
        todo.extend(t.agent for t in agent.tools if isinstance(t, AgentTool))
        if agent.subagents is not None:
            todo.extend(agent.subagents.agents or [graph.subagent_clone(agent)])
    return models
