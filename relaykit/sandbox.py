"""The workflow sandbox relaykit workers run in: Temporal's own, with its glue compiled once.

Temporal's sandboxed runner reaches into each run's sandbox by executing a short piece of source
text: to activate the run, and to learn the serialization context of every payload sequence a
workflow task carries in or out (each of the SDK's six passes over the payloads asks again).
``exec`` of a text compiles it anew every time, and in a busy worker that compilation was about
a seventh of all its Python CPU (``bench/README.md``, "Worker CPU per turn: third round"). The
texts are a handful of constants, so this runner compiles each once per process and executes
the compiled code: the same statements, in the same sandbox, with the same restrictions.

It overrides one method of the SDK's private sandbox instance. Should a later SDK no longer have
it, :func:`compiled_runner_supported` says so and :func:`sandbox_runner` falls back to the
stock runner (``tests/test_sandbox.py`` fails first, so an upgrade notices).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import CodeType
from typing import Any

from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

try:  # the SDK's private sandbox instance (see the module docstring)
    from temporalio.worker.workflow_sandbox._runner import _Instance
except ImportError:  # pragma: no cover - an SDK without it: the stock runner
    _Instance = None  # type: ignore[assignment,misc]

PASSTHROUGH = ("relaykit", "httpx")
"""Modules a run's sandbox shares with the worker instead of importing them again per run."""


@functools.lru_cache(maxsize=64)
def compiled(code: str) -> CodeType:
    """The SDK's glue text, compiled once (the texts are constants; the few that name a
    workflow class are one per class)."""
    return compile(code, "<string>", "exec")


def compiled_runner_supported() -> bool:
    return _Instance is not None and callable(getattr(_Instance, "_run_code", None))


if compiled_runner_supported():

    class _CompiledInstance(_Instance):
        def _run_code(self, code: str, **extra_globals: Any) -> None:
            super()._run_code(compiled(code), **extra_globals)  # type: ignore[arg-type]


@dataclass(frozen=True)
class CompiledSandboxRunner(SandboxedWorkflowRunner):
    """:class:`~temporalio.worker.workflow_sandbox.SandboxedWorkflowRunner`, whose runs execute
    the SDK's glue from code compiled once per process (see the module docstring)."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        return _CompiledInstance(det, self.runner_class, self.restrictions)


def sandbox_runner(*extra_passthrough: str) -> SandboxedWorkflowRunner:
    """The sandboxed runner relaykit workers use: relaykit's own modules passed through, the
    SDK's glue compiled once."""
    restrictions = SandboxRestrictions.default.with_passthrough_modules(
        *PASSTHROUGH, *extra_passthrough
    )
    if not compiled_runner_supported():  # pragma: no cover - see the module docstring
        return SandboxedWorkflowRunner(restrictions=restrictions)
    return CompiledSandboxRunner(restrictions=restrictions)
