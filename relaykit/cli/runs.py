"""Commands on runs: start one, read its result, approve, message, pause, stop, follow and
list runs."""

from __future__ import annotations

import asyncio
import json
import os
from enum import StrEnum
from typing import Annotated, Any

import typer
from temporalio.client import (
    Client,
    WorkflowExecutionDescription,
    WorkflowQueryFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy, WorkflowIDReusePolicy
from temporalio.exceptions import WorkflowAlreadyStartedError
from temporalio.service import RPCError

from relaykit.authors import author
from relaykit.cli.common import (
    AddressOpt,
    AsOpt,
    JsonOpt,
    NamespaceOpt,
    RunIdArg,
    TaskQueueOpt,
    _client,
    _described,
    _is_open,
    _open_handle,
    _print_answer,
    _print_result,
    _queried_handle,
    _replay_refused,
    _served,
    _served_handle,
    _status_word,
    _text_arg,
    command,
    console,
    err_console,
    ui_url,
)
from relaykit.cli.waiting import WaitWatch, refuse_if_stuck, unless_stuck, wait_for_result
from relaykit.client import (
    DEFAULT_TASK_QUEUE,
    RunHandle,
    get_run,
    start_run,
)
from relaykit.errors import RelaykitError
from relaykit.runs import Budget


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
    **run_options: Any,
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
            **run_options,
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
    priority: Annotated[
        int | None,
        typer.Option(
            min=1, max=5, help="1 (first) to 5 (last), default 3: for the run and all it starts"
        ),
    ] = None,
    tenant: Annotated[
        str | None,
        typer.Option(help="Tenant whose fair share of the workers the run takes (RelayTenant)"),
    ] = None,
    tenant_weight: Annotated[
        float | None, typer.Option(help="The tenant's weight in that share (default 1.0)")
    ] = None,
    max_usd: Annotated[
        float | None,
        typer.Option(help="Dollar limit of the whole run tree (at it the run waits for you)"),
    ] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Start a run; print its id (and, with --wait, then its result)."""
    if max_usd is not None and not max_usd >= 0:
        raise RelaykitError(f"--max-usd must be a positive amount, not {max_usd}")
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
        priority=priority,
        tenant=tenant,
        tenant_weight=tenant_weight,
        budget=None if max_usd is None else Budget(max_usd=max_usd),
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
        _print_result(await wait_for_result(handle, queue), as_json)
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


@command
async def result(
    run_id: RunIdArg,
    as_json: JsonOpt = False,
    no_wait: Annotated[
        bool,
        typer.Option(
            "--no-wait",
            help="On an open run, say what it waits for and exit with status 3 instead of waiting",
        ),
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Wait for a run's result and print it; says at once what an open run waits for (a
    person's approval, a resume, a worker)."""
    from relaykit.stuck import ordering_reset, stuck, way_out

    handle, description = await _described(run_id, address, namespace)
    wedged = await stuck(handle.client, run_id)
    if wedged is not None:  # waiting would never end
        reset = await ordering_reset(handle.client, run_id, wedged.run_id, wedged.cause)
        raise RelaykitError(
            f"run {run_id} is stuck: its workflow task failed {wedged.attempts} times: "
            f"{wedged.cause}",
            hint=way_out(run_id, wedged.run_id, reset),
        )
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if no_wait and _is_open(description):
        line = await WaitWatch(handle, queue).check()
        err_console.print(
            line or f"run {run_id} is running: `relaykit result {run_id}` waits for its answer",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(STILL_OPEN)
    _print_result(await wait_for_result(handle, queue), as_json)


STILL_OPEN = 3
"""``result --no-wait``'s exit status for a run that has not ended."""


def ui_url_command(
    run_id: RunIdArg,
    namespace: Annotated[str, typer.Option(help="Temporal namespace")] = "default",
) -> None:
    """Print the Temporal UI link of a run (base: RELAYKIT_UI_URL, default 127.0.0.1:8233)."""
    print(ui_url(run_id, os.environ.get("TEMPORAL_NAMESPACE", namespace)))


@command
async def send(
    run_id: RunIdArg,
    text: Annotated[str, typer.Argument(help="Message for the model, at the next turn")],
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Inject a user message into a running run."""
    _text_arg(text, "message")
    by = _text_arg(author(by), "name")
    handle, description = await _served_handle(run_id, address, namespace, "take messages")
    await refuse_if_stuck(handle, description)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    await unless_stuck(handle, queue, handle.send_message(text, by=by))
    print("queued")


@command
async def pause(
    run_id: RunIdArg,
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Pause a run at its next turn boundary."""
    by = _text_arg(author(by), "name")
    handle, _ = await _open_handle(run_id, address, namespace, "pause")
    await handle.pause(by=by)
    print("pause requested")


@command
async def resume(
    run_id: RunIdArg,
    text: Annotated[str | None, typer.Argument(help="Optional message for the model")] = None,
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Resume a paused run, optionally with a message."""
    _text_arg(text, "message")
    by = _text_arg(author(by), "name")
    handle, _ = await _open_handle(run_id, address, namespace, "resume")
    await handle.resume(text, by=by)
    print("resumed")


@command
async def cancel(
    run_id: RunIdArg,
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Cancel a run (and its child runs and in-flight activities); the run ends at its next
    step, so a worker must serve it (`relaykit terminate` ends it without one)."""
    by = _text_arg(author(by), "name")
    handle, description = await _open_handle(run_id, address, namespace, "cancel")
    await handle.cancel(by=by)
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


@command
async def terminate(
    run_id: RunIdArg,
    reason: Annotated[str | None, typer.Option(help="Why (kept in the run's history)")] = None,
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """End a run at once, without running its cleanup (no worker needed); prefer `cancel`."""
    _text_arg(reason, "reason")
    by = _text_arg(author(by), "name")
    handle, _ = await _open_handle(run_id, address, namespace, "terminate")
    why = reason or "terminated with `relaykit terminate`"
    await handle.workflow.terminate(reason=f"{why} (by {by})")
    print(f"run {run_id} terminated")


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
            by = event.data.get("by")  # who took an operator action, never cut off
            print(
                f"{event.seq:>5} t{event.turn:<3} {path:<30} {event.kind:<18} "
                + (f"by {by}: " if by else "")
                + json.dumps(_rounded(event.data))[:120]
            )


def _rounded(value: Any) -> Any:
    """Event data as a person reads it: floats (dollar amounts, mostly) to six significant
    digits, not their last bits (``--json`` keeps them exact)."""
    if isinstance(value, float):
        return float(f"{value:.6g}")
    if isinstance(value, dict):
        return {key: _rounded(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_rounded(item) for item in value]
    return value


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
