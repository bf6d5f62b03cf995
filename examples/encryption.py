"""Encryption end to end: a payouts agent whose prompts and tool results hold personal data.

Every relaykit process (workers, commands, the codec server) reads the codec from the
environment, so turning encryption on is three variables::

    export RELAYKIT_CODEC=relaykit.codecs.aes:AesGcmCodec
    export RELAYKIT_CODEC_KEY=$(python -c "import os,base64;print(base64.b64encode(os.urandom(32)).decode())")
    relaykit worker examples.encryption
    relaykit run payouts "Pay Jane Example her refund of 120 EUR" --wait
    relaykit pending RUN_ID; relaykit approve RUN_ID CALL_ID

Workflow inputs and results, activity inputs and results, queries, updates, summaries, failure
messages and the transcript store's files are then AES-256-GCM ciphertext; the Temporal server
and its database never see the name or the IBAN. To read runs in the Temporal UI or with
``temporal workflow show``, run ``relaykit codec-server`` with the same key and point the UI's
codec endpoint (or ``--codec-endpoint``) at it.
"""

from __future__ import annotations

from relaykit import Agent, tool

_ACCOUNTS = {"jane example": ("Jane Example", "DE89 3704 0044 0532 0130 00")}


@tool(effect="read")
def account_details(customer: str) -> str:
    """The payout account of a customer.

    Args:
        customer: The customer's full name.
    """
    found = _ACCOUNTS.get(customer.strip().lower())
    if found is None:
        return f"no account for {customer!r}"
    name, iban = found
    return f"{name}: IBAN {iban}"


@tool(needs_approval=True, effect="write")
def send_payout(iban: str, amount_eur: float) -> str:
    """Send money to an account (a person approves it first).

    Args:
        iban: The receiving IBAN.
        amount_eur: The amount in euros.
    """
    return f"sent {amount_eur:.2f} EUR to {iban}"


payouts = Agent(
    name="payouts",
    instructions="Pay customers their refunds: look up their account, then send the payout.",
    tools=[account_details, send_payout],
)
