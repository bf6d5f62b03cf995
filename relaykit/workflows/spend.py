"""A run's dollar budget (``Budget(max_usd=...)``): what the run may still *start* (what a call
cost is decided by the model activity that made it, :mod:`relaykit.pricing`). docs/budgets.md
says it for users; the arithmetic and the messages are :mod:`relaykit.workflows.budget_plan`.

- **Prices**, recorded at the run's start (a local activity): a replay plans with those.
- **Each call's worst case** must fit what remains (the limit, less what was spent, what
  children hold and the reserve kept for a last answer); its output is cut to what that pays.
  Whether it fit is recorded (:mod:`relaykit.workflows.budget_stops`).
- **A fan-out** is given a reservation (``Budget.child_share`` of what remains), spent by the
  parent until the child ends; runs that recorded ``GRANTS_CHOICE`` ask and grant in a tree.
- **At the limit**, ``Budget.on_limit``: ``"pause"`` waits in ``budget_reached`` (no timer, no
  activity) for a person (the ``set_budget`` update); ``"finish"`` makes one last call without
  tools, paid from the reserve; ``"fail"`` ends the run with ``BudgetExceeded``.
- **The tree**: a child at its reservation asks its parent, which grants from what it has left
  (the grant counts as reserved by it) or is at its own limit: a child asks its own parent in
  turn, a root applies its ``on_limit`` (``"pause"``: the whole tree waits for a person).
  Asks are answered one at a time, in the order they came, so children asking at once never
  overspend together; a parent that ended or never takes the ask leaves the child its last call.

All of it is ``RunState.spend``, which continue-as-new carries. Runs before
``relaykit.run-setup.v3`` never come here. Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from typing import Any, NoReturn

from temporalio import workflow

from relaykit import errors
from relaykit.agent import Budget
from relaykit.budget_state import BudgetAnswer, BudgetAsk, SpendState
from relaykit.messages import ModelResponse
from relaykit.models.spec import ModelRequest
from relaykit.workflows import budget_plan as plan
from relaykit.workflows import budget_stops
from relaykit.workflows.budget_plan import ASK_TIMEOUT, usd
from relaykit.workflows.call_record import recorded
from relaykit.workflows.run_state import Run


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
        prices, unpriced, choices = plan.read_prices(await recorded(plan.planned_prices(run)))
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
            grants=plan.GRANTS_CHOICE in choices,
            recorded_stops=plan.STOPS_CHOICE in choices,
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
                # Estimated with its reminder where stops are recorded (replays read those).
                estimated = (
                    request.model_copy(update=plan.FINAL_CALL) if s.recorded_stops else request
                )
                fitted = await budget_stops.fitted(self, estimated, 0.0, plan.MIN_FINAL_OUTPUT)
                if fitted is None:
                    return self._fail(request)
                s.phase = "finished"
                return fitted.model_copy(update=plan.FINAL_CALL)
            if s.phase != "reached":  # (waiting at the limit: for a person or children's asks)
                room = self.available() - s.finish_reserve
                fitted = await budget_stops.fitted(self, request, s.finish_reserve, plan.MIN_OUTPUT)
                if fitted is not None:
                    return fitted
                if self.asks_parent():
                    price = self._price(request)
                    need = plan.shortfall(request, price, s.known_input, room)
                    verdict = await self.ask_parent(need)
                    if verdict == "fail":
                        self._fail(request)
                    if verdict != "grant":
                        s.phase = "finishing"
                    continue
            await self._at_limit(request)

    def fit(self, request: ModelRequest, room: float, floor: int) -> ModelRequest | None:
        """``request`` with the output limit ``room`` dollars pay for, or ``None``."""
        s = self.state
        assert s is not None
        price = self._price(request)
        cap = plan.output_cap(request, price, s.known_input, room, floor)
        return None if cap is None else request.model_copy(update={"output_cap": cap})

    def after_call(self, response: ModelResponse) -> None:
        """What the stored prefix now holds, for the next call's estimate."""
        if self.state is not None:
            self.state.known_input = plan.known_prefix(response, self.state.recorded_stops)

    def _price(self, request: ModelRequest) -> list[float]:
        s = self.state
        assert s is not None
        return s.prices.get(request.model.label) or budget_stops.unplanned_price(self, request)

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
        if s.phase != "reached":  # (else children's asks put it there: it waits already)
            self._reach({**data, "then": "pause"})
        s.paused_for_children = False  # its own call waits too
        held = sum(s.reserved.values())
        # A person changes the limit, or a child ends and returns what it held: check again.
        await workflow.wait_condition(
            lambda: s.phase != "reached" or sum(s.reserved.values()) < held
        )
        if s.phase == "reached":
            s.phase = "spending"
        self._resume()

    def _reach(self, data: dict[str, Any]) -> None:
        """Wait at the limit for a person (``budget_reached``)."""
        self.state.phase = "reached"  # type: ignore[union-attr]
        self._hold_status("budget_reached")
        self.run.emit("budget_reached", data)

    def _hold_status(self, status: str) -> None:
        if self.run.state.status not in ("budget_reached", "waiting_parent_budget"):
            self.state.resume_status = self.run.state.status  # type: ignore[union-attr]
        self.run.set_status(status)

    def _resume(self) -> None:
        """Stop waiting for money: the status it had before."""
        run, s = self.run, self.state
        assert s is not None
        previous = s.resume_status or "running"
        s.resume_status = None
        run.set_status(previous)

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
        if s.grants and s.paused_for_children and s.phase != "reached":
            s.paused_for_children = False
            self._resume()
        self.serve_asks()  # (children's asks, which only runs that grant have)

    # --- fan-out: reservations ----------------------------------------------------------------

    def child_budget(self, child: Budget | None, child_id: str, parts: int) -> Budget | None:
        """A child's budget: its own limits, tightened by what this run has left; with a dollar
        limit, a reservation held for it until :meth:`release`."""
        run = self.run
        mine = run.input.budget
        if mine is None:
            return child
        budget = plan.tightened(child, mine, run.state.usage)
        s = self.state
        if s is None:
            return budget
        share = mine.child_share or 1 / (parts + 1)
        reservation = max(self.available() - s.finish_reserve, 0.0) * share
        if child is not None and child.max_usd is not None:
            reservation = min(reservation, child.max_usd)
        s.reserved[child_id] = reservation
        if s.grants:
            s.shares[child_id] = share
        return budget.model_copy(
            update={
                "max_usd": reservation,
                "on_limit": "fail" if mine.on_limit == "fail" else "finish",
                "finish_reserve": mine.finish_reserve,
                "unpriced": mine.unpriced,
                "child_share": mine.child_share,
            }
        )

    def budget_from(self) -> str | None:
        """What a child's ``RunInput.budget_from`` is: this run, when it grants."""
        return workflow.info().workflow_id if self.state and self.state.grants else None

    def release(self, child_id: str) -> None:
        """A child ended: what it held returns (its cost arrives with its usage, in the same
        workflow step)."""
        s = self.state
        if s is not None:
            s.reserved.pop(child_id, None)
            s.shares.pop(child_id, None)
            s.asks.pop(child_id, None)
            self.serve_asks()  # what it returned may pay for another child's ask

    # --- the tree: a child asks, its parent answers ---------------------------------------------

    def asks_parent(self) -> bool:
        return bool(self.state and self.state.grants and self.run.input.budget_from)

    async def ask_parent(self, need: float) -> str:
        """Ask the parent for ``need`` dollars (or more) and wait for its answer: ``grant``
        (the limit is raised already), ``finish`` or ``fail``."""
        run, s = self.run, self.state
        assert s is not None and run.input.budget_from is not None
        seq = s.asking
        if seq is None:
            ask = self._ask(need)
            seq = ask.seq
            await self._send_ask(ask)  # (an ended parent answers at once)
        if s.asking == seq and not s.acknowledged:
            try:
                await workflow.wait_condition(
                    lambda: s.asking != seq or s.acknowledged, timeout=ASK_TIMEOUT
                )
            except TimeoutError:  # the parent never took it: as if it had ended
                self.on_answer(BudgetAnswer(seq=seq, verdict="finish", reason="no answer"))
        await workflow.wait_condition(lambda: s.asking != seq)
        return s.verdict or "finish"

    def _ask(self, need: float) -> BudgetAsk:
        """Open an ask (the run waits for its parent's budget until it is answered)."""
        run, s = self.run, self.state
        assert s is not None
        s.asked += 1
        s.asking, s.acknowledged, s.verdict = s.asked, False, None
        spent = run.state.usage.cost_usd
        self._hold_status("waiting_parent_budget")
        data = {"parent": run.input.budget_from, "need": need, "spent": spent, "limit": s.limit}
        run.emit("budget_asked", data)
        return BudgetAsk(
            workflow_id=workflow.info().workflow_id, seq=s.asked, need=need, spent=spent
        )

    async def _send_ask(self, ask: BudgetAsk) -> None:
        assert self.run.input.budget_from is not None
        gone = await plan.send_ask(self.run.input.budget_from, ask)
        if gone is not None:  # the parent has ended: the last call
            self.on_answer(BudgetAnswer(seq=ask.seq, verdict="finish", reason=gone))

    def on_answer(self, answer: BudgetAnswer) -> None:
        """The parent's answer (signal handler); one to an ask no longer open is ignored."""
        run, s = self.run, self.state
        if s is None or s.asking is None or answer.seq != s.asking:
            return
        if answer.verdict == "wait":
            s.acknowledged = True
            return
        s.asking, s.verdict = None, answer.verdict
        data: dict[str, Any] = {"from": run.input.budget_from, "verdict": answer.verdict}
        if answer.verdict == "grant":
            s.limit += answer.amount
            data |= {"amount": answer.amount, "limit": s.limit}
        elif answer.reason:
            data["reason"] = answer.reason
        run.emit("budget_granted", data)
        self._resume()
        if answer.verdict == "grant":
            self.serve_asks()  # children of this run that asked wait for this
        else:
            self._deny_all(answer.verdict, answer.reason)

    def on_ask(self, ask: BudgetAsk) -> None:
        """A child at its reservation asks (signal handler)."""
        s = self.state
        if s is None or not s.grants or ask.workflow_id not in s.reserved:
            plan.send_answer(self.run, ask.workflow_id, ask.seq, "finish", "no reservation here")
            return
        known = s.asks.get(ask.workflow_id)
        if known is not None and known.seq >= ask.seq:
            return  # a repeat
        s.asks[ask.workflow_id] = ask
        self.serve_asks()
        if ask.workflow_id in s.asks:  # it waits with this run: no timeout for it
            plan.send_answer(self.run, ask.workflow_id, ask.seq, "wait")

    def serve_asks(self) -> None:
        """Answer children's asks from what this run has left, in the order they came; what
        does not fit waits for this run's parent, or a person, or ends the child's spending."""
        run, s = self.run, self.state
        if s is None or not s.asks:
            return
        if s.phase in ("finishing", "finished"):
            self._deny_all(
                (self.run.input.budget or Budget()).on_limit,
                "the parent run is making its last call",
            )
            return
        for child_id, ask in list(s.asks.items()):
            room = self.available() - s.finish_reserve
            grant = plan.grant_for(room, ask.need, s.shares.get(child_id, 0.5))
            if grant is None:
                break  # first come, first served: a later ask does not overtake this one
            s.reserved[child_id] = s.reserved.get(child_id, 0.0) + grant
            del s.asks[child_id]
            run.emit("budget_granted", {"child": child_id, "amount": grant, "verdict": "grant"})
            plan.send_answer(run, child_id, ask.seq, "grant", amount=grant)
        if not s.asks:
            if s.paused_for_children and s.phase == "reached":
                s.phase, s.paused_for_children = "spending", False
                self._resume()
            return
        if self.asks_parent():
            if s.asking is None:  # ask this run's own parent for what its children need
                room = max(self.available() - s.finish_reserve, 0.0)
                need = sum(a.need for a in s.asks.values()) - room
                run.spawn(self._send_ask(self._ask(max(need, 0.0))))
            return
        verdict = (self.run.input.budget or Budget()).on_limit
        if verdict != "pause":
            self._deny_all(verdict, "the parent run is at its own limit")
        elif s.phase != "reached":
            s.paused_for_children = True
            self._reach({"spent": run.state.usage.cost_usd, "limit": s.limit, "then": "pause"})

    def _deny_all(self, verdict: str, reason: str) -> None:
        s = self.state
        assert s is not None
        verdict = "fail" if verdict == "fail" else "finish"
        for child_id, ask in list(s.asks.items()):
            del s.asks[child_id]
            self.run.emit("budget_granted", {"child": child_id, "verdict": verdict})
            plan.send_answer(self.run, child_id, ask.seq, verdict, reason)

    def close(self) -> None:
        """This run ends: children still waiting for an answer make their last call."""
        s = self.state
        if s is not None and s.asks:
            self._deny_all("finish", "the parent run has ended")
