"""How a person reads a dollar budget's events: in `relaykit watch` and the console (one line
each, amounts as dollars) and in `relaykit events` (the data, floats without their last bits)."""

from __future__ import annotations

from typing import Any

from relaykit.cli.runs import _rounded
from relaykit.streaming import StreamEvent
from relaykit.watch import describe


def _line(kind: str, data: dict[str, Any]) -> str:
    return describe(
        StreamEvent(
            seq=1, turn=2, kind=kind, data=data, run_path=["lead"], agent="lead", workflow_id=""
        )
    )


def test_budget_events_read_as_sentences_with_dollar_amounts() -> None:
    grant = {"child": "lead-1/task-2", "amount": 0.0009074999999999997, "verdict": "grant"}
    assert _line("budget_granted", grant) == "granted $0.0009 to child lead-1/task-2"
    assert (
        _line(
            "budget_granted", {"from": "lead-1", "verdict": "grant", "amount": 0.01, "limit": 0.02}
        )
        == "parent lead-1 granted $0.0100"
    )
    assert (
        _line("budget_granted", {"from": "lead-1", "verdict": "finish", "reason": "no answer"})
        == "parent lead-1 answered finish (no answer)"
    )
    reached = _line("budget_reached", {"spent": 0.015, "limit": 0.02, "then": "pause"})
    assert reached.startswith("dollar limit reached: $0.0150 of $0.0200 spent;")
    assert "relaykit budget" in reached
    asked = _line("budget_asked", {"parent": "lead-1", "need": 0.002, "spent": 0.01, "limit": 0.01})
    assert asked == "asks its parent lead-1 for $0.0020 more ($0.0100 of $0.0100 spent)"
    # data a run did not write reads as unknown, not as an error
    assert _line("budget_granted", {"child": "c", "verdict": "grant"}) == "granted ? to child c"


def test_event_data_floats_are_rounded_for_reading_only() -> None:
    data = {
        "child": "c",
        "amount": 0.0009074999999999997,
        "nested": [{"spent": 0.30000000000000004}],
    }
    assert _rounded(data) == {"child": "c", "amount": 0.0009075, "nested": [{"spent": 0.3}]}
    assert data["amount"] == 0.0009074999999999997  # the event itself is unchanged
