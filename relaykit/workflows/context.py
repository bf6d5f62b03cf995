"""How the transcript reaches the model activity: the one seam for that choice.

Sending the whole transcript in every model activity input makes history grow quadratically
with the number of turns (each turn re-records everything said before). The default transport,
``stored``, sends a reference to the prefix the previous model call stored in the model workers'
transcript store plus only the newer messages, so the bytes a turn adds stay flat
(:mod:`relaykit.transcripts`). ``inline`` sends everything every time (simple, and what a run
falls back to when a worker cannot find a prefix).

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from relaykit.messages import Message, ModelResponse
from relaykit.models.spec import ModelRequest, ModelSettings
from relaykit.runs import RunState
from relaykit.transcripts import static_digest

TransportName = Literal["stored", "inline"]
MAX_STATIC_REFS = 16


@dataclass
class TranscriptPayload:
    """What one model request carries of the transcript."""

    messages: list[Message]
    base_ref: str | None = None
    base_count: int = 0
    store: bool = False


class ContextTransport:
    """Chooses what of the transcript goes into one model request, and learns from the reply."""

    def __init__(self, name: TransportName = "stored") -> None:
        self.name = name

    def payload(self, state: RunState) -> TranscriptPayload:
        if self.name == "inline" or state.context_ref is None:
            if state.transcript_offset:
                raise LookupError("the transcript's beginning is only in the transcript store")
            return TranscriptPayload(list(state.transcript), store=self.name == "stored")
        start = state.context_ref_count - state.transcript_offset
        return TranscriptPayload(
            list(state.transcript[start:]),
            base_ref=state.context_ref,
            base_count=state.context_ref_count,
            store=True,
        )

    def after_response(self, state: RunState, ref: str | None) -> None:
        """The response (already appended) ends the prefix ``ref`` in the store."""
        if ref is not None:
            state.context_ref = ref
            state.context_ref_count = state.transcript_offset + len(state.transcript)

    def shrink(self, state: RunState, request: ModelRequest) -> ModelRequest:
        """Leave out the request's unchanging part (system prompt, tool schemas, output schema,
        settings) when the model workers already stored it; otherwise ask them to store it."""
        if self.name != "stored":
            return request
        digest = static_digest(request.static_part())
        if digest in state.static_refs:
            return request.model_copy(
                update={
                    "system": "",
                    "tools": [],
                    "output": None,
                    "settings": ModelSettings(),
                    "static_ref": digest,
                }
            )
        return request.model_copy(update={"static_ref": digest, "store_static": True})

    def after_store(self, state: RunState, response: ModelResponse) -> None:
        """Later calls can refer to the static part the model worker says it stored or found.

        The digest comes from the call's recorded result, never from the request this code
        builds: on replay after a deploy, edited instructions or tool schemas give another
        digest, one that was never stored. Results recorded before workers reported it carry
        none; the next call then simply stores its part again."""
        ref = response.static_ref
        if ref and ref not in state.static_refs:
            state.static_refs = [*state.static_refs, ref][-MAX_STATIC_REFS:]

    @staticmethod
    def forget_static(state: RunState) -> None:
        """A model worker could not find a static part: send it again, keep the transcript chain
        (after a continue-as-new its start is only in the store)."""
        state.static_refs = []

    @staticmethod
    def forget(state: RunState) -> None:
        """The transcript was rewritten (handoff filter, compaction) or a worker lacks the
        store: the stored prefix no longer helps, the next request starts a new chain."""
        state.context_ref = None
        state.context_ref_count = 0
        state.static_refs = []
