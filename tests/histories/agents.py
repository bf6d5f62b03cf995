"""The agents whose runs are recorded in ``tests/histories/*.json``.

``record.py`` runs them to record the histories; ``tests/test_replay.py`` registers the same
agents for the same task queues and replays the histories through today's workflow code. Replay
only needs the agent graph to look the same as when the history was recorded (agent names, tools,
handoffs, approval settings), so change this module only together with a re-recording (see
``docs/replay.md``).
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel

from relaykit import Agent, Handoff, HandoffArgs, HandoffCallbackInput, ModelSpec, Subagents, tool
from relaykit.graph import AgentGraph

MODEL_NAME = "replay-model"
SEARCH_ATTRIBUTES = True
"""Recorded on a relaykit dev server, which registers relaykit's search attributes, so the runs
upserted them; replay must do the same."""


@tool
def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: First number.
        b: Second number.
    """
    return a + b


calculator = Agent(name="calculator", instructions="Add numbers with the add tool.", tools=[add])


@tool
def look_up_invoice(invoice_id: str) -> str:
    """Find an invoice.

    Args:
        invoice_id: The invoice id.
    """
    return f"invoice {invoice_id}: 42 EUR, charged twice"


billing = Agent(
    name="billing",
    description="Invoices, refunds, double charges.",
    instructions="Resolve billing questions.",
    tools=[look_up_invoice],
)
triage = Agent(name="triage", instructions="Route the customer.", handoffs=[billing])


@tool(needs_approval=True)
def refund(order_id: str, amount: int) -> str:
    """Refund an order (a person approves first).

    Args:
        order_id: The order.
        amount: Euros.
    """
    return f"refunded {amount} for {order_id}"


refunder = Agent(name="refunder", instructions="Refund when asked.", tools=[refund])


guard_helper = Agent(name="guard_helper", instructions="Help.")
guarded = Agent(
    name="guarded",
    instructions="Add numbers; cancel tasks when asked.",
    tools=[add],
    subagents=Subagents([guard_helper]),
    max_repeated_calls=1,
)
"""Recorded before the subagent tools got the loop guard: a repeated ``cancel_subagent`` ran,
a repeated ``add`` was refused (so the history holds the ``relaykit-loop-guard`` marker)."""


class Resolution(BaseModel):
    """The structured answer of ``Billing Team`` (recorded with two repairs)."""

    queue: str
    refunded: bool


def audit_handoff(args: HandoffArgs, data: HandoffCallbackInput) -> None:
    """An ``on_handoff`` callback: its activity is named after the handoff tool."""


@tool
def check_account(email: str) -> str:
    """Check an account.

    Args:
        email: The customer's e-mail address.
    """
    return f"{email}: two charges of 42 EUR"


billing_team = Agent(
    name="Billing Team",
    instructions="Resolve billing questions.",
    output_type=Resolution,
)
lovia_triage = Agent(
    name="lovia_triage",
    instructions="Route the customer.",
    tools=[check_account],
    handoffs=[Handoff(billing_team, on_handoff=audit_handoff)],
)
"""Recorded before lovia's semantics (issue 25): the handoff's tool is
``transfer_to_billing_team_40edd973``, a handoff with an extra key is refused, the handoff runs
after the turn's other call, and an invalid structured answer gets two repairs."""


class Total(BaseModel):
    """The structured answer of ``decider`` (recorded with one repair)."""

    total: int


decider = Agent(
    name="decider",
    instructions="Refund and add numbers.",
    tools=[refund, add],
    max_repeated_calls=1,
    output_type=Total,
)
"""Recorded with decisions recorded by the local activity: a refund waits for a person and an
``add`` for that decision, an unknown tool, a repeat the loop guard refuses, an answer the
output type rejects, then one it accepts."""


@dataclass(frozen=True)
class Scenario:
    """One recorded run: its history file, workflow id, task queue and root agent."""

    name: str
    task_queue: str
    agent: Agent
    prompt: str

    @property
    def workflow_id(self) -> str:
        return f"replay-{self.name.replace('_', '-')}"

    @property
    def history_file(self) -> str:
        return f"{self.name}.json"


SCENARIOS = [
    Scenario("tool_loop", "replay-tool-loop", calculator, "What is 2+3, plus 10?"),
    Scenario("handoff", "replay-handoff", triage, "I was charged twice for invoice INV-7."),
    Scenario("approval", "replay-approval", refunder, "Refund 30 EUR on order A1, and 5 on B2."),
    Scenario("boundaries", "replay-boundaries", refunder, "Refund A1 and B2, then C3."),
    Scenario(
        "guard_kinds", "replay-guard-kinds", guarded, "Cancel task-9 twice, add 1 and 1 twice."
    ),
    Scenario("before_lovia", "replay-before-lovia", lovia_triage, "I was charged twice."),
    Scenario("decisions", "replay-decisions", decider, "Refund A1, then add 1 and 1."),
    # Recorded with relaykit.run-setup.v4 (every upsert writes every attribute), then again with
    # v5 (a run started with its attributes; upserts write only what changed).
    Scenario("approval_v4", "replay-approval-v4", refunder, "Refund 30 EUR on A1, and 5 on B2."),
    Scenario("approval_v5", "replay-approval-v5", refunder, "Refund 30 EUR on A1, and 5 on B2."),
    Scenario("approval_v6", "replay-approval-v6", refunder, "Refund 30 EUR on A1, and 5 on B2."),
]


def model(base_url: str | None = None) -> ModelSpec:
    """The model the runs used (its address does not matter to replay)."""
    return ModelSpec(provider="openai", name=MODEL_NAME, base_url=base_url)


def graph_for(scenario: Scenario, base_url: str | None = None) -> AgentGraph:
    graph = AgentGraph.build([scenario.agent], default_model=model(base_url))
    graph.search_attributes = SEARCH_ATTRIBUTES
    return graph
