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
  ``BudgetExceeded`` naming the spend and the limit.
- **The tree**: a child at its reservation asks its parent (the ``budget_ask`` signal, by
  workflow id; the answer is the ``budget_answer`` signal back). The parent grants from what it
  has left (the child's share of it, at least what the child's next call needs; the grant
  counts as reserved by the parent), or, when that does not fit, it is at its own limit: a
  child asks its own parent in turn, a root applies its ``on_limit`` (``"pause"``: the root
  waits in ``budget_reached`` and its children in ``waiting_parent_budget`` until a person
  raises the root's limit; ``"finish"``/``"fail"``: the child makes its last call, or fails).
  Asks are answered one at a time, in the order they came, inside signal handlers, so children
  asking at once never overspend together. A parent that has ended is told nothing new: the
  child's ask fails to send, or the parent's end answered it, and the child makes its last
  call; a parent that never takes the ask (no ``wait`` within :data:`ASK_TIMEOUT`) does too.

All of it lives in ``RunState.spend``, which continue-as-new carries (with children's asks not
answered yet). Runs started before
``relaykit.run-setup.v3`` (``RunSetup.dollar_budgets`` off) never come here; runs whose start
did not record :data:`GRANTS_CHOICE` (``SpendState.grants`` off) neither ask nor grant.

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
from relaykit.runs import RECORD_DECISIONS_ACTIVITY, BudgetAnswer, BudgetAsk, SpendState
from relaykit.workflows.run_state import Run, signal_workflow

DEFAULT_OUTPUT_ALLOWANCE = 4096
"""The output limit a call plans with when its agent sets no ``max_tokens``."""
MIN_OUTPUT = 256
"""A call that could not write this many tokens (or its own smaller limit) is not started."""
MIN_FINAL_OUTPUT = 32
"""The last answer's floor: below it the run has nothing left to answer with."""
BYTES_PER_TOKEN = 2
"""What the estimate of text not yet counted by a provider assumes (fewer than any tokenizer
of English, so the estimate errs high)."""
ASK_SIGNAL = "budget_ask"
"""Signal a child sends its parent at its reservation (payload :class:`BudgetAsk`)."""
ANSWER_SIGNAL = "budget_answer"
"""Signal a parent sends the child back (payload :class:`BudgetAnswer`)."""
ASK_TIMEOUT = timedelta(minutes=10)
"""How long a child waits for its parent to take an ask (answer, or say ``wait``); after
that it makes its last call, as with a parent that has ended."""
GRANTS_CHOICE = "relaykit.budget-grants"
"""Recorded with the prices at a run's start (the same local activity, no marker of its own):
this run's children ask it, and it asks its parent (``SpendState.grants``)."""
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
        planned.append(json.dumps([GRANTS_CHOICE, None]))
        recorded: list[str] = await workflow.execute_local_activity(
            RECORD_DECISIONS_ACTIVITY,
            planned,
            result_type=list[str],
            start_to_close_timeout=timedelta(seconds=10),
        )
        prices: dict[str, list[float]] = {}
        unpriced: list[str] = []
        grants = False  # runs recorded before the choice
        for code in recorded:
            label, row = json.loads(code)
            if label == GRANTS_CHOICE:
                grants = True
                continue
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
            grants=grants,
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
            if s.phase != "reached":  # (waiting at the limit: for a person or children's asks)
                room = self.available() - s.finish_reserve
                fitted = self.fit(request, room, MIN_OUTPUT)
                if fitted is not None:
                    return fitted
                if self.asks_parent():
                    verdict = await self.ask_parent(self.shortfall(request, room))
                    if verdict == "fail":
                        self._fail(request)
                    if verdict != "grant":
                        s.phase = "finishing"
                    continue
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

    def shortfall(self, request: ModelRequest, room: float) -> float:
        """What ``request`` needs beyond ``room`` to be started (its input and the least
        output a call is started with)."""
        s = self.state
        assert s is not None
        p_in, _cached, p_out = s.prices.get(request.model.label) or self._unplanned(request)
        own = request.settings.max_tokens or DEFAULT_OUTPUT_ALLOWANCE
        cost = (self.input_tokens(request) * p_in + min(MIN_OUTPUT, own) * p_out) / 1_000_000
        return max(cost - room, 0.0)

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
        run, s = self.run, self.state
        assert s is not None
        s.phase = "reached"
        self._hold_status("budget_reached")
        run.emit("budget_reached", data)

    def _hold_status(self, status: str) -> None:
        run, s = self.run, self.state
        assert s is not None
        if run.state.status not in ("budget_reached", "waiting_parent_budget"):
            s.resume_status = run.state.status
        run.set_status(status)

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
        if s.grants:
            if s.paused_for_children and s.phase != "reached":
                s.paused_for_children = False
                self._resume()
            self.serve_asks()

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
        s = self.state
        return workflow.info().workflow_id if s is not None and s.grants else None

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
        s = self.state
        return s is not None and s.grants and self.run.input.budget_from is not None

    async def ask_parent(self, need: float) -> str:
        """Ask the parent for ``need`` dollars (or more) and wait for its answer: ``grant``
        (the limit is raised already), ``finish`` or ``fail``."""
        run, s = self.run, self.state
        assert s is not None and run.input.budget_from is not None
        if s.asking is None:
            await self._send_ask(self._ask(need))
        seq = s.asking
        if seq is not None and not s.acknowledged:
            try:
                await workflow.wait_condition(
                    lambda: s.asking != seq or s.acknowledged, timeout=ASK_TIMEOUT
                )
            except TimeoutError:
                reason = f"the parent run did not take the ask within {ASK_TIMEOUT}"
                self.on_answer(BudgetAnswer(seq=seq, verdict="finish", reason=reason))
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
        run.emit(
            "budget_asked",
            {"parent": run.input.budget_from, "need": need, "spent": spent, "limit": s.limit},
        )
        return BudgetAsk(
            workflow_id=workflow.info().workflow_id, seq=s.asked, need=need, spent=spent
        )

    async def _send_ask(self, ask: BudgetAsk) -> None:
        parent = self.run.input.budget_from
        assert parent is not None
        try:
            await workflow.get_external_workflow_handle(parent).signal(ASK_SIGNAL, ask)
        except Exception as exc:  # noqa: BLE001 - the parent has ended: nothing more to ask
            reason = f"the parent run {parent} cannot be asked: {exc}"
            self.on_answer(BudgetAnswer(seq=ask.seq, verdict="finish", reason=reason))

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
            # not a child holding a reservation here (it ended, or never was): nothing more
            self._answer(ask.workflow_id, ask.seq, "finish", "no reservation of this run")
            return
        known = s.asks.get(ask.workflow_id)
        if known is not None and known.seq >= ask.seq:
            return  # a repeat
        s.asks[ask.workflow_id] = ask
        self.serve_asks()
        if ask.workflow_id in s.asks:  # it waits with this run: no timeout for it
            self._answer(ask.workflow_id, ask.seq, "wait")

    def serve_asks(self) -> None:
        """Answer children's asks from what this run has left, in the order they came; what
        does not fit waits for this run's parent, or a person, or ends the child's spending."""
        run, s = self.run, self.state
        if s is None or not s.asks:
            return
        if s.phase in ("finishing", "finished"):
            self._deny_all(self._limit_verdict(), "the parent run is making its last call")
            return
        for child_id, ask in list(s.asks.items()):
            room = self.available() - s.finish_reserve
            if room < ask.need or room <= 0:
                break  # first come, first served: a later ask does not overtake this one
            grant = min(room, max(ask.need, room * s.shares.get(child_id, 0.5)))
            s.reserved[child_id] = s.reserved.get(child_id, 0.0) + grant
            del s.asks[child_id]
            run.emit("budget_granted", {"child": child_id, "amount": grant, "verdict": "grant"})
            self._answer(child_id, ask.seq, "grant", amount=grant)
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
        verdict = self._limit_verdict()
        if verdict != "pause":
            self._deny_all(verdict, "the parent run is at its own limit")
        elif s.phase != "reached":
            s.paused_for_children = True
            data = {"spent": run.state.usage.cost_usd, "limit": s.limit, "then": "pause"}
            self._reach({**data, "asked_by": list(s.asks)})

    def _limit_verdict(self) -> str:
        budget = self.run.input.budget or Budget()
        return budget.on_limit

    def _deny_all(self, verdict: str, reason: str) -> None:
        s = self.state
        assert s is not None
        verdict = "fail" if verdict == "fail" else "finish"
        for child_id, ask in list(s.asks.items()):
            del s.asks[child_id]
            self.run.emit("budget_granted", {"child": child_id, "verdict": verdict})
            self._answer(child_id, ask.seq, verdict, reason)

    def _answer(
        self, child_id: str, seq: int, verdict: Any, reason: str = "", *, amount: float = 0.0
    ) -> None:
        answer = BudgetAnswer(seq=seq, verdict=verdict, amount=amount, reason=reason)
        self.run.spawn(signal_workflow(child_id, ANSWER_SIGNAL, answer))

    def close(self) -> None:
        """This run ends: children still waiting for an answer make their last call."""
        s = self.state
        if s is not None and s.asks:
            self._deny_all("finish", "the parent run has ended")


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
