"""A refund desk, the agent an evaluation replays (``docs/evals.md``).

``desk`` looks an order up (a ``"read"``) and refunds a duplicate charge (a ``"write"``).
:mod:`examples.refund_desk_v2` is the same desk with changed instructions; run
``python -m examples.evaluate_refund_desk`` to record 20 runs of this one, evaluate the changed
one on them and read the report, offline (an in-memory Temporal server and a scripted model).

With a real model: serve ``relaykit worker examples.refund_desk``, let it handle real work, then
``relaykit eval examples.refund_desk_v2 --query "RelayAgent = 'desk'" --limit 20``.

:func:`scripted_desk` plays the model from the request alone (the instructions it was given and
the tool results so far), so any number of runs may be in flight at once.
"""

from __future__ import annotations

import re

from relaykit import Agent, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text

INSTRUCTIONS = "You run the refund desk. Look the order up; refund a duplicate charge in full."


def order_amount(order: int) -> int:
    """The amount of an order, in EUR (the orders of the example's customers)."""
    return 15 + (order * 37) % 60


def charged_twice(order: int) -> bool:
    return order % 3 != 0


@tool(effect="read")
def lookup_order(order: int) -> str:
    """Look an order up: its amount and how often it was charged."""
    times = "twice" if charged_twice(order) else "once"
    return f"order {order}: {order_amount(order)} EUR, charged {times}"


@tool  # a write: an evaluation never runs it
def refund(order: int, amount: int) -> str:
    """Refund ``amount`` EUR of an order."""
    return f"refunded {amount} EUR on order {order}"


desk = Agent(name="desk", instructions=INSTRUCTIONS, tools=[lookup_order, refund])


def scripted_desk(req: ScriptedRequest) -> Step:
    """The model: looks up, refunds a duplicate charge (up to the limit its instructions name,
    if any), answers."""
    order = int(re.findall(r"\d+", req.last_user_text)[0])
    results = req.tool_results
    if not results:
        return call("lookup_order", order=order)
    amount = int(re.findall(r"(\d+) EUR", results[0])[0])
    limit = re.search(r"at most (\d+) EUR", req.system)
    if len(results) == 1:
        if "charged once" in results[0]:
            return text(f"Order {order} was charged once: nothing to refund.")
        if limit is not None and amount > int(limit.group(1)):
            return text(f"Order {order}: a person will review the refund of {amount} EUR.")
        return call("refund", order=order, amount=amount)
    return text(f"Refunded {amount} EUR for order {order}.")
