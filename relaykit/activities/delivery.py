"""Delivery of a detached subagent's report over HTTP (its parent may be long gone)."""

from __future__ import annotations

import httpx
from temporalio import activity
from temporalio.exceptions import ApplicationError

from relaykit.runs import DELIVER_ACTIVITY, DeliveryRequest

__all__ = ["DELIVER_ACTIVITY", "DeliveryRequest", "deliver_report"]


@activity.defn(name=DELIVER_ACTIVITY)
async def deliver_report(request: DeliveryRequest) -> None:
    """POST the report as JSON; 4xx answers are final, the rest are retried by Temporal."""
    async with httpx.AsyncClient(timeout=20.0) as http:
        response = await http.post(
            request.url,
            content=request.report.model_dump_json(),
            headers={"content-type": "application/json"},
        )
    if 400 <= response.status_code < 500:
        raise ApplicationError(
            f"report delivery to {request.url} refused: HTTP {response.status_code}",
            non_retryable=True,
        )
    response.raise_for_status()
