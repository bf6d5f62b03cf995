"""Commands for operating runs from outside: ``relaykit console`` (runs, what they wait for and
the actions people take on them), ``relaykit inbox`` (every waiting approval of a namespace on
one page), ``relaykit steer`` (correct a run while its model is thinking),
``relaykit fork`` (a new run from a turn of an existing one) and ``relaykit budget`` (a run's
dollar limit: raise it, set it, or end the run with its best answer so far)."""

from __future__ import annotations

import os
from typing import Annotated, Any

import typer
from temporalio.client import WorkflowUpdateFailedError

from relaykit.authors import author
from relaykit.cli.common import (
    AddressOpt,
    AsOpt,
    JsonOpt,
    NamespaceOpt,
    RunIdArg,
    _client,
    _print_result,
    _served_handle,
    _text_arg,
    command,
    err_console,
    listening_socket,
)
from relaykit.cli.waiting import refuse_if_stuck, unless_stuck, wait_for_result
from relaykit.client import DEFAULT_TASK_QUEUE
from relaykit.errors import RelaykitError
from relaykit.pricing import format_usd

INBOX_AUTH_ENV = "RELAYKIT_INBOX_AUTH"


@command
async def inbox(
    host: Annotated[
        str,
        typer.Option(help=f"Interface to listen on (loopback unless {INBOX_AUTH_ENV} is set)"),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port)")] = 8765,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Serve every approval the namespace waits for, on a page and a JSON API. Set
    RELAYKIT_INBOX_AUTH="Bearer <token>" to require that token (needed off loopback)."""
    await serve_inbox(host=host, port=port, address=address, namespace=namespace)


@command
async def steer(
    run_id: RunIdArg,
    text: Annotated[str, typer.Argument(help="Message for the model, now")],
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Correct a run now: a model call in flight is cancelled (its answer never used) and
    the next one starts at once with this message; a summary of older turns in flight
    finishes first; otherwise the same as `send`."""
    _text_arg(text, "message")
    by = _text_arg(author(by), "name")
    handle, description = await _served_handle(run_id, address, namespace, "be steered")
    await refuse_if_stuck(handle, description)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    if await unless_stuck(handle, queue, handle.steer(text, by=by)):
        print("steered: the model call in flight was cancelled; the next one has your message")
    else:
        print("queued: no turn's model call in flight, the next one has your message")


@command
async def fork(
    run_id: RunIdArg,
    at_turn: Annotated[int, typer.Option("--at-turn", help="Keep turns 1..N of the run")],
    new_id: Annotated[str | None, typer.Option("--id", help="Workflow id of the new run")] = None,
    text: Annotated[str | None, typer.Option("--input", help="A user message after turn N")] = None,
    wait: Annotated[bool, typer.Option("--wait", help="Wait for the new run's answer")] = False,
    by: AsOpt = None,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Start a new run from turn N of RUN_ID (running or closed): its first N turns are
    kept, none of their tools runs again, and the original is untouched."""
    from relaykit.fork import fork_run

    _text_arg(text, "input")
    by = _text_arg(author(by), "name")
    client = await _client(address, namespace)
    handle = await fork_run(client, run_id, at_turn, input=text, id=new_id, by=by)
    print(handle.id, flush=True)
    if not wait:
        return
    description = await handle.workflow.describe()
    result = await wait_for_result(handle, description.task_queue or DEFAULT_TASK_QUEUE)
    _print_result(result, as_json)


@command
async def budget(
    run_id: RunIdArg,
    raise_by: Annotated[
        float | None, typer.Option("--raise", help="Add this many dollars to the limit")
    ] = None,
    set_to: Annotated[float | None, typer.Option("--set", help="Make the limit this")] = None,
    finish: Annotated[
        bool, typer.Option("--finish", help="One last call without tools for the best answer")
    ] = False,
    cancel: Annotated[bool, typer.Option("--cancel", help="Cancel the run")] = False,
    by: AsOpt = None,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Show a run's dollar budget, or change it: --raise 2.50, --set 10, --finish or --cancel.
    A run waiting at its limit (budget_reached) goes on where it stopped."""
    import json

    chosen = [
        name
        for name, on in (
            ("--raise", raise_by is not None),
            ("--set", set_to is not None),
            ("--finish", finish),
            ("--cancel", cancel),
        )
        if on
    ]
    if len(chosen) > 1:
        raise RelaykitError(f"give one of {', '.join(chosen)}, not several")
    for name, amount in (("--raise", raise_by), ("--set", set_to)):
        if amount is not None and not amount > 0:
            raise RelaykitError(f"{name} needs a positive amount of dollars, not {amount}")
    by = _text_arg(author(by), "name")
    handle, _ = await _served_handle(run_id, address, namespace, "change its budget")
    if cancel:
        await handle.cancel(by=by)
        print("cancel requested: the run stops at its next step")
        return
    if not chosen:
        view = (await handle.state()).budget
        if view is None:
            raise RelaykitError(f"run {run_id} has no dollar limit")
    else:
        try:
            view = await handle.set_budget(set_to, raise_by=raise_by, finish=finish, by=by)
        except WorkflowUpdateFailedError as exc:
            raise RelaykitError(f"the run refused: {getattr(exc.cause, 'message', exc)}") from None
    if as_json:
        print(json.dumps(view.model_dump(mode="json")))
        return
    print(
        f"spent {format_usd(view.spent)} of {format_usd(view.limit)}"
        + (f" ({format_usd(view.reserved)} held by child runs)" if view.reserved else "")
        + ("" if view.phase == "spending" else f" · {_phase_words(view)}")
    )


def _phase_words(view: Any) -> str:
    """What a budget's phase means for the person reading it."""
    if view.phase == "reached":
        return "waiting at its limit: --raise, --set, --finish or --cancel"
    if view.phase == "waiting_for_parent":
        return f"waiting for its parent's budget ({view.parent}): raise the root run's limit"
    return str(view.phase).replace("_", " ")


async def serve_inbox(*, host: str, port: int, address: str | None, namespace: str | None) -> None:
    from relaykit.inbox.app import InboxAuth, inbox_app, is_loopback

    authorization = os.environ.get(INBOX_AUTH_ENV) or None
    if authorization is None and not is_loopback(host):
        raise RelaykitError(
            f"refusing to serve the inbox on {host} without {INBOX_AUTH_ENV}: anyone who "
            "reaches it could approve tool calls",
            hint=f'set {INBOX_AUTH_ENV}="Bearer <token>", or listen on 127.0.0.1',
        )
    uvicorn = _uvicorn("the inbox")
    client = await _client(address, namespace)
    await _check_attributes(client)
    sock, url = listening_socket(host, port)
    auth = InboxAuth(authorization)
    guarded = f" ({INBOX_AUTH_ENV} required)" if authorization else ""
    err_console.print(f"inbox on {url}{guarded} for namespace {client.namespace}", highlight=False)
    link = auth.sign_in_link(url)
    if link:
        err_console.print(f"sign in: {link}", highlight=False, soft_wrap=True)
    app: Any = inbox_app(client, authorization=authorization)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    await server.serve(sockets=[sock])


@command
async def console(
    host: Annotated[
        str,
        typer.Option(help="Interface to listen on (loopback unless people must sign in)"),
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port to listen on (0: any free port)")] = 8766,
    users: Annotated[
        str | None,
        typer.Option(
            "--users",
            help="TOML file of people: [users.NAME] role = viewer|operator|approver, token = … "
            "(default RELAYKIT_CONSOLE_USERS_FILE; RELAYKIT_CONSOLE_USERS adds NAME=ROLE:TOKEN,…)",
        ),
    ] = None,
    trust_header: Annotated[
        str | None,
        typer.Option(
            "--trust-header",
            help="Take the person's name from this header, set by your authenticating reverse "
            "proxy (e.g. X-Forwarded-User); roles from --users and --default-role",
        ),
    ] = None,
    default_role: Annotated[
        str | None,
        typer.Option(help="Role of a --trust-header name the users file does not list"),
    ] = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Serve the run console: runs and what they wait for, each run's conversation, children
    and costs, and actions (approve, steer, send, pause, resume, fork, cancel, budget) taken
    by signed-in people whose names the runs record (docs/console.md)."""
    import getpass

    from relaykit.console.app import console_app
    from relaykit.console.people import ROLES, People
    from relaykit.inbox.app import is_loopback

    if default_role is not None and default_role not in ROLES:
        raise RelaykitError(
            f"--default-role must be one of {', '.join(ROLES)}, not {default_role!r}"
        )
    people = People.configure(
        users_file=users,
        trust_header=trust_header,
        default_role=default_role,
        local_user=getpass.getuser(),
    )
    if not people.guarded and not is_loopback(host):
        raise RelaykitError(
            f"refusing to serve the console on {host} without sign-in: anyone who reaches it "
            "could act on runs",
            hint="give --users FILE (or RELAYKIT_CONSOLE_USERS), or --trust-header behind a proxy",
        )
    uvicorn = _uvicorn("the console")
    client = await _client(address, namespace)
    await _check_attributes(client)
    sock, url = listening_socket(host, port)
    how = (
        f"people sign in ({len(people.users)} known)"
        if people.needs_sign_in
        else f"names from {trust_header}"
        if trust_header
        else f"as {people.local_user}, loopback only"
    )
    err_console.print(
        f"console on {url} for namespace {client.namespace} ({how}); "
        f"a run's page: {url}/runs/RUN_ID",
        highlight=False,
    )
    import logging

    from relaykit.console import app as console_module

    said = logging.StreamHandler()
    said.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    console_module.logger.addHandler(said)
    console_module.logger.setLevel(logging.INFO)
    app: Any = console_app(client, people)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    await server.serve(sockets=[sock])


def _uvicorn(what: str) -> Any:
    try:
        import uvicorn
    except ImportError:
        raise RelaykitError(
            f"{what} needs uvicorn and starlette", hint="pip install 'relaykit[codec]'"
        ) from None
    return uvicorn


async def _check_attributes(client: Any) -> None:
    """An unregistered search attribute fails here, once, instead of on every page."""
    from temporalio.service import RPCError

    from relaykit.inbox.pending import waiting_runs_query

    try:
        async for _ in client.list_workflows(waiting_runs_query(), limit=1):
            break
    except RPCError as exc:
        raise RelaykitError(
            f"Temporal: {exc.message}",
            hint="relaykit's search attributes must be registered on the namespace "
            "(see the README's Production section)",
        ) from None
