"""The ``relaykit`` command line.

Every command talks to Temporal through Temporal's own environment configuration
(``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, profiles), so existing setups just work. Bad input
(an unknown agent, module or run, an unreachable server) gives one clear line on stderr and a
non-zero exit status, never a traceback.
"""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
import time
from collections.abc import Callable, Coroutine
from contextlib import nullcontext
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowExecutionStatus,
    WorkflowQueryFailedError,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from relaykit.client import (
    DEFAULT_TASK_QUEUE,
    RunHandle,
    connect,
    get_run,
    start_run,
    task_queue_has_worker,
)
from relaykit.errors import RelaykitError, RunFailed
from relaykit.operate_cli import register as register_operate_commands
from relaykit.runs import RunResult
from relaykit.worker import DEFAULT_GRACEFUL_SHUTDOWN, DEFAULT_STICKY_TIMEOUT, DEFAULT_TOOL_THREADS

app = typer.Typer(
    name="relaykit",
    help="Durable multi-agent LLM runs on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help layout: typer's rich panels show every boolean flag as `--wait <bool>`.
    rich_markup_mode=None,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

T = TypeVar("T")

AddressOpt = Annotated[
    str | None,
    typer.Option(
        "--address", help="Temporal frontend (default: TEMPORAL_ADDRESS or localhost:7233)"
    ),
]
NamespaceOpt = Annotated[str | None, typer.Option("--namespace", help="Temporal namespace")]
TaskQueueOpt = Annotated[str, typer.Option("--task-queue", "-q", help="Task queue of the worker")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON instead of text")]
RunIdArg = Annotated[str, typer.Argument(help="Workflow id of the run")]
ToolThreadsOpt = Annotated[
    int, typer.Option("--tool-threads", min=1, help="Threads of the worker's pool for sync tools")
]
MaxActivitiesOpt = Annotated[
    int | None,
    typer.Option(
        "--max-concurrent-activities",
        min=1,
        help="Model and tool calls run at once (default: Temporal's)",
    ),
]
StickyOpt = Annotated[
    float,
    typer.Option(
        "--sticky-timeout",
        min=0.1,
        help=(
            "Seconds a run's next step waits for the worker that has it cached "
            "before another may take it"
        ),
    ),
]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--graceful-shutdown",
        min=0,
        help=(
            "On SIGTERM/Ctrl-C, seconds calls in flight may take to finish "
            "before they are cancelled"
        ),
    ),
]


def worker_options(
    tool_threads: int, max_concurrent_activities: int | None, sticky_timeout: float, grace: float
) -> dict[str, Any]:
    """The ``relaykit.Worker`` keywords the ``worker`` and ``dev`` commands share."""
    from datetime import timedelta

    return {
        "tool_threads": tool_threads,
        "max_concurrent_activities": max_concurrent_activities,
        "sticky_queue_schedule_to_start_timeout": timedelta(seconds=sticky_timeout),
        "graceful_shutdown_timeout": timedelta(seconds=grace),
    }


def _stop_message(grace: float) -> Callable[[Any], None]:
    """What the worker says on SIGTERM/SIGINT; a second signal leaves at once."""
    signals: list[Any] = []

    def on_signal(signum: Any) -> None:
        signals.append(signum)
        if len(signals) == 1:
            err_console.print(
                f"stopping: no new work; calls in flight get up to {grace:g} s to finish "
                "(signal again to stop now)"
            )
            return
        err_console.print("stopping now")
        sys.stderr.flush()
        os._exit(130)

    return on_signal


def _version(value: bool) -> None:
    if value:
        from relaykit import __version__

        print(f"relaykit {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", callback=_version, is_eager=True, help="Print relaykit's version and exit"
        ),
    ] = False,
) -> None:
    """Durable multi-agent LLM runs on Temporal."""


def _fail(message: str, code: int = 1) -> None:
    err_console.print(f"[red]error:[/red] {message}", highlight=False)
    raise typer.Exit(code)


def command(fn: Callable[..., Coroutine[Any, Any, T]]) -> Callable[..., T | None]:
    """Run an async command and turn relaykit/Temporal errors into one clear line."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T | None:
        try:
            return asyncio.run(fn(*args, **kwargs))
        except RunFailed as exc:
            _fail(f"run failed ({exc.type or 'error'}): {exc.message}")
        except RelaykitError as exc:
            _fail(str(exc))
        except WorkflowUpdateFailedError as exc:  # e.g. an unknown or already answered call id
            _fail(str(getattr(exc.cause, "message", exc.cause)))
        except WorkflowQueryFailedError as exc:  # a worker that could not answer a query
            _fail(
                f"the run's worker could not answer: {(str(exc).strip().splitlines() or [''])[0]}"
            )
        except RPCError as exc:
            _fail(f"Temporal: {exc.message}")
        except KeyError as exc:  # Temporal's error for a payload encoding no codec here reads
            from relaykit.codec import describe_decode_error

            unreadable = describe_decode_error(exc)
            if unreadable is None:
                raise
            _fail(str(unreadable))
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        except UnicodeEncodeError:  # an argument with bytes that are not UTF-8
            _fail("an argument is not valid UTF-8 (hint: pass text in UTF-8)")
        return None

    return wrapper


def _text_arg(value: str | None, what: str) -> str | None:
    """Arguments arrive decoded with surrogate escapes; bytes that are not UTF-8 would fail deep
    inside JSON encoding, so they are refused here with their position."""
    if value is None:
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        bad = value[exc.start].encode("utf-8", "surrogateescape")
        raise RelaykitError(
            f"the {what} is not valid UTF-8 (byte 0x{bad.hex()} at character {exc.start})",
            hint="pass text in UTF-8",
        ) from None
    return value


_STATUS_WORDS = {
    WorkflowExecutionStatus.RUNNING: "running",
    WorkflowExecutionStatus.COMPLETED: "completed",
    WorkflowExecutionStatus.FAILED: "failed",
    WorkflowExecutionStatus.CANCELED: "cancelled",
    WorkflowExecutionStatus.TERMINATED: "terminated",
    WorkflowExecutionStatus.TIMED_OUT: "timed out",
    WorkflowExecutionStatus.CONTINUED_AS_NEW: "continued as new",
}


def _status_word(description: WorkflowExecutionDescription) -> str:
    status = description.status
    return "unknown" if status is None else _STATUS_WORDS.get(status, status.name.lower())


def _is_open(description: WorkflowExecutionDescription) -> bool:
    return description.status == WorkflowExecutionStatus.RUNNING


NO_WORKER_AFTER = 3.0
"""Seconds a waiting ``run`` gives a worker to show up before saying that none polls."""


def _no_worker_message(task_queue: str) -> str:
    return (
        f"no worker polls task queue {task_queue!r}: the run waits until one does; start one "
        f"with `relaykit worker MODULE --task-queue {task_queue}`"
    )


async def _served(client: Client, task_queue: str) -> bool:
    try:
        return await task_queue_has_worker(client, task_queue)
    except RPCError:  # no permission to describe queues: assume served, say nothing
        return True


def _warn_no_worker(task_queue: str) -> None:
    err_console.print(
        f"[yellow]warning:[/yellow] {_no_worker_message(task_queue)}", highlight=False
    )


async def _client(address: str | None, namespace: str | None) -> Client:
    """A client with the codec ``RELAYKIT_CODEC`` names (see :mod:`relaykit.codec`)."""
    return await connect(address, namespace=namespace)


async def _check_payloads_readable(handle: RunHandle) -> None:
    """Fail before acting on a run whose payloads this process cannot read (encoded by a codec
    it lacks, or under another key): otherwise a command such as ``approve`` would change the
    run and only then fail on its answer."""
    from relaykit.codec import describe_decode_error

    try:
        async for event in handle.workflow.fetch_history_events(page_size=1):
            started = event.workflow_execution_started_event_attributes
            break
        else:
            return
    except RPCError:  # e.g. no permission to read history: the command itself may still work
        return
    if started.HasField("input"):
        try:
            await handle.client.data_converter.decode(started.input.payloads)
        except Exception as exc:  # noqa: BLE001 - a codec may raise anything
            raise describe_decode_error(exc, any_error=True) from None


def ui_base() -> str:
    from relaykit.devserver import DEFAULT_UI_URL

    return (os.environ.get("RELAYKIT_UI_URL") or DEFAULT_UI_URL).rstrip("/")


def ui_url(workflow_id: str, namespace: str = "default") -> str:
    from urllib.parse import quote

    return f"{ui_base()}/namespaces/{namespace}/workflows/{quote(workflow_id, safe='')}"


async def _handle(run_id: str, address: str | None, namespace: str | None) -> RunHandle:
    return (await _described(run_id, address, namespace))[0]


async def _described(
    run_id: str, address: str | None, namespace: str | None
) -> tuple[RunHandle, WorkflowExecutionDescription]:
    client = await _client(address, namespace)
    handle = get_run(client, run_id)
    try:
        description = await handle.workflow.describe()
    except RPCError as exc:
        raise RelaykitError(
            f"no run with id {run_id!r} in namespace {client.namespace!r}",
            hint="`relaykit runs` lists the runs that exist",
        ) from exc
    await _check_payloads_readable(handle)
    return handle, description


async def _queried_handle(
    run_id: str, address: str | None, namespace: str | None, what: str
) -> tuple[RunHandle, WorkflowExecutionDescription]:
    """The handle of a run whose ``what`` is about to be read by a query. Temporal answers a
    query by replaying the run on a worker, closed runs included, so with no worker on the
    run's task queue the query would only time out after about 30 s; say why at once."""
    handle, description = await _described(run_id, address, namespace)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if await _served(handle.client, queue):
        return handle, description
    if _is_open(description):  # the answer comes once a worker does
        _warn_no_worker(queue)
        return handle, description
    raise RelaykitError(
        f"run {run_id!r} is closed ({_status_word(description)}) and no worker polls task queue "
        f"{queue!r}: a run's {what} is read by a worker replaying it",
        hint=f"start one with `relaykit worker MODULE --task-queue {queue}`; `relaykit result "
        f"{run_id}` shows how it ended without one",
    )


def _replay_refused(
    handle: RunHandle, description: WorkflowExecutionDescription, exc: WorkflowQueryFailedError
) -> RelaykitError:
    """A query Temporal answered by replaying the run on a worker that cannot (it does not
    define the run's agents, or its code changed): one line instead of the replay's error."""
    run_id = handle.id
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    reason = (str(exc).strip().splitlines() or [""])[0]
    state = "closed (" + _status_word(description) + ")" if not _is_open(description) else "open"
    return RelaykitError(
        f"run {run_id!r} is {state} and the worker now serving task queue {queue!r} cannot "
        f"replay it to read its event log (it does not serve the run's agents, or their code "
        f"changed): {reason[:200]}",
        hint=f"serve the run's agents on that queue (`relaykit worker MODULE --task-queue "
        f"{queue}`); `relaykit result {run_id}` shows how it ended, the Temporal UI its history: "
        f"{ui_url(run_id, handle.client.namespace)}",
    )


async def _open_handle(
    run_id: str, address: str | None, namespace: str | None, doing: str
) -> tuple[RunHandle, WorkflowExecutionDescription]:
    """The handle of a run that is still open; a closed run cannot be ``doing`` anything, and
    Temporal's own answer ("workflow execution already completed") does not say how it ended."""
    handle, description = await _described(run_id, address, namespace)
    if not _is_open(description):
        raise RelaykitError(
            f"run {run_id!r} is closed ({_status_word(description)}): cannot {doing}",
            hint=f"`relaykit result {run_id}` shows how it ended",
        )
    return handle, description


async def _served_handle(
    run_id: str, address: str | None, namespace: str | None, doing: str
) -> tuple[RunHandle, WorkflowExecutionDescription]:
    """The handle of an open run for a command Temporal delivers as an update: the run's worker
    validates and accepts it, so with no worker polling the command would wait without a word
    (and a person would not know whether their answer was taken)."""
    handle, description = await _open_handle(run_id, address, namespace, doing)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if not await _served(handle.client, queue):
        raise RelaykitError(
            f"no worker polls task queue {queue!r}, so run {run_id!r} cannot {doing} until one "
            "does",
            hint=f"start one with `relaykit worker MODULE --task-queue {queue}`",
        )
    return handle, description


def _print_answer(output: Any) -> None:
    """A run's answer exactly as the run gave it. Through a pipe or into a file it goes byte for
    byte (rich would hard-wrap it at 80 columns, breaking long lines and JSON strings); on a
    terminal it wraps softly, so copying it still gives the original lines."""
    text = output if isinstance(output, str) else json.dumps(output, indent=2, ensure_ascii=False)
    if console.is_terminal:
        console.print(text, highlight=False, markup=False, emoji=False, soft_wrap=True)
        return
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    _print_answer(result.output)
    err_console.print(
        f"[dim]agent {result.final_agent} · {result.turns} turns · {result.usage.requests} "
        f"model calls · {result.usage.input_tokens} in / "
        f"{result.usage.output_tokens} out tokens[/dim]"
    )


# --- commands ---------------------------------------------------------------------------------


@app.command()
@command
async def worker(
    target: Annotated[
        list[str],
        typer.Argument(
            help="MODULE or MODULE:ATTR (an agent or a list of agents); several may be given"
        ),
    ],
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
    deployment: Annotated[
        str | None,
        typer.Option(
            "--deployment",
            help="Worker deployment name (default: RELAYKIT_DEPLOYMENT); "
            "with --build-id, runs are pinned to this worker's build",
        ),
    ] = None,
    build_id: Annotated[
        str | None,
        typer.Option(
            "--build-id", help="Build id of this worker's code (default: RELAYKIT_BUILD_ID)"
        ),
    ] = None,
    upgrade_on_continue_as_new: Annotated[
        bool,
        typer.Option(
            "--upgrade-on-continue-as-new",
            help="Long runs move to the deployment's current build at their next continue-as-new",
        ),
    ] = False,
) -> None:
    """Run a worker serving the agents of a module (and every agent they reach).

    Agents without a model get the same one `relaykit dev` would pick (RELAYKIT_MODEL, provider
    keys, else the scripted stand-in; RELAYKIT_MODEL=local for the bundled tiny model); the
    first lines say which.
    SIGTERM or Ctrl-C stops it gracefully: it takes no new work, lets calls in flight finish
    (up to --graceful-shutdown seconds) and exits, so a rolling restart stalls no run."""
    from relaykit.dev import run_worker
    from relaykit.loading import load_agents
    from relaykit.versioning import deployment_config

    for one in target:  # a bad module fails before anything connects
        load_agents(one)
    deployment_config(deployment, build_id)  # so does a bad deployment name
    client = await _client(address, namespace)
    await run_worker(
        target,
        client=client,
        task_queue=task_queue,
        on_signal=_stop_message(graceful_shutdown),
        deployment=deployment,
        build_id=build_id,
        upgrade_on_continue_as_new=upgrade_on_continue_as_new,
        **worker_options(
            tool_threads, max_concurrent_activities, sticky_timeout, graceful_shutdown
        ),
    )
    err_console.print("worker stopped")


class IfExists(StrEnum):
    """What ``run --id R`` does when a run with id R exists."""

    attach = "attach"
    fail = "fail"
    restart = "restart"


async def _start_or_attach(
    client: Client,
    agent: str,
    prompt: str,
    *,
    task_queue: str,
    run_id: str | None,
    max_turns: int,
    if_exists: IfExists,
) -> tuple[RunHandle, WorkflowExecutionDescription | None]:
    """Start the run, or (re-issuing an existing id) attach to it, fail, or restart it, with
    Temporal's id reuse and conflict policies deciding atomically on the server. Returns the
    description of the run attached to, ``None`` when a new run started."""
    if run_id is not None:
        try:
            existing: WorkflowExecutionDescription | None = await get_run(
                client, run_id
            ).workflow.describe()
        except RPCError:
            existing = None
        policies: dict[str, Any]  # start_run passes them on to Temporal's start_workflow
        if if_exists is IfExists.restart:
            policies = {
                "id_reuse_policy": WorkflowIDReusePolicy.ALLOW_DUPLICATE,
                "id_conflict_policy": WorkflowIDConflictPolicy.TERMINATE_EXISTING,
            }
        else:
            policies = {
                "id_reuse_policy": WorkflowIDReusePolicy.REJECT_DUPLICATE,
                "id_conflict_policy": WorkflowIDConflictPolicy.USE_EXISTING
                if if_exists is IfExists.attach
                else WorkflowIDConflictPolicy.FAIL,
            }
    else:
        existing, policies = None, {}
    try:
        handle = await start_run(
            client,
            agent,
            prompt,
            task_queue=task_queue,
            id=run_id,
            max_turns=max_turns,
            **policies,
        )
    except WorkflowAlreadyStartedError:
        assert run_id is not None
        existing = await get_run(client, run_id).workflow.describe()
        if if_exists is IfExists.fail:
            raise RelaykitError(
                f"a run with id {run_id!r} already exists ({_status_word(existing)})",
                hint="--if-exists attach returns it, --if-exists restart starts it anew",
            ) from None
        return get_run(client, run_id), existing
    if if_exists is IfExists.attach and existing is not None and _is_open(existing):
        return handle, existing
    return handle, None


def _activity_line(description: WorkflowExecutionDescription) -> str:
    pending = list(description.raw_description.pending_activities)
    if not pending:
        return ""
    now = time.time()
    parts = []
    for activity in pending:
        since = (
            activity.last_started_time
            if activity.HasField("last_started_time")
            else (activity.scheduled_time)
        )
        seconds = max(0, int(now - since.ToSeconds())) if since.seconds else 0
        parts.append(f"{activity.activity_type.name} {seconds}s")
    return " · " + ", ".join(parts)


async def _status_line(handle: RunHandle) -> str | None:
    """One line: agent, turn, and the activities in progress with how long they have run."""
    try:
        state = await asyncio.wait_for(handle.state(), timeout=2.0)
        description = await asyncio.wait_for(handle.workflow.describe(), timeout=2.0)
    except Exception:  # noqa: BLE001 - a slow or absent worker: keep the last line
        return None
    if state.status == "waiting_approval":
        status = f" · waiting for approval (relaykit pending {handle.id})"
    else:
        status = "" if state.status == "running" else f" · {state.status}"
    return f"{state.agent} · turn {state.turn}{status}{_activity_line(description)}"


FAILING_TASK_CHECK = 2.0
"""Seconds between the checks of a waiting ``run`` for a worker that keeps failing the run."""


async def _failing_task(handle: RunHandle, task_queue: str) -> RelaykitError | None:
    """Why the worker keeps failing the run's workflow task, when it does. Temporal retries a
    failed workflow task forever without closing the run, so without this a worker that cannot
    decode the run's input (another codec or key than this command's) would leave ``run --wait``
    waiting without a word."""
    try:
        description = await handle.workflow.describe()
    except RPCError:
        return None
    raw = description.raw_description
    if not raw.HasField("pending_workflow_task") or raw.pending_workflow_task.attempt < 2:
        return None
    failure = None  # the failure of the latest workflow task, if that task failed
    try:
        async for event in handle.workflow.fetch_history_events():
            if event.HasField("workflow_task_failed_event_attributes"):
                failure = event.workflow_task_failed_event_attributes.failure
            elif event.HasField("workflow_task_completed_event_attributes") or event.HasField(
                "workflow_task_timed_out_event_attributes"
            ):  # an earlier failure that a later attempt got past, or a worker gone: not this
                failure = None
    except RPCError:
        return None
    if failure is None:
        return None
    hint = f"the worker keeps retrying; `relaykit terminate {handle.id}` ends the run"
    if failure.HasField("encoded_attributes"):  # the worker's failure converter encoded it
        try:
            decoded = await handle.client.data_converter.decode_failure(failure)
            message = str(decoded)
        except Exception:  # noqa: BLE001 - a codec may raise anything
            encoding = failure.encoded_attributes.metadata.get("encoding", b"").decode(
                errors="replace"
            )
            return RelaykitError(
                f"the worker on task queue {task_queue!r} cannot run {handle.id}, and its error "
                f"is encoded as {encoding!r} with a codec or key this command lacks: the worker "
                "and this command use different codecs or keys",
                hint=f"give both the same RELAYKIT_CODEC and key; {hint}",
            )
    else:
        message = failure.message
    from relaykit.stuck import first_line

    first = first_line(message)
    return RelaykitError(
        f"the worker on task queue {task_queue!r} fails run {handle.id} on every attempt: {first}",
        hint=f"a codec or key other than this command's gives this too; {hint}",
    )


async def _wait_for_result(handle: RunHandle, task_queue: str) -> RunResult:
    """Wait for the run's result. On a terminal, a live status line says what the run is
    doing; anywhere, a run no worker serves is said to wait for one, and a run its worker keeps
    failing ends the wait with why."""
    result_task = asyncio.ensure_future(handle.result())
    live = err_console.is_terminal
    began = time.monotonic()
    worker_checked = False
    task_checked = began
    status = err_console.status("waiting for the run to start…") if live else nullcontext()
    try:
        with status:
            while True:
                await asyncio.wait({result_task}, timeout=1.0)
                if result_task.done():
                    break
                if not worker_checked and time.monotonic() - began >= NO_WORKER_AFTER:
                    worker_checked = True
                    if not await _served(handle.client, task_queue):
                        _warn_no_worker(task_queue)
                if time.monotonic() - task_checked >= FAILING_TASK_CHECK:
                    task_checked = time.monotonic()
                    failing = await _failing_task(handle, task_queue)
                    if failing is not None:
                        raise failing
                if live:
                    line = await _status_line(handle)
                    if line is not None and hasattr(status, "update"):
                        status.update(line)
    finally:
        if not result_task.done():
            result_task.cancel()
    return result_task.result()


@app.command()
@command
async def run(
    agent: Annotated[str, typer.Argument(help="Name of the agent that starts the run")],
    prompt: Annotated[str, typer.Argument(help="The task")],
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Wait for the result")] = False,
    as_json: JsonOpt = False,
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    run_id: Annotated[str | None, typer.Option("--id", help="Workflow id for the run")] = None,
    if_exists: Annotated[
        IfExists,
        typer.Option(
            "--if-exists",
            help="When a run with --id exists: attach (running: follow it; closed: print its "
            "result), fail, or restart (terminate a running one, then start anew)",
        ),
    ] = IfExists.attach,
    max_turns: Annotated[int, typer.Option(help="Stop after this many model turns")] = 50,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Start a run; print its id (and, with --wait, then its result)."""
    if max_turns < 1:
        raise RelaykitError(
            f"--max-turns must be at least 1, not {max_turns}", hint="a run needs one model turn"
        )
    _text_arg(prompt, "prompt")
    _text_arg(agent, "agent name")
    if not agent.strip():
        raise RelaykitError(
            "the agent name is empty", hint="give the name of an agent a worker serves"
        )
    _text_arg(run_id, "run id")
    client = await _client(address, namespace)
    handle, existing = await _start_or_attach(
        client,
        agent,
        prompt,
        task_queue=task_queue,
        run_id=run_id,
        max_turns=max_turns,
        if_exists=if_exists,
    )
    if existing is not None:
        queue = existing.task_queue or task_queue
        if not _is_open(existing):
            err_console.print(
                f"run {handle.id} already exists and is closed ({_status_word(existing)}); "
                "its result:",
                highlight=False,
            )
            _print_result(await handle.result(), as_json)
            return
        err_console.print(f"run {handle.id} is already running: attached to it", highlight=False)
    else:
        queue = task_queue
    if wait:
        err_console.print(
            f"run [bold]{handle.id}[/bold]  {ui_url(handle.id, client.namespace)}", highlight=False
        )
        try:
            finished = await _wait_for_result(handle, queue)
        except asyncio.CancelledError:  # Ctrl-C: only this command stops
            err_console.print(
                f"stopped waiting; run {handle.id} goes on (`relaykit result {handle.id}` waits "
                f"for it again, `relaykit cancel {handle.id}` stops it)",
                highlight=False,
            )
            raise
        _print_result(finished, as_json)
        return
    try:  # surface immediate failures (an agent the worker does not serve) as an error
        await asyncio.wait_for(asyncio.shield(handle.result()), timeout=1.0)
    except TimeoutError:
        pass
    if as_json:
        print(json.dumps({"run_id": handle.id, "ui_url": ui_url(handle.id, client.namespace)}))
    else:
        print(handle.id)
        err_console.print(f"[dim]{ui_url(handle.id, client.namespace)}[/dim]")


@app.command()
@command
async def result(
    run_id: RunIdArg,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Wait for a run's result and print it."""
    from relaykit.stuck import stuck

    handle = await _handle(run_id, address, namespace)
    wedged = await stuck(handle.client, run_id)
    if wedged is not None:  # waiting would never end
        raise RelaykitError(
            f"run {run_id} is stuck: its workflow task failed {wedged.attempts} times: "
            f"{wedged.cause}",
            hint="roll back the worker's code, or `temporal workflow reset` the run "
            "(docs/deploy.md)",
        )
    _print_result(await handle.result(), as_json)


@app.command("ui-url")
def ui_url_command(
    run_id: RunIdArg,
    namespace: Annotated[str, typer.Option(help="Temporal namespace")] = "default",
) -> None:
    """Print the Temporal UI link of a run (base: RELAYKIT_UI_URL, default 127.0.0.1:8233)."""
    print(ui_url(run_id, os.environ.get("TEMPORAL_NAMESPACE", namespace)))


@app.command()
@command
async def pending(
    run_id: RunIdArg,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """List the tool calls of a run waiting for approval."""
    handle, description = await _described(run_id, address, namespace)
    if not _is_open(description):  # a closed run's state still lists what it waited for
        if as_json:
            print("[]")
        err_console.print(
            f"run {run_id} is closed ({_status_word(description)}): nothing waits for approval",
            highlight=False,
        )
        return
    approvals = await handle.pending_approvals()
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in approvals], indent=2))
        return
    if not approvals:
        err_console.print("no pending approvals")
    for item in approvals:
        why = f"\t{item.reason}" if item.reason else ""  # e.g. an unknown outcome to decide on
        print(f"{item.call_id}\t{item.agent}\t{item.tool}({item.arguments}){why}")


@app.command()
@command
async def approve(
    run_id: RunIdArg,
    call_id: Annotated[str, typer.Argument(help="Tool call id (see `relaykit pending`)")],
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve")] = False,
    reason: Annotated[str | None, typer.Option(help="Reason the model will read")] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Approve (or --reject) a tool call waiting for a person."""
    _text_arg(reason, "reason")
    handle, _ = await _served_handle(run_id, address, namespace, "answer approvals")
    item = await handle.approve(call_id, approved=not reject, reason=reason)
    print(f"{'rejected' if reject else 'approved'} {item.tool} ({item.call_id})")


@app.command()
@command
async def send(
    run_id: RunIdArg,
    text: Annotated[str, typer.Argument(help="Message for the model, at the next turn")],
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Inject a user message into a running run."""
    _text_arg(text, "message")
    handle, _ = await _served_handle(run_id, address, namespace, "take messages")
    await handle.send_message(text)
    print("queued")


@app.command()
@command
async def pause(
    run_id: RunIdArg,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Pause a run at its next turn boundary."""
    handle, _ = await _open_handle(run_id, address, namespace, "pause")
    await handle.pause()
    print("pause requested")


@app.command()
@command
async def resume(
    run_id: RunIdArg,
    text: Annotated[str | None, typer.Argument(help="Optional message for the model")] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Resume a paused run, optionally with a message."""
    _text_arg(text, "message")
    handle, _ = await _open_handle(run_id, address, namespace, "resume")
    await handle.resume(text)
    print("resumed")


@app.command()
@command
async def cancel(
    run_id: RunIdArg,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Cancel a run (and its child runs and in-flight activities); the run ends at its next
    step, so a worker must serve it (`relaykit terminate` ends it without one)."""
    handle, description = await _open_handle(run_id, address, namespace, "cancel")
    await handle.cancel()
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if not await _served(handle.client, queue):
        raise RelaykitError(
            f"cancel requested, but no worker polls task queue {queue!r}, so nothing can act "
            "on it until one does",
            hint=f"`relaykit terminate {run_id}` ends the run now",
        )
    try:  # a served run ends within moments; say how
        await asyncio.wait_for(asyncio.shield(handle.workflow.result()), timeout=CANCEL_WAIT)
    except Exception:  # noqa: BLE001 - cancelled, failed or still running: describe says
        pass
    after = await handle.workflow.describe()
    if not _is_open(after):
        print(f"run {run_id} {_status_word(after)}")
        return
    print("cancel requested: the run stops at its next step")


CANCEL_WAIT = 5.0
"""Seconds ``cancel`` waits to report the run's end."""


@app.command()
@command
async def terminate(
    run_id: RunIdArg,
    reason: Annotated[str | None, typer.Option(help="Why (kept in the run's history)")] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """End a run at once, without running its cleanup (no worker needed); prefer `cancel`."""
    _text_arg(reason, "reason")
    handle, _ = await _open_handle(run_id, address, namespace, "terminate")
    await handle.workflow.terminate(reason=reason or "terminated with `relaykit terminate`")
    print(f"run {run_id} terminated")


@app.command()
@command
async def events(
    run_id: RunIdArg,
    offset: Annotated[int, typer.Option("--from", help="First event sequence number")] = 0,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Print a run's event log."""
    handle, description = await _queried_handle(run_id, address, namespace, "event log")
    try:
        logged = await handle.events(offset)
    except WorkflowQueryFailedError as exc:
        raise _replay_refused(handle, description, exc) from None
    for event in logged:
        if as_json:
            print(event.model_dump_json())
        else:
            path = "/".join(event.run_path)
            print(
                f"{event.seq:>5} t{event.turn:<3} {path:<30} {event.kind:<18} "
                f"{json.dumps(event.data)[:120]}"
            )


@app.command()
@command
async def watch(
    run_id: RunIdArg,
    start: Annotated[
        str,
        typer.Option(
            "--from",
            help="Where to start: an event sequence number, or the cursor "
            "printed when watching stopped",
        ),
    ] = "0",
    plain: Annotated[
        bool, typer.Option("--plain", help="Print the log line by line, even on a terminal")
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Follow a run (and its child runs) live, or print a finished run's log."""
    from relaykit.watch import watch_run

    handle, description = await _queried_handle(run_id, address, namespace, "event log")
    seen = {"cursor": start}

    def remember(cursor: str) -> None:
        seen["cursor"] = cursor

    try:
        state = await watch_run(handle, console, from_offset=start, plain=plain, on_cursor=remember)
    except WorkflowQueryFailedError as exc:
        raise _replay_refused(handle, description, exc) from None
    except asyncio.CancelledError:  # Ctrl-C: the run goes on
        err_console.print(
            f"stopped watching (the run goes on); resume with: relaykit watch {run_id} "
            f"--from {seen['cursor']}",
            highlight=False,
        )
        raise
    tokens = "" if state.tokens is None else f" · {state.tokens} tokens"
    err_console.print(f"[dim]run {state.status} · agent {state.agent}{tokens}[/dim]")
    if (
        state.status == "completed"
        and state.output is not None
        and console.is_terminal
        and not plain
    ):
        _print_answer(state.output)


@app.command()
@command
async def runs(
    status: Annotated[
        str | None,
        typer.Option(
            help="open, running, waiting_approval, paused, completed, failed, "
            "cancelled, terminated or timed_out"
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only runs whose current agent is this")] = None,
    roots: Annotated[bool, typer.Option("--roots", help="Leave child runs out")] = False,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs, newest first")] = 50,
    only_stuck: Annotated[
        bool, typer.Option("--stuck", help="Only open runs whose workflow task keeps failing")
    ] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """List runs with their status, agent, age, tokens and build (from relaykit's search
    attributes); runs whose workflow task keeps failing are marked stuck."""
    from relaykit.stuck import find_stuck
    from relaykit.watch import STATUS_FILTERS, list_runs, runs_table

    if status is not None and status not in STATUS_FILTERS:
        raise RelaykitError(
            f"unknown status {status!r}", hint="one of: " + ", ".join(STATUS_FILTERS)
        )
    if only_stuck and status is None:
        status = "open"
    client = await _client(address, namespace)
    try:
        rows = await list_runs(client, status=status, agent=agent, roots=roots, limit=limit)
    except RPCError as exc:
        from relaykit.search_attributes import operator_create_args

        register = " ".join(["temporal", *operator_create_args(client.namespace)])
        raise RelaykitError(
            f"Temporal: {exc.message}",
            hint=f"relaykit's search attributes must be registered on the namespace: `{register}`",
        ) from None
    wedged = await find_stuck(client, [row.id for row in rows if row.status in LIVE_STATES])
    for row in rows:
        row.stuck = wedged[row.id].cause if row.id in wedged else None
    if only_stuck:
        rows = [row for row in rows if row.stuck is not None]
    await _live_tokens(client, [row for row in rows if row.stuck is None])
    if as_json:
        print(json.dumps([row.to_json() for row in rows], indent=2))
        return
    if not rows:
        err_console.print("no stuck runs" if only_stuck else "no runs")
        return
    if only_stuck:
        for row in rows:
            print(f"{row.id}: {row.stuck}")
        err_console.print(
            "way out: roll back the worker's code, or `temporal workflow reset` each run "
            "(docs/deploy.md)"
        )
        return
    table = runs_table(rows)
    # Ids are what people copy into the next command: never shortened to fit the terminal.
    run_column = table.columns[0]
    run_column.no_wrap = True
    run_column.min_width = max(len(row.id) + (2 if row.parent else 0) for row in rows)
    wide = Console(width=max(console.width, run_column.min_width + 60), soft_wrap=True)
    wide.print(table)


LIVE_STATES = ("running", "waiting_approval", "paused")


async def _live_tokens(client: Client, rows: list[Any]) -> None:
    """The RelayTokens search attribute is written at status changes; an open run's own state
    has its tokens as of its last turn (a run whose worker does not answer keeps the former)."""

    async def refresh(row: Any) -> None:
        try:
            state = await asyncio.wait_for(get_run(client, row.id).state(), timeout=2.0)
        except Exception:  # noqa: BLE001 - no worker, or a run closing meanwhile
            return
        row.tokens = state.usage.total_tokens

    await asyncio.gather(*(refresh(row) for row in rows if row.status in LIVE_STATES))


@app.command("replay-check")
@command
async def replay_check(
    target: Annotated[
        list[str], typer.Argument(help="MODULE or MODULE:ATTR, as for `relaykit worker`")
    ],
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    query: Annotated[
        str | None,
        typer.Option(
            "--query",
            help="A Temporal list filter choosing the runs (default: the "
            "open AgentRun runs of --task-queue)",
        ),
    ] = None,
    histories: Annotated[
        Path | None,
        typer.Option(
            "--histories",
            help="A folder (or file) of history JSON as "
            "`temporal workflow show -o json` writes it, instead of the server",
        ),
    ] = None,
    limit: Annotated[
        int | None, typer.Option("--limit", min=1, help="At most this many runs")
    ] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Replay runs' histories against the agents and workflow code of MODULE, changing nothing
    on the server: the check to run before every deploy. One line per failing or skipped run,
    then a summary. Exit 0 when none failed, 1 when any did, 2 when the check could not run."""
    from relaykit.loading import load_agents
    from relaykit.replay_check import replay_check as check

    try:
        for one in target:
            load_agents(one)
        if histories is not None and not histories.exists():
            raise RelaykitError(f"no such file or folder: {histories}")
        client = await _client(address, namespace)
        outcomes = await check(
            client, target, task_queue=task_queue, query=query, histories=histories, limit=limit
        )
    except (RelaykitError, RPCError, OSError, ValueError) as exc:
        message = exc.message if isinstance(exc, RPCError) else str(exc)
        err_console.print(
            f"[red]error:[/red] replay check could not run: {message}", highlight=False
        )
        raise typer.Exit(2) from None
    for outcome in outcomes:
        if outcome.outcome != "ok":
            print(outcome.line())
    counts = {
        kind: sum(o.outcome == kind for o in outcomes) for kind in ("ok", "failed", "skipped")
    }
    replayed = counts["ok"] + counts["failed"]
    print(f"replayed {replayed}, failed {counts['failed']}, skipped {counts['skipped']}")
    if counts["failed"]:
        raise typer.Exit(1)


deployment_app = typer.Typer(
    help="Worker Deployment Versioning: which build new runs start on (docs/deploy.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)
app.add_typer(deployment_app, name="deployment")


@deployment_app.command("set-current")
@command
async def deployment_set_current(
    name: Annotated[str, typer.Argument(help="Deployment name")],
    build_id: Annotated[str, typer.Argument(help="Build id that new runs start on")],
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Make BUILD_ID the current build of deployment NAME: new runs start there, runs already
    pinned to another build stay on it."""
    from relaykit.versioning import set_current_build

    client = await _client(address, namespace)
    await set_current_build(client, name, build_id)
    print(f"deployment {name}: current build is now {build_id}")


@deployment_app.command("status")
@command
async def deployment_status(
    name: Annotated[str, typer.Argument(help="Deployment name")],
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """The builds of deployment NAME, which is current, and the open runs on each: a build
    whose workers may stop has none."""
    from relaykit.versioning import deployment_status as status_of

    client = await _client(address, namespace)
    status = await status_of(client, name)
    if as_json:
        print(json.dumps(status.to_json(), indent=2))
        return
    print(f"deployment {status.name}: current build {status.current_build or '(none)'}")
    for build in status.builds:
        print(f"  {build.build_id}  {build.status}  open runs: {build.open_runs}")


def listening_socket(host: str, port: int) -> tuple[Any, str]:
    """A socket already listening on ``host:port`` (0: any free port) and its URL, so that whoever
    waits for the URL a server prints can connect at once; a taken port is one clear line."""
    import socket

    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise RelaykitError(
            f"cannot listen on {host}:{port}: {exc.strerror}", hint="pass --port"
        ) from None
    sock.listen(128)
    bound = sock.getsockname()[1]
    return sock, f"http://[{host}]:{bound}" if ":" in host else f"http://{host}:{bound}"


@app.command("codec-server")
@command
async def codec_server(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port)")
    ] = 8081,
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    origin: Annotated[
        list[str] | None,
        typer.Option(
            help="Browser origin allowed to call it (repeatable; default: the Temporal "
            "UI on 127.0.0.1/localhost:8233 and :8080 and RELAYKIT_UI_URL)"
        ),
    ] = None,
) -> None:
    """Serve the codec RELAYKIT_CODEC names over Temporal's remote codec protocol, so the
    Temporal UI and `temporal --codec-endpoint` show decoded payloads. Set
    RELAYKIT_CODEC_AUTH to require that exact Authorization header."""
    from urllib.parse import urlsplit

    from relaykit.codec import (
        CODEC_AUTH_ENV,
        CODEC_ENV,
        DEFAULT_UI_ORIGINS,
        codec_app,
        codec_from_env,
    )

    codec = codec_from_env()
    if codec is None:
        raise RelaykitError(
            f"no codec to serve: {CODEC_ENV} is not set", hint="set it to module:attr"
        )
    try:
        import uvicorn
    except ImportError:
        raise RelaykitError(
            "the codec server needs uvicorn and starlette", hint="pip install 'relaykit[codec]'"
        ) from None
    origins = list(origin or DEFAULT_UI_ORIGINS)
    if not origin and os.environ.get("RELAYKIT_UI_URL"):
        parts = urlsplit(ui_base())
        origins.append(f"{parts.scheme}://{parts.netloc}")
    app_ = codec_app(codec, origins=origins, authorization=os.environ.get(CODEC_AUTH_ENV) or None)
    sock, url = listening_socket(host, port)
    auth = " (Authorization required)" if os.environ.get(CODEC_AUTH_ENV) else ""
    err_console.print(f"codec server on {url}{auth} for {type(codec).__name__}", highlight=False)
    err_console.print(
        f"[dim]temporal workflow show --codec-endpoint {url} …; Temporal UI: codec endpoint "
        f"{url}[/dim]",
        highlight=False,
    )
    import logging

    from relaykit import codec as codec_module

    refusals = logging.StreamHandler(sys.stderr)  # uvicorn configures only its own loggers
    refusals.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    codec_module.logger.addHandler(refusals)
    codec_module.logger.setLevel(logging.INFO)
    server = uvicorn.Server(uvicorn.Config(app_, log_level="warning", lifespan="off"))
    await server.serve(sockets=[sock])


@app.command()
@command
async def gc(
    retention: Annotated[
        str | None,
        typer.Option(
            "--retention",
            help="Keep runs closed less than this long (default RELAYKIT_STORE_RETENTION or 7d)",
        ),
    ] = None,
    store: Annotated[
        str | None, typer.Option("--store", help="Store URL (default RELAYKIT_STORE)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be deleted")
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Delete stored transcripts and payloads of runs that closed longer ago than the retention."""
    from relaykit.storage import Store, collect_garbage, parse_duration

    kept_for = parse_duration(retention) if retention else None  # bad input before connecting
    target = Store(store)
    target.check()
    client = await _client(address, namespace)
    report = await collect_garbage(target, client, retention=kept_for, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    for run_id, count in sorted(report.deleted.items()):
        print(f"{verb} {run_id}: {count} objects")
    for run_id, why in sorted(report.kept.items()):
        print(f"kept {run_id}: {why}")
    print(f"{target.location}: {verb} {len(report.deleted)} runs, kept {len(report.kept)}")


@app.command()
def dev(
    target: Annotated[
        str, typer.Argument(help="MODULE[:ATTR] whose agents the worker serves")
    ] = "examples.demo",
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[
        str, typer.Option(help="Where the server keeps its SQLite file")
    ] = ".relaykit",
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
) -> None:
    """Start the embedded Temporal server (with its UI) and a worker; Ctrl-C or SIGTERM stops
    both, the worker gracefully first."""
    from relaykit.dev import run_dev

    options = worker_options(
        tool_threads, max_concurrent_activities, sticky_timeout, graceful_shutdown
    )
    try:
        asyncio.run(
            run_dev(
                target,
                port=port,
                ui_port=ui_port,
                data_dir=data_dir,
                task_queue=task_queue,
                worker_options=options,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C or SIGTERM while starting
        err_console.print("stopped")
    except RelaykitError as exc:
        _fail(str(exc))


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[
        str, typer.Option(help="Where the server keeps its SQLite file")
    ] = ".relaykit",
    stay: Annotated[
        bool | None, typer.Option("--stay/--exit", help="Keep the server and UI up afterwards")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model to play the demo (as RELAYKIT_MODEL: openai:gpt-4.1, local, …); "
            "default: the deterministic scripted stand-in unless a provider is configured"
        ),
    ] = None,
) -> None:
    """Run the quick-start demo: embedded server, two worker processes and one multi-step run
    whose first worker is killed mid-run."""
    from relaykit.demo import run_demo

    try:
        asyncio.run(run_demo(port=port, ui_port=ui_port, data_dir=data_dir, stay=stay, model=model))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C or SIGTERM
        err_console.print("stopped")
    except RunFailed as exc:
        _fail(f"run failed ({exc.type or 'error'}): {exc.message}")
    except RelaykitError as exc:
        _fail(str(exc))


register_operate_commands(app)  # inbox, steer, fork: relaykit/operate_cli.py


def main() -> None:
    code: int = 0
    try:
        app()
    except SystemExit as exc:
        if isinstance(exc.code, str):
            print(exc.code, file=sys.stderr)
        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
    except BrokenPipeError:  # e.g. `relaykit events RUN | head`
        code = 0
    # The Temporal client's native threads can abort interpreter finalization ("Fatal Python
    # error: PyGILState_Release", exit status 134; temporalio/sdk-python#300), turning a command
    # that worked into a crash. The command is done: run the exit handlers (they stop a leftover
    # dev server, flush logs), flush, and leave without finalization.
    import atexit

    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, ValueError):
            pass
    os._exit(code)


if __name__ == "__main__":
    main()
