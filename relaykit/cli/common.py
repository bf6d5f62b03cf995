"""What every ``relaykit`` command shares: the options, the :func:`command` wrapper that turns
bad input into one clear line, clients and run handles, result printing, UI links and the
listening socket. Command modules import this one and never each other."""

from __future__ import annotations

import asyncio
import functools
import json
import os
import sys
from collections.abc import Callable, Coroutine
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
from temporalio.service import RPCError

from relaykit.client import (
    DEFAULT_TASK_QUEUE,
    RunHandle,
    connect,
    get_run,
    task_queue_has_worker,
)
from relaykit.errors import RelaykitError, RunFailed
from relaykit.pricing import cost_text

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
AsOpt = Annotated[
    str | None,
    typer.Option("--as", help="Who acts, recorded in the run's history (default: your user name)"),
]
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
CacheOpt = Annotated[
    int | None,
    typer.Option(
        "--max-cached-workflows",
        min=0,
        help=(
            "Runs kept in memory between their steps (default: Temporal's, 1000); a run not "
            "kept replays its history on its next step"
        ),
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
    tool_threads: int,
    max_concurrent_activities: int | None,
    sticky_timeout: float,
    grace: float,
    max_cached_workflows: int | None = None,
) -> dict[str, Any]:
    """The ``relaykit.Worker`` keywords the ``worker`` and ``dev`` commands share."""
    from datetime import timedelta

    return {
        "tool_threads": tool_threads,
        "max_concurrent_activities": max_concurrent_activities,
        "max_cached_workflows": max_cached_workflows,
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


def _no_worker_message(task_queue: str, last_poll: float | None = None) -> str:
    seen = (
        ""
        if last_poll is None
        else f" (a worker polled it {last_poll:.0f} s ago: it has stopped, or is busy)"
    )
    return (
        f"no worker polls task queue {task_queue!r}{seen}: the run waits until one does; start "
        f"one with `relaykit worker MODULE --task-queue {task_queue}`"
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
        f"{result.usage.output_tokens} out tokens · {cost_text(result.usage)}[/dim]"
    )


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
