"""OpenTelemetry tracing of runs: Temporal's tracing interceptor plus GenAI attributes.

Off by default; ``Worker(..., tracing=True)`` (or ``RELAYKIT_TRACING=1`` in the worker's
environment) turns it on. Spans go to the global tracer provider unless a ``tracer`` is given, so
configure the OpenTelemetry SDK (exporter, resource) the usual way before starting the worker.

What is traced:

- workflow side (:class:`temporalio.contrib.opentelemetry.TracingInterceptor`): ``RunWorkflow``,
  ``StartActivity``, ``StartChildWorkflow``, ``HandleSignal``/``HandleUpdate`` and
  ``CompleteWorkflow`` spans. Workflow spans have no duration (a span kept open across workflow
  tasks would not survive a replay) and are never created while replaying history, so a worker
  that restarts and replays a run does not send its spans again.
- activity side: one ``RunActivity`` span per attempt, with the GenAI semantic-convention
  attributes this module adds: ``gen_ai.operation.name`` (``chat`` / ``execute_tool``),
  ``gen_ai.provider.name``, ``gen_ai.request.model``, ``gen_ai.response.model``,
  ``gen_ai.usage.input_tokens``, ``gen_ai.usage.output_tokens``,
  ``gen_ai.response.finish_reasons``, ``gen_ai.tool.name``, ``gen_ai.tool.call.id``, plus
  ``relaykit.agent``.

One trace per run needs a parent span from the client that starts the run:
``relaykit.connect(..., tracing=True)`` adds the same interceptor to the client (its
``StartWorkflow`` span becomes the root). Runs started elsewhere (``temporal workflow start``, a
client without tracing) still get spans, one small trace per workflow step.

This module imports OpenTelemetry lazily: relaykit works without it until tracing is enabled.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Collection, Sequence
from typing import Any

from temporalio.worker import (
    ActivityInboundInterceptor,
    ExecuteActivityInput,
    Interceptor,
)

from relaykit.errors import ConfigurationError

TRACING_ENV = "RELAYKIT_TRACING"
_TRUE = frozenset({"1", "true", "yes", "on"})


def tracing_enabled(setting: bool | None = None) -> bool:
    """``setting`` when given, else whether ``RELAYKIT_TRACING`` is set to a true value."""
    if setting is not None:
        return setting
    return os.environ.get(TRACING_ENV, "").strip().lower() in _TRUE


def _require_opentelemetry() -> None:
    try:
        import opentelemetry.trace  # noqa: F401
        from temporalio.contrib.opentelemetry import TracingInterceptor  # noqa: F401
    except ImportError as exc:  # pragma: no cover - depends on the installation
        raise ConfigurationError(
            f"tracing needs OpenTelemetry ({exc})",
            hint="pip install 'relaykit[tracing]' (opentelemetry-sdk)",
        ) from None


def temporal_interceptor(tracer: Any = None) -> Any:
    """Temporal's tracing interceptor, configured the way relaykit uses it.

    Workflow spans are created even when no client span started the run (a run started from the
    ``temporal`` CLI is traced too).
    """
    _require_opentelemetry()
    from temporalio.contrib.opentelemetry import TracingInterceptor

    return TracingInterceptor(tracer, always_create_workflow_spans=True)


def has_tracing_interceptor(interceptors: Sequence[Any]) -> bool:
    # No interceptor of Temporal's can exist before its module is imported; importing it to
    # find out would load OpenTelemetry (about 1 MB) into every worker that does not trace.
    if "temporalio.contrib.opentelemetry" not in sys.modules:
        return False
    try:
        from temporalio.contrib.opentelemetry import TracingInterceptor
    except ImportError:  # pragma: no cover
        return False
    return any(isinstance(i, TracingInterceptor) for i in interceptors)


class GenAIAttributes(Interceptor):
    """Adds GenAI semantic-convention attributes to the span of model and tool activities.

    Must come after the tracing interceptor (it writes on the span that one opened).
    """

    def __init__(self, tool_names: Collection[str]) -> None:
        self.tool_names = frozenset(tool_names)

    def intercept_activity(self, next: ActivityInboundInterceptor) -> ActivityInboundInterceptor:
        return _GenAIActivityInbound(next, self.tool_names)


class _GenAIActivityInbound(ActivityInboundInterceptor):
    def __init__(self, next: ActivityInboundInterceptor, tool_names: frozenset[str]) -> None:
        super().__init__(next)
        self.tool_names = tool_names

    async def execute_activity(self, input: ExecuteActivityInput) -> Any:
        from opentelemetry import trace
        from temporalio import activity

        from relaykit.runs import MODEL_ACTIVITY

        span = trace.get_current_span()
        if not span.is_recording():
            return await super().execute_activity(input)
        name = activity.info().activity_type
        argument = input.args[0] if input.args else None
        if name == MODEL_ACTIVITY:
            _model_request_attributes(span, argument)
            result = await super().execute_activity(input)
            _model_response_attributes(span, result)
            return result
        if name in self.tool_names:
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", name)
            call_id = getattr(argument, "call_id", None)
            if call_id:
                span.set_attribute("gen_ai.tool.call.id", call_id)
            agent = getattr(argument, "agent", None)
            if agent:
                span.set_attribute("relaykit.agent", agent)
        return await super().execute_activity(input)


def _model_request_attributes(span: Any, request: Any) -> None:
    span.set_attribute("gen_ai.operation.name", "chat")
    model = getattr(request, "model", None)
    if model is None:
        return
    span.set_attribute("gen_ai.provider.name", model.provider)
    span.set_attribute("gen_ai.request.model", model.name)
    settings = getattr(request, "settings", None)
    if settings is not None:
        if settings.temperature is not None:
            span.set_attribute("gen_ai.request.temperature", settings.temperature)
        if settings.max_tokens is not None:
            span.set_attribute("gen_ai.request.max_tokens", settings.max_tokens)


def _model_response_attributes(span: Any, response: Any) -> None:
    usage = getattr(response, "usage", None)
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", usage.input_tokens)
        span.set_attribute("gen_ai.usage.output_tokens", usage.output_tokens)
    model = getattr(response, "model", None)
    if model:
        span.set_attribute("gen_ai.response.model", model)
    finish = getattr(response, "finish_reason", None)
    if finish:
        span.set_attribute("gen_ai.response.finish_reasons", [finish])
    message = getattr(response, "message", None)
    agent = getattr(message, "agent", None)
    if agent:
        span.set_attribute("relaykit.agent", agent)


def worker_interceptors(
    client_interceptors: Sequence[Any], tool_names: Collection[str], tracer: Any = None
) -> list[Any]:
    """The interceptors a tracing worker adds to its own (the client's tracing interceptor, if
    it has one, already applies to the worker and must not be added twice)."""
    added: list[Any] = []
    if not has_tracing_interceptor(client_interceptors):
        added.append(temporal_interceptor(tracer))
    added.append(GenAIAttributes(tool_names))
    return added
