"""What a fuzzed run is made of, drawn from its seed, and the scripted model that plays it.

A seed fixes the agent graph (which features the worker's agents get), the model's plan (which
tool each turn calls), the model's delays, whether the run continues as new, and the operator's
actions with the moments they happen at. The same seed draws the same run.

The model is stateless: it reads the turn it is at from the request itself. Every answer of the
top-level conversation carries ``#T<k>`` in its text, so the next request's highest mark is the
turn just finished. A steered-away or retried call therefore gets the same answer again, a fork
at turn N goes on with turn N+1 of the same plan, and a summary (which echoes the marks and
every steer and send it read) keeps the count across compaction. Children (agent tools,
subagents) are told apart by their task, which starts with ``CHILD-``.

What was added after the first seeds were chosen (the ``budget`` feature, the budget actions,
how each approval is answered) is drawn from a second stream of the seed
(:func:`draw_fleet`), so an older seed still draws the same graph, steps and actions and
only gains the new parts.
"""

from __future__ import annotations

import dataclasses
import json
import random
import re
from dataclasses import dataclass, field
from typing import Any

from relaykit.context_policy import SUMMARY_INSTRUCTIONS
from relaykit.testing.scripted_server import (
    Responder,
    ScriptedRequest,
    Step,
    batch,
    call,
    text,
)

FEATURES = ("handoff", "agent_tool", "subagents", "mcp", "summarize")
BASE_STEPS = ("lookup", "charge", "work", "note", "pair", "audit")
FEATURE_STEPS = {
    "handoff": ("handoff",),
    "agent_tool": ("ask",),
    "subagents": ("spawn", "wait"),
    "mcp": ("mcp",),
    "summarize": (),
}
ACTION_WEIGHTS = {
    "steer": 3.0,
    "send": 2.0,
    "pause": 1.5,
    "kill": 2.0,
    "deploy": 1.0,
    "fork": 2.0,
}
CANCEL_CHANCE = 0.12

BUDGET_CHANCE = 0.4
"""Share of seeds whose run has a dollar limit (``Budget.max_usd``)."""
BUDGET_ACTION_WEIGHTS = {"raise": 2.0, "set": 1.0, "finish": 1.5, "budget_cancel": 0.5}
"""Operator actions on a run's dollar limit (``RunHandle.set_budget``), drawn only with the
``budget`` feature: raise it, set it (sometimes below what was spent), ask for the best answer
so far, or cancel the run at its limit (``relaykit budget --cancel``)."""
APPROVAL_MODES = {"update": 3.0, "signal": 2.0, "bulk": 1.5, "race": 1.5}
"""How an approval is answered: the ``approve`` update, ``approve(wait=False)`` (a signal),
``bulk_approvals.answer_waiting`` for the run, or two answers at once (update and signal, or two
signals, contradicting each other sometimes) of which only the first may stand."""
LATE_ANSWER_CHANCE = 0.3
"""How often an answered call is answered again later (it must be refused, with a type)."""

TURN_MARK = re.compile(r"#T(\d+)\b")
OPERATOR_MARK = re.compile(r"\b(?:STEER|SEND|FORK)-[0-9a-f]{8}\b")
TASK_PREFIX = "TASK "
CHILD_PREFIX = "CHILD-"


@dataclass(frozen=True)
class Action:
    """One operator action or fault, fired once the run's model has had ``at`` requests."""

    kind: str
    at: int
    wait: float
    """Seconds after the trigger (so that it lands at any point of a call)."""
    knob: float
    """A second draw for the action's own choice (how long a pause or an outage lasts, which
    turn a fork starts from, whether a deploy is rolling)."""


@dataclass(frozen=True)
class Plan:
    seed: int
    features: tuple[str, ...]
    steps: tuple[str, ...]
    delays: tuple[float, ...]
    continue_as_new_after_turns: int | None
    actions: tuple[Action, ...]
    approve_chance: float
    approve_seconds: tuple[float, float]
    tag: str = field(default="")
    max_usd: float | None = None
    """The run's dollar limit with the ``budget`` feature (USD; a call costs about $0.001)."""
    on_limit: str = "pause"
    approval_modes: dict[str, float] = field(default_factory=dict)
    late_answer_chance: float = 0.0

    def describe(self) -> str:
        acts = " ".join(f"{a.kind}@{a.at}" for a in self.actions)
        return (
            f"seed {self.seed}: features [{','.join(self.features)}], "
            f"steps [{','.join(self.steps)}], can={self.continue_as_new_after_turns}, "
            f"actions [{acts}]"
            + (f", max_usd={self.max_usd} on_limit={self.on_limit}" if self.max_usd else "")
        )


def draw(seed: int) -> Plan:
    rng = random.Random(seed)
    features = tuple(f for f in FEATURES if rng.random() < 0.5)
    kinds = [*BASE_STEPS, *(k for f in features for k in FEATURE_STEPS[f])]
    steps = [rng.choice(kinds) for _ in range(rng.randint(4, 8))]
    for feature in features:  # each drawn feature is used at least once, most of the time
        for kind in FEATURE_STEPS[feature]:
            if kind not in steps and rng.random() < 0.85:
                steps.insert(rng.randrange(len(steps) + 1), kind)
    delays = tuple(round(rng.uniform(0.1, 1.2), 2) for _ in range(len(steps) + 40))
    can = rng.choice((None, None, 2, 3))
    names = list(ACTION_WEIGHTS)
    weights = list(ACTION_WEIGHTS.values())
    actions = [
        Action(
            kind=rng.choices(names, weights)[0],
            at=rng.randint(1, len(steps) + 3),
            wait=round(rng.uniform(0.0, 1.2), 2),
            knob=rng.random(),
        )
        for _ in range(rng.randint(3, 7))
    ]
    actions.sort(key=lambda a: a.at)
    if rng.random() < CANCEL_CHANCE:
        last = actions[-1].at if actions else 1
        actions.append(Action("cancel", last + rng.randint(0, 2), round(rng.uniform(0, 1), 2), 0))
    plan = Plan(
        seed=seed,
        features=features,
        steps=tuple(steps),
        delays=delays,
        continue_as_new_after_turns=can,
        actions=tuple(actions),
        approve_chance=rng.choice((0.6, 0.8, 1.0)),
        approve_seconds=(0.1, rng.choice((0.5, 1.5, 3.0))),
        tag=f"s{seed}",
    )
    return draw_fleet(plan)


def draw_fleet(plan: Plan) -> Plan:
    """The parts drawn from the seed's second stream: a dollar limit and what happens at it,
    budget actions among the others, and how approvals are answered."""
    rng = random.Random(plan.seed * 104_729 + 17)
    modes = {"approval_modes": APPROVAL_MODES, "late_answer_chance": LATE_ANSWER_CHANCE}
    if rng.random() >= BUDGET_CHANCE:
        return dataclasses.replace(plan, **modes)  # type: ignore[arg-type]
    steps = len(plan.steps)
    names = list(BUDGET_ACTION_WEIGHTS)
    weights = list(BUDGET_ACTION_WEIGHTS.values())
    extra = [
        Action(
            kind=rng.choices(names, weights)[0],
            at=rng.randint(2, steps + 3),
            wait=round(rng.uniform(0.0, 1.2), 2),
            knob=rng.random(),
        )
        for _ in range(rng.randint(1, 3))
    ]
    cancel = [a for a in plan.actions if a.kind == "cancel"]  # a cancel stays the last action
    actions = sorted([*(a for a in plan.actions if a.kind != "cancel"), *extra], key=lambda a: a.at)
    return dataclasses.replace(
        plan,
        features=(*plan.features, "budget"),
        actions=(*actions, *cancel),
        max_usd=round(rng.uniform(0.0015, 0.008), 4),
        on_limit=rng.choices(("pause", "finish", "fail"), (3.0, 1.5, 1.0))[0],
        **modes,  # type: ignore[arg-type]
    )


# --- reading requests ---------------------------------------------------------------------------


def content_text(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return ""


def conversation(req: ScriptedRequest) -> list[dict[str, Any]]:
    """The request's messages without the system prompt."""
    return [m for m in req.messages if m.get("role") not in ("system", "developer")]


def is_summary(req: ScriptedRequest) -> bool:
    return SUMMARY_INSTRUCTIONS in req.system


def first_text(req: ScriptedRequest) -> str:
    msgs = conversation(req)
    return content_text(msgs[0]) if msgs else ""


def is_top_level(req: ScriptedRequest) -> bool:
    return not is_summary(req) and first_text(req).startswith(TASK_PREFIX)


def last_turn(messages: list[dict[str, Any]]) -> int:
    marks = [int(n) for m in messages for n in TURN_MARK.findall(content_text(m))]
    return max(marks, default=0)


def turn_of(req: ScriptedRequest) -> int:
    """The turn this request asks for (1 + the highest mark it carries)."""
    return last_turn(conversation(req)) + 1


def whole_text(req: ScriptedRequest) -> str:
    return "\n".join(content_text(m) for m in conversation(req))


# --- the model ----------------------------------------------------------------------------------


def _turn_step(kind: str, k: int, names: list[str], ref: str, delay: float) -> Step:
    def offered(name: str) -> bool:
        return name in names

    if kind == "lookup" and offered("lookup"):
        return call("lookup", query=ref)
    if kind == "charge" and offered("charge"):
        return call("charge", amount=k, ref=ref)
    if kind == "work" and offered("work"):
        return call("work", ref=ref, seconds=round(delay * 2, 2))
    if kind == "pair" and offered("lookup") and offered("charge"):
        return batch(call("lookup", query=ref), call("charge", amount=k, ref=ref))
    if kind == "audit" and offered("audit"):
        return call("audit", ref=ref)
    if kind == "handoff":
        targets = [n for n in names if n.startswith("transfer_to_")]
        if targets:
            return call(targets[0], reason=ref)
    if kind == "ask" and offered("ask_chaos_helper"):
        return call("ask_chaos_helper", input=f"{CHILD_PREFIX}{ref}")
    if kind == "spawn" and offered("spawn_subagent"):
        return call("spawn_subagent", prompt=f"{CHILD_PREFIX}{ref}")
    if kind == "wait" and offered("wait_subagents"):
        return call("wait_subagents", timeout_seconds=3)
    if kind == "mcp":  # on even turns a write (no hints), which must start once
        if k % 2 == 0 and offered("docs_slow_write"):
            return call("docs_slow_write", seconds=round(0.5 + delay, 2), ref=ref)
        slow = [n for n in names if n.startswith("docs") and n.endswith("slow")]
        if slow:
            return call(slow[0], seconds=round(0.5 + delay, 2))
    return call("note", text=ref)


def model_for(plan: Plan) -> Responder:
    def answer(req: ScriptedRequest) -> Step:
        msgs = conversation(req)
        delay = plan.delays[min(len(msgs), len(plan.delays) - 1)]
        if is_summary(req):
            said = req.last_user_text
            marks = " ".join(OPERATOR_MARK.findall(said))
            return text(f"Summary through #T{last_turn(msgs)}. {marks}".strip(), delay=delay)
        first = content_text(msgs[0]) if msgs else ""
        if first.startswith(CHILD_PREFIX):
            if any(m.get("role") == "assistant" for m in msgs):
                return text(f"report on {first}", delay=0.2)
            return call("note", text=first, delay=0.2)
        k = last_turn(msgs) + 1
        usage = (len(json.dumps(msgs)) // 4, 5)
        delay = plan.delays[min(k, len(plan.delays) - 1)]
        if k > len(plan.steps):
            return text(f"#T{k} all done for {plan.tag}", usage=usage, delay=delay)
        step = _turn_step(plan.steps[k - 1], k, req.tool_names, f"{plan.tag}-{k}", delay)
        return dataclasses.replace(step, text=f"#T{k}", usage=usage, delay=delay)

    return answer
