"""What a waiting run holds that a worker can share: payload encoders, sets of given fields.

A worker keeps every cached run's payload converter and models for as long as the run waits
(bench/README.md, issue 34); these tests hold the shared forms to converting and reporting
exactly what the per-run ones did.
"""

from __future__ import annotations

from datetime import UTC, datetime

from temporalio.contrib.pydantic import PydanticPayloadConverter, pydantic_data_converter
from temporalio.converter import DataConverter

from relaykit.codec import compose_data_converter
from relaykit.messages import Message, ModelResponse, ToolCall, Usage
from relaykit.payload_conversion import SharedPydanticPayloadConverter, shared_payload_conversion
from relaykit.runs import RunEvent, RunInput, RunState, share_field_sets


def sample_values() -> list[object]:
    call = ToolCall(id="call-1", name="guarded", arguments='{"x": 1}')
    return [
        RunInput(agent="approver", input="approve", context={"k": [1, 2]}),
        ModelResponse(message=Message(role="assistant", tool_calls=[call]), usage=Usage()),
        "text",
        12,
        None,
    ]


def test_the_shared_converter_converts_as_temporals_pydantic_converter() -> None:
    theirs, ours = PydanticPayloadConverter(), SharedPydanticPayloadConverter()
    values = sample_values()
    payloads = ours.to_payloads(values)
    assert payloads == theirs.to_payloads(values)
    hints = [type(v) if v is not None else None for v in values]
    assert ours.from_payloads(payloads, hints) == theirs.from_payloads(payloads, hints)


def test_each_runs_converter_uses_the_same_encoders() -> None:
    first, second = SharedPydanticPayloadConverter(), SharedPydanticPayloadConverter()
    assert first is not second
    assert list(first.converters) == list(PydanticPayloadConverter().converters)
    for encoding, encoder in first.converters.items():
        assert second.converters[encoding] is encoder


def test_workers_and_clients_get_the_shared_converter_and_keep_a_custom_one() -> None:
    assert (
        shared_payload_conversion(pydantic_data_converter).payload_converter_class
        is SharedPydanticPayloadConverter
    )
    assert compose_data_converter().payload_converter_class is SharedPydanticPayloadConverter

    class Custom(PydanticPayloadConverter):
        pass

    custom = DataConverter(payload_converter_class=Custom)
    assert shared_payload_conversion(custom) is custom
    assert compose_data_converter(custom).payload_converter_class is Custom


def test_models_with_every_field_given_share_one_set_and_still_report_it() -> None:
    raw = pydantic_data_converter.payload_converter.to_payloads(
        [RunInput(agent="a", input="x", state=RunState(agent="a"))]
    )
    first, second = (
        pydantic_data_converter.payload_converter.from_payloads(raw, [RunInput])[0]
        for _ in range(2)
    )
    dumped = first.model_dump(exclude_unset=True)
    share_field_sets(first)
    share_field_sets(second)
    assert first.model_fields_set is second.model_fields_set
    assert first.state is not None and second.state is not None
    assert first.state.model_fields_set is second.state.model_fields_set
    assert first.model_dump(exclude_unset=True) == dumped

    first.max_turns = 3  # assigning still works, and changes only that instance
    assert (first.max_turns, second.max_turns) == (3, 50)
    assert first.model_fields_set == set(RunInput.model_fields)


def test_a_model_with_fields_left_out_keeps_its_own_set() -> None:
    given = RunInput(agent="a")
    share_field_sets(given)
    assert given.model_fields_set == {"agent"}
    assert given.model_dump(exclude_unset=True) == {"agent": "a"}

    event = RunEvent(
        seq=0, kind="message", agent="a", turn=1, run_path=["a"], data={}, at=datetime.now(UTC)
    )
    other = event.model_copy()
    share_field_sets(event)
    share_field_sets(other)
    assert event.model_fields_set is other.model_fields_set
