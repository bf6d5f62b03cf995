"""Function tools: a typed Python function the model may call, run as its own Temporal activity.

The JSON schema the model sees is derived by pydantic from the function's signature, and the
parameter descriptions from its docstring (Google style ``Args:`` section), so the function stays
the single source of truth.

Invariants:
- Each tool is registered as an activity type named after the tool (``search_web``), so a run's
  history in the Temporal UI reads like the run. Tool names are therefore compatibility data.
- Arguments are validated twice: in workflow code (so bad arguments become an error result without
  scheduling anything) and in the activity (which needs the parsed values).
- An ordinary exception raised by the tool becomes an error tool result the model can react to;
  only :class:`temporalio.exceptions.ApplicationError` (and infrastructure failures such as
  timeouts or a crashed worker) go through Temporal's retries, at most
  ``DEFAULT_TOOL_RETRY.maximum_attempts`` times unless the tool says otherwise; after the last
  attempt the model gets an error result.
- Nothing a tool produces can exceed Temporal's payload limit: results and error texts are cut
  with a marker (:data:`MAX_TOOL_RESULT_BYTES`, :data:`MAX_TOOL_ERROR_BYTES`). An oversized
  payload would fail every attempt *after* the tool ran, repeating its side effects.
- Every tool has a heartbeat timeout by default and heartbeats automatically while it runs, so
  a tool in flight on a worker that dies is noticed after seconds, not after its ``timeout``.
- Every tool declares its effect (``effect="read" | "idempotent" | "write"``, default
  ``"write"``). An attempt of a ``"write"`` tool records that it started (an acknowledged heartbeat
  detail, which Temporal hands to the next attempt) before the function runs; an attempt that
  finds an earlier one started and never finished does not run the function: the call's outcome
  is unknown (:mod:`relaykit.activities.attempts`, :mod:`relaykit.workflows.tool_outcome`).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import inspect
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Literal, get_args, get_type_hints

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, create_model
from pydantic_core import to_json
from temporalio.common import RetryPolicy

from relaykit.errors import ConfigurationError
from relaykit.messages import CompactModel, ToolSpec
from relaykit.names import is_valid_tool_name
from relaykit.schedule_options import check_call_options, duration, retry_policy

DEFAULT_TOOL_TIMEOUT = timedelta(minutes=5)
DEFAULT_MAX_OUTPUT_CHARS = 100_000
TRUNCATION_MARKER = "\n[… output truncated by relaykit: {dropped} characters dropped]"
DEFAULT_TOOL_RETRY = RetryPolicy(
    initial_interval=timedelta(seconds=1),
    backoff_coefficient=2.0,
    maximum_interval=timedelta(seconds=30),
    maximum_attempts=5,
)
"""Temporal's own default retries forever; a tool that keeps failing would stall its run and
repeat its side effects without end. After the last attempt the model gets an error result."""
DEFAULT_TOOL_HEARTBEAT_TIMEOUT = timedelta(seconds=10)
"""How long a tool may go without a heartbeat before Temporal retries it elsewhere. Tools
heartbeat automatically while they run (:mod:`relaykit.activities.heartbeats`), so this only
bounds how long a crashed worker holds a call; pass ``heartbeat_timeout=0`` to turn it off. MCP
tools have the same default."""
ToolEffect = Literal["read", "idempotent", "write"]
"""What running a tool does to the world: ``"read"`` changes nothing, ``"idempotent"`` may change
it but running it again with the same arguments (and :attr:`ToolContext.idempotency_key`) has no
further effect, ``"write"`` (the default) may do it again. Only ``"write"`` tools are never run
again after an attempt whose outcome is unknown."""
OnUnknown = Literal["report", "ask"]
"""What happens to a ``"write"`` call whose outcome is unknown: ``"report"`` gives the model an
error result saying so; ``"ask"`` waits for a person, like an approval, who may run it again."""
TOOL_EFFECTS: tuple[str, ...] = get_args(ToolEffect)
ON_UNKNOWN_CHOICES: tuple[str, ...] = get_args(OnUnknown)
ATTEMPT_CLAIM_KEY = "relaykit.attempt"
"""The key of the heartbeat detail a ``"write"`` tool's attempt records before it runs (always
the last detail, after the tool's own progress): compatibility data, read by the next attempt."""
MAX_TOOL_RESULT_BYTES = 256 * 1024
"""Hard cap on a tool result's encoded size, whatever ``max_output_chars`` says, on a worker
whose data converter has no external payload storage: Temporal refuses payloads over 2 MB (by
default), and a result also travels in the next model request."""
MAX_OFFLOADED_TOOL_RESULT_BYTES = 8 * 1024 * 1024
"""The same cap on a worker with external payload storage (relaykit's workers have it by
default, :mod:`relaykit.storage`): a large result is kept in the store instead of history, so a
raised ``max_output_chars`` is honoured up to this size."""
MAX_TOOL_ERROR_BYTES = 16 * 1024
"""Cap on an error message (and an ``ApplicationError``'s details) a tool produces."""
PAYLOAD_CUT_MARKER = (
    "\n[… cut by relaykit: {dropped} characters dropped to stay under {limit} bytes]"
)


class ToolContext(BaseModel):
    """What a tool may learn about the call it serves. Declare a parameter annotated with
    ``ToolContext`` to receive it; it is not part of the schema the model sees.

    Long tools call :meth:`heartbeat` with their progress: Temporal then notices a dead worker
    after the tool's ``heartbeat_timeout``, and the retry on another worker finds that progress in
    :attr:`progress` and resumes from it instead of starting over.
    """

    model_config = ConfigDict(frozen=True)

    call_id: str
    tool_name: str
    agent: str
    workflow_id: str
    run_path: list[str] = Field(default_factory=list)
    attempt: int = 1
    progress: Any = None
    """What the previous attempt last passed to :meth:`heartbeat` (``None`` on a first attempt)."""
    idempotency_key: str = ""
    """One key per call: the same for every attempt and every replay of this call (and when a
    person approves running it again after an unknown outcome), different for every other call
    (another run, a fork, a later turn, after a continue-as-new). Pass it to APIs that take one
    (``Idempotency-Key`` headers, client request tokens, a unique column): the API then applies
    the call once however often it runs, and the tool may declare ``effect="idempotent"``.
    Empty only for calls recorded before relaykit had keys."""
    _beat: Callable[[Any], None] | None = PrivateAttr(default=None)

    def heartbeat(self, progress: Any = None) -> None:
        """Report liveness and progress; safe to call from sync tools (they run in a thread)."""
        if self._beat is not None:
            self._beat(progress)


class ToolInvocation(CompactModel):
    """The input of a tool activity (persisted: compatibility data)."""

    call_id: str
    arguments: str = "{}"
    agent: str = ""
    workflow_id: str = ""
    """Only in inputs recorded by early versions; the tool reads it from the activity's info."""
    run_path: list[str] = Field(default_factory=list)
    idempotency_key: str = ""
    """Computed in workflow code from recorded data (see :attr:`ToolContext.idempotency_key`)."""
    effect: ToolEffect | None = None
    """The tool's effect as the workflow recorded it when it scheduled the call; ``None`` in
    inputs recorded before tools had effects (their attempts record nothing and always run)."""
    on_unknown: OnUnknown = "report"
    """The call's choice for an unknown outcome, recorded with its effect."""
    rerun_approved: bool = False
    """A person approved running the call again after an attempt whose outcome was unknown."""


class ToolOutcome(CompactModel):
    """The result of a tool activity (persisted: compatibility data)."""

    content: str
    is_error: bool = False


def _docstring_parts(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into its description and the ``Args:`` entries."""
    if not doc:
        return "", {}
    lines = inspect.cleandoc(doc).splitlines()
    description: list[str] = []
    params: dict[str, str] = {}
    current: str | None = None
    in_args = False
    for line in lines:
        stripped = line.strip()
        if re.match(r"^(Args|Arguments|Parameters):\s*$", stripped):
            in_args = True
            continue
        if in_args and re.match(r"^(Returns|Raises|Yields|Examples?|Notes?):\s*$", stripped):
            in_args = False
            current = None
            continue
        if in_args:
            match = re.match(r"^(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$", stripped)
            if match and not line.startswith(" " * 8):
                current = match.group(1)
                params[current] = match.group(3)
            elif current and stripped:
                params[current] += " " + stripped
        elif not params:
            description.append(line)
    return "\n".join(description).strip(), params


@dataclass(eq=False)
class Tool:
    """A function tool. Build it with :func:`tool`; fields are read by the turn loop and worker."""

    name: str
    description: str
    function: Callable[..., Any]
    args_model: type[BaseModel]
    context_param: str | None = None
    timeout: timedelta = DEFAULT_TOOL_TIMEOUT
    """start-to-close timeout of one attempt of the activity."""
    heartbeat_timeout: timedelta | None = None
    """A crashed worker is noticed after this long instead of after ``timeout`` (the tool
    heartbeats automatically while it runs; ``None`` means :data:`DEFAULT_TOOL_HEARTBEAT_TIMEOUT`,
    ``timedelta(0)`` turns heartbeat timeouts off)."""
    retry: RetryPolicy | None = None
    """Temporal retry policy for ``ApplicationError`` and infrastructure failures (default:
    :data:`DEFAULT_TOOL_RETRY`, 5 attempts)."""
    task_queue: str | None = None
    """Run this tool on workers of another task queue (e.g. machines with a browser or a GPU)."""
    needs_approval: bool | Callable[[dict[str, Any]], bool] = False
    """``True``, or a predicate on the parsed arguments, to wait for a person before running."""
    approval_timeout: timedelta | None = None
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS
    effect: ToolEffect = "write"
    """What the tool does to the world (:data:`ToolEffect`); a tool that says nothing is treated
    as one that changes it."""
    on_unknown: OnUnknown = "report"
    """What happens when a ``"write"`` call's outcome is unknown (:data:`OnUnknown`)."""
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_effect(self.effect, self.on_unknown, f"tool {self.name!r}")
        if self.retry is None:
            self.retry = DEFAULT_TOOL_RETRY
        if self.heartbeat_timeout is None:
            self.heartbeat_timeout = DEFAULT_TOOL_HEARTBEAT_TIMEOUT
        check_call_options(self, f"tool {self.name!r}")
        self.retry = retry_policy(self.retry, f"retry of tool {self.name!r}")

    @functools.cached_property
    def spec(self) -> ToolSpec:
        """What the model is told about the tool (built once: it depends only on code)."""
        schema = self.args_model.model_json_schema()
        schema.pop("title", None)
        return ToolSpec(name=self.name, description=self.description, parameters=schema)

    def parse_arguments(self, raw: str) -> BaseModel:
        """Validate the model's raw JSON; raises ``ValueError`` with a message for the model."""
        try:
            return self.args_model.model_validate_json(raw or "{}")
        except ValidationError as exc:
            raise ValueError(_validation_message(self.name, exc)) from None

    def requires_approval(self, arguments: dict[str, Any]) -> bool:
        if callable(self.needs_approval):
            return bool(self.needs_approval(arguments))
        return bool(self.needs_approval)

    async def invoke(
        self,
        invocation: ToolInvocation,
        executor: concurrent.futures.Executor | None = None,
        max_result_bytes: int = MAX_TOOL_RESULT_BYTES,
        context: ToolContext | None = None,
    ) -> ToolOutcome:
        """Run the function for one call: parse the arguments, call it, render and cut what it
        returned.

        A sync function runs on ``executor`` (the worker's bounded tool pool): on the default
        pool, hung tools would starve the file I/O of model calls. ``context`` is what the tool
        receives as its :class:`ToolContext` (the activity builds it, with the attempt's
        heartbeats: :mod:`relaykit.activities.tool_activities`)."""
        try:
            parsed = self.parse_arguments(invocation.arguments)
        except ValueError as exc:
            return ToolOutcome(content=str(exc), is_error=True)
        kwargs = {name: getattr(parsed, name) for name in type(parsed).model_fields}
        if self.context_param:
            kwargs[self.context_param] = context or ToolContext(
                call_id=invocation.call_id,
                tool_name=self.name,
                agent=invocation.agent,
                workflow_id=invocation.workflow_id,
                run_path=invocation.run_path,
                idempotency_key=invocation.idempotency_key,
            )
        if inspect.iscoroutinefunction(self.function):
            value = await self.function(**kwargs)
        else:
            call = functools.partial(contextvars.copy_context().run, self.function, **kwargs)
            value = await asyncio.get_running_loop().run_in_executor(executor, call)
        return ToolOutcome(content=self.truncate(render_tool_output(value), max_result_bytes))

    def truncate(self, text: str, max_bytes: int = MAX_TOOL_RESULT_BYTES) -> str:
        return cut_to_bytes(cap_output(text, self.max_output_chars), max_bytes)


_CAPPED = re.compile(re.escape(TRUNCATION_MARKER).replace(r"\{dropped\}", r"[0-9]+"))


def cap_output(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters with :data:`TRUNCATION_MARKER`, once: by a tool's
    activity (history stays small), then by the tool path for every kind; a text already cut
    at ``limit`` is left as it is, so nothing is cut or marked twice."""
    if len(text) <= limit or _CAPPED.fullmatch(text, limit):
        return text
    return text[:limit] + TRUNCATION_MARKER.format(dropped=len(text) - limit)


def cut_to_bytes(text: str, limit: int) -> str:
    """``text`` cut so that its JSON encoding stays within ``limit`` bytes, with a marker.

    Measured on the encoding because that is what Temporal counts: one character may take up
    to 6 bytes there (``\\u0000`` escapes, 4-byte UTF-8)."""
    size = len(to_json(text))
    if size <= limit:
        return text
    keep = len(text)
    while keep > 0:
        keep = min(keep - 1, int(keep * limit / size * 0.95) - 200)
        keep = max(keep, 0)
        candidate = text[:keep] + PAYLOAD_CUT_MARKER.format(dropped=len(text) - keep, limit=limit)
        size = len(to_json(candidate))
        if size <= limit:
            return candidate
    return PAYLOAD_CUT_MARKER.format(dropped=len(text), limit=limit).lstrip()


def split_claim(details: Any) -> tuple[tuple[Any, ...], dict[str, Any] | None]:
    """Heartbeat details as the tool's own progress and the attempt's start record (the last
    detail, when a ``"write"`` tool's attempt recorded one)."""
    items = tuple(details or ())
    if items and isinstance(items[-1], dict) and ATTEMPT_CLAIM_KEY in items[-1]:
        claim = items[-1][ATTEMPT_CLAIM_KEY]
        return items[:-1], claim if isinstance(claim, dict) else None
    return items, None


def check_effect(effect: Any, on_unknown: Any, what: str) -> None:
    """Refuse effects and unknown-outcome choices that do not exist, when the tool is defined."""
    if effect not in TOOL_EFFECTS:
        raise ConfigurationError(
            f"{what} has effect={effect!r}",
            hint='effect is "read" (changes nothing), "idempotent" (running it again changes '
            'nothing more) or "write" (the default: may do it again)',
        )
    if on_unknown not in ON_UNKNOWN_CHOICES:
        raise ConfigurationError(
            f"{what} has on_unknown={on_unknown!r}",
            hint='on_unknown is "report" (the model reads that the outcome is unknown) or '
            '"ask" (a person decides whether it runs again)',
        )


def _validation_message(tool_name: str, exc: ValidationError) -> str:
    problems = "; ".join(
        f"{'.'.join(str(p) for p in err['loc']) or 'arguments'}: {err['msg']}"
        for err in exc.errors(include_url=False)
    )
    return f"Invalid arguments for tool {tool_name!r}: {problems}. Fix them and call it again."


def render_tool_output(value: Any) -> str:
    """Turn what a tool returned into the text the model reads."""
    if isinstance(value, str):
        return value
    if isinstance(value, BaseModel):
        return value.model_dump_json()
    if value is None:
        return "null"
    try:
        return to_json(value).decode()
    except Exception:  # noqa: BLE001 - anything unserialisable still reaches the model as text
        return str(value)


def _build_args_model(
    fn: Callable[..., Any], name: str, param_docs: dict[str, str]
) -> tuple[type[BaseModel], str | None]:
    signature = inspect.signature(fn)
    try:
        hints = get_type_hints(fn, include_extras=True)  # keep Annotated[..., Field(...)] bounds
    except Exception as exc:
        raise ConfigurationError(
            f"cannot resolve the type hints of tool {name!r}: {exc}",
            hint="define the types the signature uses at module level",
        ) from exc
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for pname, param in signature.parameters.items():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigurationError(
                f"tool {name!r} has *args/**kwargs parameter {pname!r}",
                hint="tools need named, typed parameters so a JSON schema can describe them",
            )
        annotation = hints.get(pname, Any)
        if annotation is ToolContext:
            context_param = pname
            continue
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (annotation, Field(default, description=param_docs.get(pname)))
    model = create_model(f"{name}_arguments", __config__=ConfigDict(extra="forbid"), **fields)
    return model, context_param


def tool(
    function: Callable[..., Any] | None = None,
    *,
    name: str | None = None,
    description: str | None = None,
    timeout: timedelta | float = DEFAULT_TOOL_TIMEOUT,
    heartbeat_timeout: timedelta | float | None = None,
    retry: RetryPolicy | None = None,
    task_queue: str | None = None,
    needs_approval: bool | Callable[[dict[str, Any]], bool] = False,
    approval_timeout: timedelta | float | None = None,
    max_output_chars: int = DEFAULT_MAX_OUTPUT_CHARS,
    effect: ToolEffect = "write",
    on_unknown: OnUnknown = "report",
) -> Any:
    """Turn a typed function (sync or async) into a :class:`Tool`.

    Usable bare (``@tool``) or with options (``@tool(timeout=30, needs_approval=True)``);
    numbers for durations are seconds. ``retry=None`` means :data:`DEFAULT_TOOL_RETRY`;
    ``heartbeat_timeout=None`` means :data:`DEFAULT_TOOL_HEARTBEAT_TIMEOUT` and ``0`` turns the
    heartbeat timeout off (for an async tool that blocks its event loop, which no automatic
    heartbeat can help).

    ``effect`` says what the tool does to the world (:data:`ToolEffect`, default ``"write"``);
    ``on_unknown`` what happens when a ``"write"`` call was lost in flight (:data:`OnUnknown`):
    relaykit never runs such a call again on its own. Both are checked here, when the tool is
    defined.
    """
    label = name or getattr(function, "__name__", None)
    check_effect(effect, on_unknown, f"@tool {label!r}" if label else "@tool(...)")

    def as_delta(value: timedelta | float | None, what: str, **allowed: str) -> timedelta | None:
        return None if value is None else duration(value, what, **allowed)

    def build(fn: Callable[..., Any]) -> Tool:
        if not callable(fn):
            raise ConfigurationError(f"@tool needs a function, got {fn!r}")
        tool_name = name or fn.__name__
        if not is_valid_tool_name(tool_name):
            raise ConfigurationError(
                f"invalid tool name {tool_name!r}",
                hint="tool names are 1-64 characters of A-Z, a-z, 0-9, _ and - (providers "
                "reject others); pass name=... to @tool",
            )
        doc_description, param_docs = _docstring_parts(fn.__doc__)
        args_model, context_param = _build_args_model(fn, tool_name, param_docs)
        of = f"of @tool {tool_name!r}"
        return Tool(
            name=tool_name,
            description=description or doc_description,
            function=fn,
            args_model=args_model,
            context_param=context_param,
            timeout=duration(timeout or DEFAULT_TOOL_TIMEOUT, f"timeout {of}"),  # 0: the default
            heartbeat_timeout=as_delta(heartbeat_timeout, f"heartbeat_timeout {of}", zero="off"),
            retry=retry,
            task_queue=task_queue,
            needs_approval=needs_approval,
            approval_timeout=as_delta(approval_timeout, f"approval_timeout {of}"),
            max_output_chars=max_output_chars,
            effect=effect,
            on_unknown=on_unknown,
        )

    if function is not None:
        return build(function)
    return build


def summarize_call(name: str, arguments: str, limit: int = 80) -> str:
    """``search_web(query=…)`` for activity summaries in the Temporal UI."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        parts = []
        for key, value in parsed.items():
            text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
            if len(text) > 40:
                text = text[:39] + "…"
            parts.append(f"{key}={text}")
        inner = ", ".join(parts)
    else:
        inner = (arguments or "")[:40]
    summary = f"{name}({inner})"
    return summary if len(summary) <= limit else summary[: limit - 2] + "…)"
