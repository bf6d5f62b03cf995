"""Commands for deploys: ``replay-check`` and the ``deployment`` group (Worker Deployment
Versioning)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from temporalio.service import RPCError

from relaykit.cli.common import (
    AddressOpt,
    JsonOpt,
    NamespaceOpt,
    TaskQueueOpt,
    _client,
    command,
    err_console,
)
from relaykit.client import (
    DEFAULT_TASK_QUEUE,
)
from relaykit.errors import RelaykitError


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
    then a summary. Exit 0 when none failed, 1 when any did, 2 when the check could not run,
    3 when it found no run to replay."""
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
    if not outcomes:
        await _nothing_to_replay(client, task_queue, query, histories)
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


NOTHING_TO_REPLAY = 3
"""``replay-check``'s exit status when it found no run: a deploy gate must not take that for a
pass (the workers may poll another queue than the one checked)."""


async def _nothing_to_replay(
    client: Any, task_queue: str, query: str | None, histories: Path | None
) -> None:
    from relaykit.replay_check import open_run_queues

    if histories is not None:
        found = f"no history file in {histories}"
    elif query is not None:
        found = f"no run matching --query {query!r}"
    else:
        found = f"no open run on task queue {task_queue!r}"
    where = ""
    if histories is None:
        try:
            queues = await open_run_queues(client)
        except RPCError:
            queues = {}
        others = {name: count for name, count in queues.items() if name != task_queue}
        if others:
            where = (
                " (open runs are on: "
                + ", ".join(f"{name!r} ({count})" for name, count in sorted(others.items()))
                + ")"
            )
    err_console.print(
        f"[red]error:[/red] replay check found {found} to replay{where}; nothing was checked "
        "(hint: pick the queue your workers poll with --task-queue, or the runs with --query)",
        highlight=False,
    )
    raise typer.Exit(NOTHING_TO_REPLAY)


deployment_app = typer.Typer(
    help="Worker Deployment Versioning: which build new runs start on (docs/deploy.md).",
    no_args_is_help=True,
    rich_markup_mode=None,
)


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
