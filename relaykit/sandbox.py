"""The workflow sandbox relaykit workers run in: Temporal's own, with less glue around it.

Temporal's sandboxed runner reaches into each run's sandbox by executing a short piece of source
text with the sandbox's import machinery swapped in: to activate the run, and to learn the
serialization and storage context of every payload sequence a workflow task carries in or out
(each of the SDK's six passes over the payloads asks again). In a busy worker that glue was
about a fifth of its Python CPU (``bench/README.md``, "Worker CPU per turn: third round"):

- ``exec`` of a text compiles it anew every time. The texts are a handful of constants, so this
  runner compiles each once per process and executes the compiled code: the same statements, in
  the same sandbox, with the same restrictions.
- A context lookup reads which command a payload belongs to (an activity's type and id, a
  child's workflow id) from the run's instance, and imports nothing. This runner asks the
  instance directly, without swapping the import machinery in and out around the call. The
  workflow's own code (each activation) still runs only inside the sandbox.

Both override methods of the SDK's private sandbox instance, so they apply only on the SDK
versions they were read against (:data:`VERIFIED_SDK`); on any other, :class:`LeanSandboxRunner`
creates the stock instances, which are slower and otherwise the same.
``tests/test_sandbox.py`` checks that runs behave, and get the same contexts, as in the stock
runner.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from types import CodeType
from typing import Any

import temporalio
from temporalio.worker import WorkflowInstance, WorkflowInstanceDetails
from temporalio.worker.workflow_sandbox import SandboxedWorkflowRunner, SandboxRestrictions

try:  # the SDK's private sandbox instance (see the module docstring)
    from temporalio.worker.workflow_sandbox._runner import _Instance
except ImportError:  # pragma: no cover - an SDK without it: the stock runner
    _Instance = None  # type: ignore[assignment,misc]

PASSTHROUGH = ("relaykit", "httpx")
"""Modules a run's sandbox shares with the worker instead of importing them again per run."""
VERIFIED_SDK = ("1.35.",)
"""The ``temporalio`` versions whose sandbox instance this module was read against."""
_IN_SANDBOX = "__temporal_in_sandbox"
"""Where the SDK keeps a run's in-sandbox instance, in the sandbox's globals."""


@functools.lru_cache(maxsize=64)
def compiled(code: str) -> CodeType:
    """The SDK's glue text, compiled once (the texts are constants; the few that name a
    workflow class are one per class)."""
    return compile(code, "<string>", "exec")


def lean_runner_supported() -> bool:
    return (
        temporalio.__version__.startswith(VERIFIED_SDK)
        and _Instance is not None
        and all(
            callable(getattr(_Instance, name, None))
            for name in ("_run_code", "get_serialization_context", "get_external_store_context")
        )
    )


_SUPPORTED = lean_runner_supported()

if _Instance is not None:

    class _LeanInstance(_Instance):
        def _run_code(self, code: str, **extra_globals: Any) -> None:
            super()._run_code(compiled(code), **extra_globals)  # type: ignore[arg-type]

        def get_serialization_context(self, command_info: Any) -> Any:
            return self._in_sandbox.get_serialization_context(command_info)

        def get_external_store_context(self, command_info: Any) -> Any:
            return self._in_sandbox.get_external_store_context(command_info)

        @property
        def _in_sandbox(self) -> Any:
            return self.globals_and_locals[_IN_SANDBOX]


@dataclass(frozen=True)
class LeanSandboxRunner(SandboxedWorkflowRunner):
    """:class:`~temporalio.worker.workflow_sandbox.SandboxedWorkflowRunner` with less glue
    around each call into a run's sandbox (see the module docstring)."""

    def create_instance(self, det: WorkflowInstanceDetails) -> WorkflowInstance:
        if not _SUPPORTED:  # pragma: no cover - another SDK: the stock instance
            return super().create_instance(det)
        return _LeanInstance(det, self.runner_class, self.restrictions)


def sandbox_runner(*extra_passthrough: str) -> SandboxedWorkflowRunner:
    """The sandboxed runner relaykit workers use: relaykit's own modules passed through, and
    on a verified SDK the lean glue of :class:`LeanSandboxRunner`."""
    return LeanSandboxRunner(
        restrictions=SandboxRestrictions.default.with_passthrough_modules(
            *PASSTHROUGH, *extra_passthrough
        )
    )
