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
from collections.abc import Callable, Coroutine
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from temporalio.client import Client, WorkflowUpdateFailedError
from temporalio.service import RPCError

from relaykit.client import DEFAULT_TASK_QUEUE, RunHandle, connect, get_run, start_run
from relaykit.errors import RelaykitError, RunFailed
from relaykit.worker import DEFAULT_GRACEFUL_SHUTDOWN, DEFAULT_STICKY_TIMEOUT, DEFAULT_TOOL_THREADS

app = typer.Typer(
    name="relaykit",
    help="Durable multi-agent LLM runs on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
console = Console()
err_console = Console(stderr=True, soft_wrap=True)

T = TypeVar("T")

AddressOpt = Annotated[
    str | None, typer.Option("--address", help="Temporal frontend (default: TEMPORAL_ADDRESS or localhost:7233)")
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
    typer.Option("--max-concurrent-activities", min=1, help="Model and tool calls run at once (default: Temporal's)"),
]
StickyOpt = Annotated[
    float,
    typer.Option(
        "--sticky-timeout", min=0.1,
        help="Seconds a run's next step waits for the worker that has it cached before another may take it",
    ),
]
GraceOpt = Annotated[
    float,
    typer.Option(
        "--graceful-shutdown", min=0,
        help="On SIGTERM/Ctrl-C, seconds calls in flight may take to finish before they are cancelled",
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
        except RPCError as exc:
            _fail(f"Temporal: {exc.message}")
        except KeyboardInterrupt:
            raise typer.Exit(130) from None
        return None

    return wrapper


async def _client(address: str | None, namespace: str | None) -> Client:
    return await connect(address, namespace=namespace)


def ui_base() -> str:
    return os.environ.get("RELAYKIT_UI_URL", "http://localhost:8233").rstrip("/")


def ui_url(workflow_id: str, namespace: str = "default") -> str:
    from urllib.parse import quote

    return f"{ui_base()}/namespaces/{namespace}/workflows/{quote(workflow_id, safe='')}"


async def _handle(run_id: str, address: str | None, namespace: str | None) -> RunHandle:
    client = await _client(address, namespace)
    handle = get_run(client, run_id)
    try:
        await handle.workflow.describe()
    except RPCError as exc:
        raise RelaykitError(
            f"no run with id {run_id!r} in namespace {client.namespace!r}",
            hint="`temporal workflow list` shows the runs that exist",
        ) from exc
    return handle


def _print_result(result: Any, as_json: bool) -> None:
    if as_json:
        print(result.model_dump_json(indent=2))
        return
    output = result.output if isinstance(result.output, str) else json.dumps(result.output, indent=2)
    console.print(output, highlight=False, markup=False)
    err_console.print(
        f"[dim]agent {result.final_agent} · {result.turns} turns · {result.usage.requests} "
        f"model calls · {result.usage.input_tokens} in / {result.usage.output_tokens} out tokens[/dim]"
    )


# --- commands ---------------------------------------------------------------------------------


@app.command()
@command
async def worker(
    target: Annotated[str, typer.Argument(help="MODULE or MODULE:ATTR (an agent or a list of agents)")],
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
) -> None:
    """Run a worker serving the agents of a module (and every agent they reach).

    SIGTERM or Ctrl-C stops it gracefully: it takes no new work, lets calls in flight finish
    (up to --graceful-shutdown seconds) and exits, so a rolling restart stalls no run."""
    from relaykit.loading import load_agents
    from relaykit.worker import Worker

    agents = load_agents(target)
    client = await _client(address, namespace)
    served = Worker(
        client, agents, task_queue=task_queue,
        **worker_options(tool_threads, max_concurrent_activities, sticky_timeout, graceful_shutdown),
    )
    err_console.print(
        f"worker on task queue [bold]{task_queue}[/bold] serving: "
        + ", ".join(sorted(served.graph.agents))
    )
    await served.run_until_signalled(_stop_message(graceful_shutdown))
    err_console.print("worker stopped")


@app.command()
@command
async def run(
    agent: Annotated[str, typer.Argument(help="Name of the agent that starts the run")],
    prompt: Annotated[str, typer.Argument(help="The task")],
    wait: Annotated[bool, typer.Option("--wait", "-w", help="Wait for the result")] = False,
    as_json: JsonOpt = False,
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    run_id: Annotated[str | None, typer.Option("--id", help="Workflow id for the run")] = None,
    max_turns: Annotated[int, typer.Option(help="Stop after this many model turns")] = 50,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Start a run; print its id (or, with --wait, its result)."""
    client = await _client(address, namespace)
    handle = await start_run(
        client, agent, prompt, task_queue=task_queue, id=run_id, max_turns=max_turns
    )
    if wait:
        _print_result(await handle.result(), as_json)
        return
    try:  # surface immediate failures (an agent the worker does not serve) as an error
        await asyncio.wait_for(asyncio.shield(handle.result()), timeout=1.0)
    except asyncio.TimeoutError:
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
    handle = await _handle(run_id, address, namespace)
    _print_result(await handle.result(), as_json)


@app.command("ui-url")
def ui_url_command(
    run_id: RunIdArg,
    namespace: Annotated[str, typer.Option(help="Temporal namespace")] = "default",
) -> None:
    """Print the Temporal UI link of a run (base: RELAYKIT_UI_URL, default localhost:8233)."""
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
    handle = await _handle(run_id, address, namespace)
    approvals = await handle.pending_approvals()
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in approvals], indent=2))
        return
    if not approvals:
        err_console.print("no pending approvals")
    for item in approvals:
        print(f"{item.call_id}\t{item.agent}\t{item.tool}({item.arguments})")


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
    handle = await _handle(run_id, address, namespace)
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
    handle = await _handle(run_id, address, namespace)
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
    await (await _handle(run_id, address, namespace)).pause()
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
    await (await _handle(run_id, address, namespace)).resume(text)
    print("resumed")


@app.command()
@command
async def cancel(
    run_id: RunIdArg,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Cancel a run (and its child runs and in-flight activities)."""
    await (await _handle(run_id, address, namespace)).cancel()
    print("cancel requested")


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
    handle = await _handle(run_id, address, namespace)
    for event in await handle.events(offset):
        if as_json:
            print(event.model_dump_json())
        else:
            path = "/".join(event.run_path)
            print(f"{event.seq:>5} t{event.turn:<3} {path:<30} {event.kind:<18} {json.dumps(event.data)[:120]}")


@app.command()
@command
async def watch(
    run_id: RunIdArg,
    start: Annotated[
        str,
        typer.Option("--from", help="Where to start: an event sequence number, or the cursor "
                     "printed when watching stopped"),
    ] = "0",
    plain: Annotated[
        bool, typer.Option("--plain", help="Print the log line by line, even on a terminal")
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Follow a run (and its child runs) live, or print a finished run's log."""
    from relaykit.watch import watch_run

    handle = await _handle(run_id, address, namespace)
    seen = {"cursor": start}

    def remember(cursor: str) -> None:
        seen["cursor"] = cursor

    try:
        state = await watch_run(
            handle, console, from_offset=start, plain=plain, on_cursor=remember
        )
    except asyncio.CancelledError:  # Ctrl-C: the run goes on
        err_console.print(
            f"stopped watching (the run goes on); resume with: relaykit watch {run_id} "
            f"--from {seen['cursor']}",
            highlight=False,
        )
        raise
    tokens = "" if state.tokens is None else f" · {state.tokens} tokens"
    err_console.print(f"[dim]run {state.status} · agent {state.agent}{tokens}[/dim]")
    if state.status == "completed" and state.output is not None and console.is_terminal and not plain:
        output = state.output if isinstance(state.output, str) else json.dumps(state.output, indent=2)
        console.print(output, highlight=False, markup=False)


@app.command()
@command
async def runs(
    status: Annotated[
        str | None,
        typer.Option(help="running, waiting_approval, paused, completed, failed, cancelled, "
                     "terminated or timed_out"),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only runs whose current agent is this")] = None,
    roots: Annotated[bool, typer.Option("--roots", help="Leave child runs out")] = False,
    limit: Annotated[int, typer.Option(help="At most this many runs, newest first")] = 50,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """List runs with their status, agent, age and tokens (from relaykit's search attributes)."""
    from relaykit.watch import STATUS_FILTERS, list_runs, runs_table

    if status is not None and status not in STATUS_FILTERS:
        raise RelaykitError(
            f"unknown status {status!r}", hint="one of: " + ", ".join(STATUS_FILTERS)
        )
    client = await _client(address, namespace)
    try:
        rows = await list_runs(client, status=status, agent=agent, roots=roots, limit=limit)
    except RPCError as exc:
        raise RelaykitError(
            f"Temporal: {exc.message}",
            hint="relaykit's search attributes must be registered on the namespace "
            "(see relaykit/search_attributes.py)",
        ) from None
    if as_json:
        print(json.dumps([row.to_json() for row in rows], indent=2))
        return
    if not rows:
        err_console.print("no runs")
        return
    console.print(runs_table(rows))


@app.command()
def dev(
    target: Annotated[
        str, typer.Argument(help="MODULE[:ATTR] whose agents the worker serves")
    ] = "examples.demo",
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[str, typer.Option(help="Where the server keeps its SQLite file")] = ".relaykit",
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
) -> None:
    """Start the embedded Temporal server (with its UI) and a worker; Ctrl-C or SIGTERM stops
    both, the worker gracefully first."""
    from relaykit.dev import run_dev

    options = worker_options(tool_threads, max_concurrent_activities, sticky_timeout, graceful_shutdown)
    try:
        asyncio.run(run_dev(
            target, port=port, ui_port=ui_port, data_dir=data_dir, task_queue=task_queue,
            worker_options=options,
        ))
    except KeyboardInterrupt:
        err_console.print("stopped")
    except RelaykitError as exc:
        _fail(str(exc))


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[str, typer.Option(help="Where the server keeps its SQLite file")] = ".relaykit",
    stay: Annotated[
        bool | None, typer.Option("--stay/--exit", help="Keep the server and UI up afterwards")
    ] = None,
) -> None:
    """Run the quick-start demo: embedded server, worker and one multi-step run."""
    from relaykit.dev import run_demo

    try:
        asyncio.run(run_demo(port=port, ui_port=ui_port, data_dir=data_dir, stay=stay))
    except KeyboardInterrupt:
        err_console.print("stopped")
    except RunFailed as exc:
        _fail(f"run failed ({exc.type or 'error'}): {exc.message}")
    except RelaykitError as exc:
        _fail(str(exc))


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
