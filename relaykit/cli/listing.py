"""``relaykit runs``: one page of a namespace's runs, from Temporal's visibility store
(:mod:`relaykit.run_list`)."""

from __future__ import annotations

import asyncio
import json
from typing import Annotated

import typer
from rich.console import Console
from rich.measure import Measurement
from rich.table import Table
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
from relaykit.errors import RelaykitError
from relaykit.run_list import COUNTED_REASONS, REASONS, RunFilter, list_runs_page


@command
async def runs(
    status: Annotated[
        str | None,
        typer.Option(
            help="open, running, waiting_approval, paused, budget_reached, completed, "
            "failed, cancelled, terminated or timed_out"
        ),
    ] = None,
    reason: Annotated[
        str | None,
        typer.Option(help="Only open runs waiting for this: " + ", ".join(REASONS)),
    ] = None,
    agent: Annotated[str | None, typer.Option(help="Only runs whose current agent is this")] = None,
    roots: Annotated[bool, typer.Option("--roots", help="Leave child runs out")] = False,
    tenant: Annotated[
        str | None, typer.Option(help="Only runs started for this tenant (RelayTenant)")
    ] = None,
    text: Annotated[
        str | None, typer.Option("--text", help="Only runs whose id starts with this")
    ] = None,
    limit: Annotated[
        int, typer.Option(min=1, max=1000, help="At most this many runs, newest first")
    ] = 50,
    page: Annotated[
        str | None, typer.Option("--page", help="The page token a previous list printed")
    ] = None,
    only_stuck: Annotated[
        bool, typer.Option("--stuck", help="Only open runs whose workflow task keeps failing")
    ] = False,
    query: Annotated[
        str | None,
        typer.Option(help="A visibility filter of your own, e.g. 'RelayCostUSD > 1'"),
    ] = None,
    evals: Annotated[
        bool,
        typer.Option("--evals", help="Also list the candidate runs of evaluations (RelayEvalOf)"),
    ] = False,
    as_json: JsonOpt = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """List runs with their status, what they wait for, agent, tenant, age, last activity,
    tokens, cost and build, newest first, a page at a time; above the table, how many open
    runs wait for each reason."""
    if only_stuck:
        if reason not in (None, "stuck"):
            raise RelaykitError("give --stuck or --reason, not both")
        reason = "stuck"
    where = RunFilter(
        agent=agent,
        status=status,
        reason=reason,
        tenant=tenant,
        text=text,
        roots=roots,
        query=query,
        evals=evals,
    )
    where.check()  # before connecting: a typo is one line, whatever the server
    client = await _client(address, namespace)
    try:
        listed = await list_runs_page(
            client, where, page_size=limit, page_token=page, counts=not as_json, live_usage=True
        )
    except RPCError as exc:
        from relaykit.search_attributes import operator_create_args

        register = " ".join(["temporal", *operator_create_args(client.namespace)])
        raise RelaykitError(
            f"Temporal: {exc.message}",
            hint=f"relaykit's search attributes must be registered on the namespace: `{register}`",
        ) from None
    rows = listed.rows
    more = f"more: --page {listed.next_page_token}" if listed.next_page_token else None
    ways: list[str | None] = [None] * len(rows)
    if only_stuck:  # a wedge relaykit can name gets its own way out
        from relaykit.stuck import ordering_reset, way_out

        resets = await asyncio.gather(
            *(ordering_reset(client, r.run_id, r.execution, r.stuck or "") for r in rows)
        )
        ways = [
            None if reset is None else way_out(row.run_id, row.execution, reset)
            for row, reset in zip(rows, resets, strict=True)
        ]
    if as_json:
        out = [row.to_json() for row in rows]
        if only_stuck:
            out = [{**row, "way_out": way} for row, way in zip(out, ways, strict=True)]
        print(json.dumps(out, indent=2))
        if more:
            err_console.print(more, highlight=False, soft_wrap=True)
        return
    if listed.counts is not None:
        err_console.print(
            "waiting: "
            + " · ".join(
                f"{listed.counts[name]} {name.replace('_', ' ')}"
                for name in COUNTED_REASONS
                if name in listed.counts
            ),
            highlight=False,
        )
    if not rows:
        err_console.print("no stuck runs" if only_stuck else "no runs")
    elif only_stuck:
        from relaykit.stuck import WAY_OUT

        for row, way in zip(rows, ways, strict=True):
            print(f"{row.run_id}: {row.stuck}")
            if way is not None:
                print(f"  way out: {way}")
        err_console.print(f"way out: {WAY_OUT}", highlight=False)
    else:
        from relaykit.watch import runs_table

        print_uncut(runs_table(rows), console)
    if more:
        err_console.print(more, highlight=False, soft_wrap=True)


def print_uncut(table: Table, console: Console) -> None:
    """Print ``table`` with no cell shortened to fit the terminal: ids are what people copy
    into the next command, and a status cut to "waiting_pa…" says nothing. A terminal
    narrower than the table wraps its lines instead."""
    needed = Measurement.get(console, console.options.update_width(10_000), table).maximum
    wide = Console(width=max(console.width, needed), soft_wrap=True, file=console.file)
    wide.print(table)
