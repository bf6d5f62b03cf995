"""The arithmetic and the messages of dollar budgets (:mod:`relaykit.workflows.spend` owns the
state and decides; this module computes and sends, and writes no part of the run state).

- **Prices**: the models a run can reach, priced once at its start from the worker's table (or
  an override) and recorded; what the recording reads back.
- **A call's worst case**: its known input (the stored prefix the last call ended with, plus
  what the request sends inline, at two bytes a token) at the input price, plus its output
  limit at the output price; what a call needs beyond the money left (a child's ask).
- **The tree's messages**: a child at its reservation asks its parent with the ``budget_ask``
  signal (by workflow id, so the ask reaches the parent's current run after a
  continue-as-new), and the parent answers with ``budget_answer``. A grant is the child's share
  of what the parent has left, at least what the child needs, at most all of it.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import json
import math
from datetime import timedelta
from typing import Any

from temporalio import workflow

from relaykit.agent import Agent, AgentTool, Budget, as_handoff
from relaykit.budget_state import BudgetAnswer, BudgetAsk, BudgetChange
from relaykit.messages import Message, ModelResponse, Usage
from relaykit.models.spec import ModelRequest, ModelSpec
from relaykit.workflows.run_state import Run, signal_workflow

DEFAULT_OUTPUT_ALLOWANCE = 4096
"""The output limit a call plans with when its agent sets no ``max_tokens``."""
MIN_OUTPUT = 256
"""A call that could not write this many tokens (or its own smaller limit) is not started."""
MIN_FINAL_OUTPUT = 32
"""The last answer's floor: below it the run has nothing left to answer with."""
FRAMING_TOKENS = 16
"""What the estimate adds for the framing a provider puts around a request or a message."""
BYTES_PER_TOKEN = 2
"""What the estimate of text not yet counted by a provider assumes (fewer than any tokenizer
of English, so the estimate errs high)."""
FINAL_REMINDER = (
    "The budget for this run is spent. Do not call tools: answer now, as well as you can, with "
    "what you have found so far, and say what is left undone."
)
FINAL_CALL = {"final_call": True, "reminder": FINAL_REMINDER}
"""What makes a request the last call (its estimate counts the reminder)."""
ASK_SIGNAL = "budget_ask"
"""Signal a child sends its parent at its reservation (payload :class:`BudgetAsk`;
compatibility data)."""
ANSWER_SIGNAL = "budget_answer"
"""Signal a parent sends the child back (payload :class:`BudgetAnswer`; compatibility data)."""
ASK_TIMEOUT = timedelta(minutes=10)
"""How long a child waits for its parent to take an ask (answer, or say ``wait``); after that
it makes its last call, as with a parent that has ended."""
GRANTS_CHOICE = "relaykit.budget-grants"
"""Recorded with the prices at a run's start (the same local activity, no marker of its own):
this run's children ask it, and it asks its own parent (``SpendState.grants``); runs recorded
before read it back absent."""

STOPS_CHOICE = "relaykit.budget-stops"
"""Recorded with the prices at a run's start, inside the :data:`GRANTS_CHOICE` entry (whose
value releases before it ignore, where an entry of its own would read as a model without a
price): the run records each call the budget stops (``SpendState.recorded_stops``,
:meth:`relaykit.workflows.spend.Spend.fitted`); runs recorded before read it back absent and
replay their stops from the estimate, as they did."""
STOP_MARKER = "relaykit.budget-stop"
"""``<STOP_MARKER>.<n>``: the patch marker of a stopped call, the run's ``n``-th decided (from
0; one id per decision: the SDK remembers a ``patched`` answer per id)."""
STOP_MARKER_BOUND = 16
"""Stops recorded by a marker; later ones by the recorded decisions' local activity, so that
``TemporalChangeVersion`` (every patch id a run used, in one 2 kB search attribute) stays small."""
PRICED_MARKER = "relaykit.budget-priced"
"""``<PRICED_MARKER>.<n>``: where a run priced a model it had not priced at its start (a deploy
changed an agent's model), the price itself recorded by the local activity that follows; a
replay that does not find it is replaying a call made before the deploy
(:func:`relaykit.workflows.budget_stops.price_new_model`)."""
UNPLANNED_MARKER = "relaykit.budget-unplanned"
"""``<UNPLANNED_MARKER>.<n>``: where a run of the release before :data:`PRICED_MARKER` failed
live on a model it had not priced; read back, never written any more
(:func:`relaykit.workflows.budget_stops.unplanned_price`)."""
STOP, GO = "relaykit.budget.stop", "relaykit.budget.go"
"""What the local activity records for a call past the markers' bound."""

Prices = dict[str, list[float]]


def usd(amount: float) -> str:
    return f"${amount:.4f}" if amount < 1 else f"${amount:,.2f}"


# --- prices ---------------------------------------------------------------------------------------


def planned_prices(run: Run) -> list[str]:
    """What a run records at its start: each model it can reach with its price (``None``: not
    known), and the choices it makes with them (:data:`GRANTS_CHOICE`)."""
    planned = [priced(spec) for spec in reachable_models(run).values()]
    planned.append(json.dumps([GRANTS_CHOICE, [STOPS_CHOICE]]))
    return planned


def priced(spec: ModelSpec) -> str:
    """A model's recorded entry: its label and today's price (``None``: not known)."""
    # The table is read-only data: imported (on first use) outside the sandbox, once.
    with workflow.unsafe.imports_passed_through():
        from relaykit.pricing import price_of

        price, _source = price_of(spec, at=workflow.now())
    row = None if price is None else [price.input, price.cached_input, price.output]
    return json.dumps([spec.label, row])


def read_prices(recorded: list[str]) -> tuple[Prices, list[str], set[str]]:
    """The recorded prices (per label: input, cached input, output), the labels without one
    (priced at zero), and the choices recorded with them (:data:`GRANTS_CHOICE`,
    :data:`STOPS_CHOICE`; runs recorded before a choice lack it)."""
    prices: Prices = {}
    unpriced: list[str] = []
    choices: set[str] = set()
    for code in recorded:
        label, row = json.loads(code)
        if label == GRANTS_CHOICE:
            choices.add(label)
            choices.update(row if isinstance(row, list) and row == [STOPS_CHOICE] else ())
            continue
        if row is None:
            unpriced.append(label)
            row = [0.0, 0.0, 0.0]
        p_in, p_cached, p_out = (float(v) if v is not None else None for v in row)
        assert p_in is not None and p_out is not None
        prices[label] = [p_in, p_in if p_cached is None else p_cached, p_out]
    return prices, unpriced, choices


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


# --- a call's worst case ------------------------------------------------------------------------


def input_tokens(request: ModelRequest, known_input: int) -> int:
    """The call's known input: the stored prefix's tokens as the last call counted them
    (``known_input``), plus an over-estimate of what it sends inline."""
    size = len(request.system.encode()) + len((request.reminder or "").encode())
    size += sum(_message_bytes(m) for m in request.messages)
    if request.tools:
        size += len(json.dumps([t.model_dump(mode="json") for t in request.tools]))
    known = known_input if request.base_ref or request.static_ref else 0
    return known + size // BYTES_PER_TOKEN + FRAMING_TOKENS


def output_cap(
    request: ModelRequest, price: list[float], known_input: int, room: float, floor: int
) -> int | None:
    """The output limit ``room`` dollars pay for, or ``None`` when the call's input and
    ``floor`` output tokens (or its own smaller limit) do not fit."""
    p_in, _cached, p_out = price
    input_cost = input_tokens(request, known_input) * p_in / 1_000_000
    own = request.settings.max_tokens or DEFAULT_OUTPUT_ALLOWANCE
    if p_out > 0:
        affordable = math.floor((room - input_cost) * 1_000_000 / p_out)
    else:
        affordable = own if room >= input_cost else -1
    cap = min(own, affordable)
    return None if cap < min(floor, own) else cap


def shortfall(request: ModelRequest, price: list[float], known_input: int, room: float) -> float:
    """What the call needs beyond ``room`` to be started (its input and the least output a
    call is started with): what a child at its reservation asks its parent for."""
    p_in, _cached, p_out = price
    own = request.settings.max_tokens or DEFAULT_OUTPUT_ALLOWANCE
    tokens = input_tokens(request, known_input)
    cost = (tokens * p_in + min(MIN_OUTPUT, own) * p_out) / 1_000_000
    return max(cost - room, 0.0)


def known_prefix(response: ModelResponse, over: bool) -> int:
    """The tokens of a call's input and answer, as the next call sends them. A provider counts
    an answer's output without the framing it adds around a message sent back (and a stand-in
    may count it as it likes): ``over`` takes the larger of its output tokens and an
    over-estimate by the answer's bytes."""
    answer = response.usage.output_tokens
    if over:
        answer = max(answer, _message_bytes(response.message) // BYTES_PER_TOKEN + FRAMING_TOKENS)
    return response.usage.input_tokens + answer


def _message_bytes(message: Message) -> int:
    size = len((message.content or "").encode()) + 8
    for call in message.tool_calls:
        size += len(call.name) + len((call.arguments or "").encode()) + 8
    return size


def tightened(child: Budget | None, mine: Budget, used: Usage) -> Budget:
    """A child's token and request limits: its own, tightened by what the parent has left."""
    left_tokens = (
        None if mine.max_total_tokens is None else max(mine.max_total_tokens - used.total_tokens, 0)
    )
    left_requests = None if mine.max_requests is None else max(mine.max_requests - used.requests, 0)
    return Budget(
        max_total_tokens=_tighter(child.max_total_tokens if child else None, left_tokens),
        max_requests=_tighter(child.max_requests if child else None, left_requests),
    )


def _tighter(a: int | None, b: int | None) -> int | None:
    return b if a is None else a if b is None else min(a, b)


# --- the tree's messages ----------------------------------------------------------------------


def grant_for(room: float, need: float, share: float) -> float | None:
    """What a parent with ``room`` dollars free grants a child that needs ``need``: its share
    of the room, at least the need; ``None`` when the need does not fit."""
    if room <= 0 or room < need:
        return None
    return min(room, max(need, room * share))


async def send_ask(parent: str, ask: BudgetAsk) -> str | None:
    """Ask ``parent``; why it cannot be asked (it has ended), or ``None`` once it is sent."""
    try:
        await workflow.get_external_workflow_handle(parent).signal(ASK_SIGNAL, ask)
    except Exception as exc:  # noqa: BLE001 - the parent has ended: nothing more to ask
        return f"the parent run {parent} cannot be asked: {exc}"
    return None


def send_answer(
    run: Run, child_id: str, seq: int, verdict: Any, reason: str = "", *, amount: float = 0.0
) -> None:
    """Answer a child's ask ``seq`` (in the background: a signal handler cannot wait)."""
    answer = BudgetAnswer(seq=seq, verdict=verdict, amount=amount, reason=reason)
    run.spawn(signal_workflow(child_id, ANSWER_SIGNAL, answer))


def change_problem(run: Run, change: BudgetChange) -> str | None:
    """Why a person's change of the dollar limit (the ``set_budget`` update) is refused, if it is.

    A child's limit is what its parent holds for it: a raise would be spent past the root's limit
    without the parent knowing, the child never asking for it; so only the root is raised."""
    state, parent = run.state, run.input.budget_from
    if state.status in ("completed", "failed", "cancelled"):
        return f"the run has {state.status}"
    if state.spend is None:
        return "this run has no dollar limit (start it with Budget(max_usd=...))"
    if change.max_usd is None and change.raise_by is None and not change.finish:
        return "say what to change: max_usd, raise_by or finish"
    if change.max_usd is not None and change.raise_by is not None:
        return "give max_usd or raise_by, not both"
    raises = change.raise_by is not None or (
        change.max_usd is not None and change.max_usd > state.spend.limit
    )
    if parent and raises:
        return (
            f"this run's dollar limit is what its parent {parent} reserved for it: raise "
            f"the limit of {parent} instead (or of the root of the tree, if {parent} is a "
            "child too); lowering it or asking for the best answer (finish) is taken"
        )
    return None
