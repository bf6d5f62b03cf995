"""Handoffs: a triage agent routes the customer to a billing or a support specialist.

The specialist takes the conversation over inside the same run: it sees everything said so far,
answers with its own instructions and tools, and the run's usage, budget and ``max_turns`` carry
on. Serve the agents and start a run::

    RELAYKIT_MODEL=openai:gpt-4.1-mini relaykit worker examples.triage
    relaykit run triage "I was charged twice" --wait

(``relaykit dev examples.triage`` starts a server and a worker in one command.) The agents have no
model of their own, so the worker's default model serves all three.

The tools answer from a small built-in account so the example works offline; swap them for your
billing and status APIs. :func:`scripted_triage` plays the model for all three agents when no
model is configured (``relaykit dev``, ``relaykit worker``, the tests); it is also a compact
picture of the conversation a real model should have.
"""

from __future__ import annotations

import logging
import re
from typing import Annotated, Literal

from pydantic import Field

from relaykit import Agent, Handoff, HandoffArgs, HandoffCallbackInput, ModelSettings, tool
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text

log = logging.getLogger(__name__)

_INVOICES = {
    "INV-1042": {"amount": "49.00 EUR", "date": "2025-03-02", "status": "paid (charged twice)"},
    "INV-1017": {"amount": "49.00 EUR", "date": "2025-02-02", "status": "paid"},
}
_LATEST_INVOICE = "INV-1042"
_REFUNDS = {"INV-1042": "refund of 49.00 EUR approved on 2025-03-03; arrives in 3-5 business days"}
_SERVICES = {
    "login": "degraded: some sign-ins fail with error 500; a fix is being deployed",
    "api": "operational",
    "dashboard": "operational",
}


# Bounded argument types are part of the tool's JSON schema: a model on a constrained server
# (the bundled one) cannot write a 150-digit invoice number or a service that does not exist.
InvoiceId = Annotated[str, Field(max_length=20)]


def _invoice_key(invoice_id: str) -> str:
    """ "latest", "INV-1042", "inv-1042" and a bare "1042" all name an invoice."""
    key = invoice_id.strip().upper()
    if key == "LATEST":
        return _LATEST_INVOICE
    return f"INV-{key}" if key.isdigit() else key


@tool(effect="read")
def lookup_invoice(invoice_id: InvoiceId) -> str:
    """Look up an invoice of the customer's account.

    Args:
        invoice_id: The invoice number (e.g. "INV-1042"), or "latest" for the most recent one.
    """
    key = _invoice_key(invoice_id)
    invoice = _INVOICES.get(key)
    if invoice is None:
        return f"no invoice {invoice_id} on this account (known: {', '.join(_INVOICES)})"
    return f"{key}: {invoice['amount']} on {invoice['date']}, {invoice['status']}"


@tool(effect="read")
def refund_status(invoice_id: InvoiceId) -> str:
    """Tell whether a refund exists for an invoice, and when it arrives.

    Args:
        invoice_id: The invoice number (e.g. "INV-1042"), or "latest" for the most recent one.
    """
    key = _invoice_key(invoice_id)
    if key not in _INVOICES:
        # An unknown number gets what the account does have: a small model that invented a
        # number can still answer from this, instead of guessing again.
        known = "; ".join(f"{k}: {_REFUNDS.get(k, 'no refund requested')}" for k in _INVOICES)
        return f"no invoice {invoice_id} on this account. Its invoices: {known}"
    return _REFUNDS.get(key, f"no refund requested for {key}")


@tool(effect="read")
def service_status(service: Literal["login", "api", "dashboard"]) -> str:
    """Current status of one part of the product.

    Args:
        service: The part of the product: "login" (signing in), "api" or "dashboard".
    """
    return _SERVICES.get(service.strip().lower(), f"unknown service {service!r}")


def audit_handoff(args: HandoffArgs, data: HandoffCallbackInput) -> None:
    """Runs as an activity when triage hands over to billing (a place for an audit write)."""
    log.info("run %s: %s -> %s (%s)", data.workflow_id, data.source, data.target, args.reason)


billing = Agent(
    name="billing",
    description="Billing: refunds, double charges, invoices and payment methods.",
    instructions=(
        "You are the billing specialist. Look up the invoice the customer means (use 'latest' "
        "when they give no number), check its refund status, and answer in two sentences."
    ),
    tools=[lookup_invoice, refund_status],
    # Bounds that let even the bundled 135M model finish: it answers after two tool turns, and
    # an identical call is never run twice (see docs/local-model.md).
    model_settings=ModelSettings(temperature=0, max_tokens=150),
    answer_after_tool_turns=2,
    max_repeated_calls=1,
)

support = Agent(
    name="support",
    description="Technical support: sign-in problems, errors in the app, outages.",
    instructions=(
        "You are technical support. Check the status of the affected service, then tell the "
        "customer what is going on and what to do, in two sentences."
    ),
    tools=[service_status],
    model_settings=ModelSettings(temperature=0, max_tokens=150),
    answer_after_tool_turns=1,
    max_repeated_calls=1,
)

triage = Agent(
    name="triage",
    instructions=(
        "You are the first contact of a SaaS company. Do not answer the question yourself: hand "
        "the conversation to the specialist that fits, with a short reason."
    ),
    handoffs=[Handoff(target=billing, on_handoff=audit_handoff), support],
    # The first answer must be a handoff: a small model would otherwise answer by itself.
    model_settings=ModelSettings(temperature=0, max_tokens=60, first_turn_tool_choice="required"),
)


_BILLING_WORDS = re.compile(r"charg|refund|invoice|bill|pay", re.IGNORECASE)


def scripted_triage(request: ScriptedRequest) -> Step:
    """A scripted stand-in for the model behind all three agents (which one is asking shows in
    the tools it was given)."""
    results = request.tool_results  # the handoff's own result is the first one
    if "lookup_invoice" in request.tool_names:
        if len(results) == 1:
            return call("lookup_invoice", invoice_id="latest")
        if len(results) == 2:
            invoice_id = results[1].split(":", 1)[0]
            return call("refund_status", invoice_id=invoice_id)
        return text(f"You were charged twice for {results[1]}. Good news: {results[2]}.")
    if "service_status" in request.tool_names:
        if len(results) == 1:
            return call("service_status", service="login")
        return text(f"Sign-in is {results[1]}. Please try again in a few minutes.")
    if _BILLING_WORDS.search(request.last_user_text):
        return call("transfer_to_billing", reason="a billing question")
    return call("transfer_to_support", reason="a technical problem")
