"""The model activity: one model call over httpx, with provider errors turned into retry
decisions (see :mod:`relaykit.models.providers`).

One activity type serves every model call (``relaykit.model_call``); its name is compatibility
data. API keys are read here, from the worker's environment, so they never enter history.
"""

from __future__ import annotations

import httpx
from temporalio import activity

from relaykit.messages import ModelResponse
from relaykit.models.providers import call_model
from relaykit.models.spec import ModelRequest
from relaykit.workflows.loop import MODEL_ACTIVITY


class ModelActivities:
    """Holds the HTTP connection pool shared by every model call of one worker."""

    def __init__(self, http: httpx.AsyncClient | None = None) -> None:
        self.http = http or httpx.AsyncClient(
            timeout=httpx.Timeout(120.0, connect=10.0),
            limits=httpx.Limits(max_connections=200, max_keepalive_connections=50),
        )

    async def aclose(self) -> None:
        await self.http.aclose()

    @activity.defn(name=MODEL_ACTIVITY)
    async def model_call(self, request: ModelRequest) -> ModelResponse:
        # Heartbeats let Temporal notice a dead worker long before the call's timeout.
        return await call_model(request, http=self.http, heartbeat=activity.heartbeat)
