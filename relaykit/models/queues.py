"""Provider queues: the task queue each model call runs on, and the limits its workers keep.

A model call is scheduled on a queue of its provider (``<run queue>.model.<provider>``, so
``relaykit.model.openai`` for runs on the default ``relaykit`` queue, or
``ModelSpec.task_queue``), not on the run's own queue. That makes the provider a thing Temporal
can limit: a worker polls each provider queue with at most ``concurrent`` calls in flight (the
worker's ``max_concurrent_activities``), and the server dispatches at most ``per_second`` calls
a second from it across every worker of the cluster (``max_task_queue_activities_per_second``).

Limits come, most specific first, from the worker (``Worker(model_limits=...)``,
``relaykit worker --model-limit openai=8,20/s``), from ``RELAYKIT_MODEL_LIMITS`` (the same
entries separated by ``;``) and from ``ModelSpec.concurrent`` / ``ModelSpec.per_second``. An
entry names a provider (``openai``) or a whole queue name.

Workflow code imports :func:`model_queue`: this module does no I/O.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass

from relaykit.errors import ConfigurationError
from relaykit.models.spec import ModelSpec

LIMITS_ENV = "RELAYKIT_MODEL_LIMITS"


def model_queue(spec: ModelSpec, run_queue: str) -> str:
    """The task queue a call of ``spec`` runs on, for a run on ``run_queue``."""
    return spec.task_queue or f"{run_queue}.model.{spec.provider}"


@dataclass(frozen=True)
class ModelLimit:
    """How many calls of one provider queue run at once on a worker, and how many the server
    dispatches per second across the cluster (``None``: no limit)."""

    concurrent: int | None = None
    per_second: float | None = None

    def over(self, other: ModelLimit) -> ModelLimit:
        """This limit, with what it leaves unset taken from ``other``."""
        return ModelLimit(
            self.concurrent if self.concurrent is not None else other.concurrent,
            self.per_second if self.per_second is not None else other.per_second,
        )

    def __str__(self) -> str:
        parts = [str(self.concurrent) if self.concurrent is not None else ""]
        if self.per_second is not None:
            parts.append(f"{self.per_second:g}/s")
        return ",".join(p for p in parts if p) or "unlimited"


def parse_limit(text: str) -> tuple[str, ModelLimit]:
    """``"openai=8,20/s"``, ``"openai=8"`` or ``"openai=20/s"`` as (key, limit)."""
    key, sep, value = text.partition("=")
    concurrent: int | None = None
    rate: float | None = None
    try:
        if not sep or not key.strip() or not value.strip():
            raise ValueError(text)
        for part in (p.strip() for p in value.split(",")):
            if part.replace(" ", "").endswith("/s") and rate is None:
                rate = float(part.replace(" ", "")[:-2])
            elif part.isdigit() and concurrent is None:
                concurrent = int(part)
            else:
                raise ValueError(part)
    except ValueError:
        raise ConfigurationError(
            f"cannot read the model limit {text!r}",
            hint="write PROVIDER=CONCURRENT[,RATE/s], e.g. openai=8,20/s or anthropic=4",
        ) from None
    if concurrent == 0 or (rate is not None and not (math.isfinite(rate) and rate > 0)):
        raise ConfigurationError(f"a model limit must be above zero: {text!r}")
    return key.strip(), ModelLimit(concurrent, rate)


def parse_limits(entries: Mapping[str, ModelLimit | str] | None) -> dict[str, ModelLimit]:
    """Limits given as ``{"openai": ModelLimit(8, 20)}`` or ``{"openai": "8,20/s"}``."""
    limits: dict[str, ModelLimit] = {}
    for key, value in (entries or {}).items():
        limits[key] = value if isinstance(value, ModelLimit) else parse_limit(f"{key}={value}")[1]
    return limits


def limits_from_env(env: Mapping[str, str] | None = None) -> dict[str, ModelLimit]:
    text = (os.environ if env is None else env).get(LIMITS_ENV, "")
    return dict(parse_limit(entry) for entry in text.split(";") if entry.strip())


def limit_for(
    spec: ModelSpec, queue: str, configured: Mapping[str, ModelLimit], env: Mapping[str, ModelLimit]
) -> ModelLimit:
    """The limit of ``queue``: the worker's, then the environment's, then the spec's."""
    limit = ModelLimit(spec.concurrent, spec.per_second)
    for source in (env, configured):
        for key in (spec.provider, queue):
            if key in source:
                limit = source[key].over(limit)
    return limit
