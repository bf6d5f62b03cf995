"""The model activity: one model call over httpx (on aiohttp's connections, see
:mod:`relaykit.models.http_transport`), with provider errors turned into retry
decisions (see :mod:`relaykit.models.providers`).

One activity type serves every model call (``relaykit.model_call``); its name is compatibility
data. API keys are read here, from the worker's environment, so they never enter history. The
transcript usually arrives as a reference plus the newest messages (see
:mod:`relaykit.transcripts`); it is rebuilt here.
"""

from __future__ import annotations

from typing import Any

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from relaykit._lean import DeferredCAContext
from relaykit.messages import ModelResponse
from relaykit.models.backpressure import ProviderGates, gate_key
from relaykit.models.endpoints import resolve_endpoint
from relaykit.models.http_transport import model_http_client
from relaykit.models.providers import call_model
from relaykit.models.spec import ModelRequest
from relaykit.pricing import priced
from relaykit.runs import MODEL_ACTIVITY
from relaykit.storage import scope_for
from relaykit.streaming import DeltaPublisher, ModelProgress
from relaykit.transcripts import (
    REQUEST_PART_MISSING,
    TRANSCRIPT_MISSING,
    TranscriptNotFound,
    TranscriptStore,
)


class ModelActivities:
    """Holds the HTTP connection pool and transcript store shared by a worker's model calls."""

    def __init__(
        self, http: httpx.AsyncClient | None = None, transcripts: TranscriptStore | None = None
    ) -> None:
        self.http = http or model_http_client(
            timeout=httpx.Timeout(120.0, connect=10.0),
            max_connections=200,
            verify=DeferredCAContext(),  # CAs loaded by the first https call, if any
        )
        self.transcripts = transcripts or TranscriptStore()
        self._statics: dict[str, dict[str, Any]] = {}
        """Request parts by digest, parsed (a turn then skips the store and the parsing)."""
        self.gates = ProviderGates()
        """Per provider endpoint: calls wait while it asked this worker to slow down."""

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _full_request(self, request: ModelRequest, scope: str) -> ModelRequest:
        request = await self._with_static_part(request, scope)
        if request.base_ref is None:
            return request
        try:
            prefix = await self.transcripts.load(scope, request.base_ref)
        except TranscriptNotFound:
            prefix = None
        if prefix is None or len(prefix) != request.base_count:
            raise ApplicationError(
                f"transcript prefix {request.base_ref[:12]!r} is not in this worker's transcript "
                f"store ({self.transcripts.location})",
                type=TRANSCRIPT_MISSING,
                non_retryable=True,
            )
        return request.model_copy(
            update={"messages": [*prefix, *request.messages], "base_ref": None}
        )

    async def _with_static_part(self, request: ModelRequest, scope: str) -> ModelRequest:
        if request.static_ref is None:
            return request
        if request.store_static:
            try:
                await self.transcripts.save_static(scope, request.static_ref, request.static_part())
            except TranscriptNotFound:  # not a digest: send the part, store nothing
                return request.model_copy(update={"static_ref": None, "store_static": False})
            self._remember_statics(
                request.static_ref,
                {
                    "system": request.system,
                    "tools": request.tools,
                    "output": request.output,
                    "settings": request.settings,
                },
            )
            return request
        statics = self._statics.get(request.static_ref)
        if statics is None:
            try:
                part = await self.transcripts.load_static(scope, request.static_ref)
            except TranscriptNotFound:
                raise ApplicationError(
                    f"request part {request.static_ref[:12]!r} is not in this worker's "
                    f"transcript store ({self.transcripts.location})",
                    type=REQUEST_PART_MISSING,
                    non_retryable=True,
                ) from None
            parsed = ModelRequest.model_validate({"model": request.model, **part})
            statics = {
                "system": parsed.system,
                "tools": parsed.tools,
                "output": parsed.output,
                "settings": parsed.settings,
            }
            self._remember_statics(request.static_ref, statics)
        return request.model_copy(update=statics)

    def _remember_statics(self, digest: str, statics: dict[str, Any]) -> None:
        self._statics[digest] = statics
        if len(self._statics) > 256:
            self._statics.pop(next(iter(self._statics)))

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_call(self, request: ModelRequest) -> ModelResponse:
        scope = scope_for(activity.info().workflow_id)
        full = limited(await self._full_request(request, scope))
        try:
            key = gate_key(resolve_endpoint(full.model))
        except ApplicationError:  # a configuration error: call_model raises it
            return await self._call(request, full, scope)
        attempt = activity.info().attempt
        done = await self.gates.wait(
            key,
            full.model.provider,
            lambda why: activity.heartbeat(ModelProgress(attempt=attempt, waiting=why)),
        )
        try:
            response = await self._call(request, full, scope)
        except BaseException as exc:
            done(exc)
            raise
        done(None)
        return response

    async def _call(self, request: ModelRequest, full: ModelRequest, scope: str) -> ModelResponse:
        # Heartbeats let Temporal notice a dead worker long before the call's timeout. A
        # streaming call's heartbeats also carry the text written so far, which clients watching
        # the run read from the server (relaykit.streaming); they never enter history.
        if not full.model.stream:
            response = await call_model(full, http=self.http, heartbeat=activity.heartbeat)
        else:
            publisher = DeltaPublisher(activity.heartbeat, activity.info().attempt)
            try:
                response = await call_model(
                    full, http=self.http, on_delta=publisher.on_delta, heartbeat=publisher.heartbeat
                )
            finally:
                publisher.close()
        # Priced here, once: the cost is recorded with the call, so a replay never prices again.
        response.usage, response.price_source = priced(response.usage, full.model)
        response.static_ref = full.static_ref  # what this call stored or found, for the workflow
        response.routes = routes_called(full, response)
        response.output_checked = full.output is not None
        if request.store_transcript:
            try:
                response.transcript_ref = await self.transcripts.save(
                    scope, request.base_ref, [*request.messages, response.message]
                )
            except Exception:  # noqa: BLE001 - the paid-for answer matters more than the ref
                # Without a new ref the run keeps its previous one and the next request carries
                # the messages since then: more bytes, same transcript.
                activity.logger.warning("could not store the transcript prefix", exc_info=True)
        return response


def limited(request: ModelRequest) -> ModelRequest:
    """The request as a run's dollar budget allows it: its output cut to ``output_cap``, and
    no tools for the last call (these apply after the stored parts are filled in)."""
    update: dict[str, Any] = {}
    settings = request.settings
    if request.output_cap is not None:
        own = settings.max_tokens
        cap = request.output_cap if own is None else min(own, request.output_cap)
        settings = settings.model_copy(update={"max_tokens": cap})
    if request.final_call:
        update["tools"] = []
        settings = settings.model_copy(
            update={
                "tool_choice": None,
                "first_turn_tool_choice": None,
                "parallel_tool_calls": None,
            }
        )
    if settings is not request.settings:
        update["settings"] = settings
    return request.model_copy(update=update) if update else request


def routes_called(request: ModelRequest, response: ModelResponse) -> dict[str, str]:
    """The routes of the tools this response calls, recorded with the call: what a replay
    needs when today's code no longer defines one of them (relaykit.workflows.call_record)."""
    called = {call.name for call in response.message.tool_calls}
    return {
        spec.name: spec.route
        for spec in request.tools
        if spec.route is not None and spec.name in called
    }
