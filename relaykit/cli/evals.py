"""``relaykit eval``: evaluate a changed agent on recorded runs (docs/evals.md)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from relaykit.cli.common import AddressOpt, NamespaceOpt, _client, command, err_console
from relaykit.errors import RelaykitError


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as exc:
        raise RelaykitError(f"cannot write {path!r}: {exc.strerror or exc}") from None


@command
async def evaluate(
    candidate: Annotated[
        str, typer.Argument(help="MODULE or MODULE:ATTR: the changed agents (and `score`)")
    ],
    query: Annotated[
        str | None,
        typer.Option(
            help="Closed runs to replay, a visibility query, e.g. \"RelayAgent = 'triage'\""
        ),
    ] = None,
    runs: Annotated[
        list[str] | None,
        typer.Option("--runs", help="Run ids to replay (repeat, or separate with commas)"),
    ] = None,
    histories: Annotated[
        str | None,
        typer.Option(help="A folder of `temporal workflow show -o json` files to replay"),
    ] = None,
    limit: Annotated[int | None, typer.Option(min=1, help="At most this many runs")] = None,
    model: Annotated[
        str | None, typer.Option(help="Every candidate agent uses this model (PROVIDER:NAME)")
    ] = None,
    eval_id: Annotated[
        str | None,
        typer.Option("--eval-id", help="The evaluation's id: the same id again resumes it"),
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Candidate runs at once")] = 4,
    live_reads: Annotated[
        bool, typer.Option("--live-reads", help='Unmatched calls of "read" tools run live')
    ] = False,
    pass_score: Annotated[
        float, typer.Option(min=0, max=1, help="A run passes at this score (default 1: same)")
    ] = 1.0,
    report: Annotated[str | None, typer.Option(help="Write the Markdown report here")] = None,
    json_path: Annotated[
        str | None, typer.Option("--json", help="Write the JSON report here")
    ] = None,
    junit: Annotated[str | None, typer.Option(help="Write JUnit XML here")] = None,
    min_pass: Annotated[
        float | None,
        typer.Option("--min-pass", min=0, max=1, help="Exit 1 when the pass rate is below this"),
    ] = None,
    no_worker: Annotated[
        bool,
        typer.Option("--no-worker", help="Do not serve the evaluation here: workers run elsewhere"),
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Evaluate CANDIDATE on recorded runs: each run's agent of the same name answers the recorded
    input again, its tool calls answered from the recording (a write never runs). Prints the
    Markdown report (or writes it with --report), and the evaluation's id on stderr."""
    from relaykit.evals import evaluate as run_eval
    from relaykit.evals import junit_xml, markdown, select_runs
    from relaykit.evals.runner import default_eval_id, load_candidate

    load_candidate(candidate)  # a bad module is one line, before anything starts
    client = await _client(address, namespace)
    ids = [part for value in runs or [] for part in value.split(",") if part.strip()]
    the_id = eval_id or default_eval_id(candidate)
    err_console.print(f"evaluation {the_id}", highlight=False)
    sources = await select_runs(client, query=query, runs=ids, histories=histories, limit=limit)
    result = await run_eval(
        client,
        candidate,
        sources,
        eval_id=the_id,
        model=model,
        concurrency=concurrency,
        live_reads=live_reads,
        pass_score=pass_score,
        worker=not no_worker,
    )
    text = markdown(result)
    if report is not None:
        _write(report, text)
    else:
        print(text, end="", flush=True)
    if json_path is not None:
        _write(json_path, result.model_dump_json(indent=2) + "\n")
    if junit is not None:
        _write(junit, junit_xml(result))
    totals = result.totals
    if min_pass is not None and totals.pass_rate < min_pass:
        err_console.print(
            f"pass rate {totals.pass_rate:.1%} is below --min-pass {min_pass:.1%}", highlight=False
        )
        raise typer.Exit(1)
