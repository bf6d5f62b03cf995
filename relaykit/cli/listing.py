"""``relaykit runs``: the runs of a namespace, from Temporal's visibility store."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated, Any

import typer
from rich.console import Console
from temporalio.client import Client
from temporalio.service import RPCError

from relaykit.cli.common import (
    AddressOpt,
    JsonOpt,
    NamespaceOpt,
    _client,
    command,
    console,
    err_console,
)
from relaykit.client import get_run
from relaykit.errors import RelaykitError


@command
async def runs(
    status: Annotated[
        str | None,
        typer.Option(
            help="open, running, waiting_approval, paused, budget_reached, completed, "
            "failed, cancelled, terminated or timed_out"
        ),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only runs whose current agent is this")] = None,
    roots: Annotated[bool, typer.Option("--roots", help="Leave child runs out")] = False,
    tenant: Annotated[
        str | None, typer.Option(help="Only runs started for this tenant (RelayTenant)")
    ] = None,
    limit: Annotated[int, typer.Option(min=1, help="At most this many runs, newest first")] = 50,
    only_stuck: Annotated[
        bool, typer.Option("--stuck", help="Only open runs whose workflow task keeps failing")
    ] = False,
    query: Annotated[
        str | None,
        typer.Option(help="A visibility filter of your own, e.g. 'RelayCostUSD > 1'"),
    ] = None,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """List runs with their status, agent, age, tokens, cost and build (from relaykit's search
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
        rows = await list_runs(
            client,
            status=status,
            agent=agent,
            roots=roots,
            limit=limit,
            tenant=tenant,
            query=query,
        )
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
        row.cost = state.usage.cost_usd

    await asyncio.gather(*(refresh(row) for row in rows if row.status in LIVE_STATES))
