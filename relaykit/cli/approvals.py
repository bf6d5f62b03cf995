"""Commands on approvals: list what a run waits for, answer one call (the ``approve`` update) or
every waiting call at once (``--all``/``--query``: checked, then signalled;
:mod:`relaykit.bulk_approvals`)."""

from __future__ import annotations

import json
from typing import Annotated

import typer

from relaykit.authors import author
from relaykit.cli.common import (
    AddressOpt,
    AsOpt,
    JsonOpt,
    NamespaceOpt,
    RunIdArg,
    _client,
    _described,
    _is_open,
    _served_handle,
    _status_word,
    _text_arg,
    command,
    err_console,
)
from relaykit.cli.waiting import refuse_if_stuck, unless_stuck
from relaykit.client import DEFAULT_TASK_QUEUE
from relaykit.errors import RelaykitError
from relaykit.pricing import format_usd


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
    await refuse_if_stuck(handle, description)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    approvals = await unless_stuck(handle, queue, handle.pending_approvals())
    if as_json:
        print(json.dumps([a.model_dump(mode="json") for a in approvals], indent=2))
        return
    budget = (await handle.state()).budget
    if budget is not None and budget.phase == "reached":  # waits for a person too
        print(
            f"budget reached: spent {format_usd(budget.spent)} of {format_usd(budget.limit)}"
            + (f" ({format_usd(budget.reserved)} held by child runs)" if budget.reserved else "")
            + f"; `relaykit budget {run_id} --raise AMOUNT`, `--finish` or `--cancel`"
        )
    elif budget is not None and budget.phase == "waiting_for_parent":
        print(
            f"waiting for its parent's budget: spent {format_usd(budget.spent)} of "
            f"{format_usd(budget.limit)}, asked {budget.parent} for more; a raise of the root "
            "run's limit (`relaykit budget ROOT --raise AMOUNT`) lets it go on"
        )
    elif not approvals:
        err_console.print("no pending approvals")
    for item in approvals:
        why = f"\t{item.reason}" if item.reason else ""  # e.g. an unknown outcome to decide on
        print(f"{item.call_id}\t{item.agent}\t{item.tool}({item.arguments}){why}")


@command
async def approve(
    run_id: Annotated[
        str | None, typer.Argument(help="Workflow id of the run (with --all: only this run)")
    ] = None,
    call_id: Annotated[
        str | None, typer.Argument(help="Tool call id (see `relaykit pending`)")
    ] = None,
    reject: Annotated[bool, typer.Option("--reject", help="Reject instead of approve")] = False,
    reason: Annotated[str | None, typer.Option(help="Reason the model will read")] = None,
    every: Annotated[
        bool, typer.Option("--all", help="Answer every call waiting (in RUN_ID, or in every run)")
    ] = False,
    query: Annotated[
        str | None,
        typer.Option(
            "--query",
            help="With --all: only runs this visibility filter finds, e.g. \"RelayAgent = 'ops'\"",
        ),
    ] = None,
    by: AsOpt = None,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Approve (or --reject) a tool call waiting for a person; --all answers every waiting call
    (of RUN_ID, or of every run --query finds) at signal speed, each checked first."""
    _text_arg(reason, "reason")
    by = _text_arg(author(by), "name")  # the same name for each answer of --all
    if every or query is not None:
        if call_id is not None:
            raise RelaykitError("--all answers every waiting call: give no CALL_ID with it")
        await _approve_all(run_id, query, reject, reason, by, address, namespace)
        return
    if run_id is None or call_id is None:
        raise RelaykitError(
            "give RUN_ID and CALL_ID, or --all", hint="`relaykit pending RUN_ID` lists call ids"
        )
    handle, description = await _served_handle(run_id, address, namespace, "answer approvals")
    await refuse_if_stuck(handle, description)
    queue = description.task_queue or DEFAULT_TASK_QUEUE
    item = await unless_stuck(
        handle, queue, handle.approve(call_id, approved=not reject, reason=reason, by=by)
    )
    print(f"{'rejected' if reject else 'approved'} {item.tool} ({item.call_id})")


async def _approve_all(
    run_id: str | None,
    query: str | None,
    reject: bool,
    reason: str | None,
    by: str | None,
    address: str | None,
    namespace: str | None,
) -> None:
    """One line per answer; a run that could not be read is named, never skipped unseen."""
    from relaykit.bulk_approvals import ANSWERED, answer_waiting

    if run_id is not None and query is not None:
        raise RelaykitError("give RUN_ID or --query, not both")
    client = await _client(address, namespace)
    answers = await answer_waiting(
        client,
        query,
        approved=not reject,
        reason=reason,
        by=by,
        run_ids=[run_id] if run_id is not None else None,
    )
    word = "rejected" if reject else "approved"
    done = 0
    for answer in sorted(answers, key=lambda a: (a.run_id, a.call_id)):
        if answer.status == ANSWERED:
            done += 1
            tool = f"\t{answer.tool}" if answer.tool else ""  # listed by id only
            print(f"{word}\t{answer.run_id}\t{answer.call_id}{tool}")
        else:
            err_console.print(
                f"not answered ({answer.status}): run {answer.run_id} {answer.call_id} "
                f"{answer.detail}".rstrip(),
                highlight=False,
            )
    err_console.print(f"{done} {word}", highlight=False)
    if done != len(answers):
        raise typer.Exit(1)
