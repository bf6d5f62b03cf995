"""The ``relaykit`` command line.

Every command talks to Temporal through Temporal's own environment configuration
(``TEMPORAL_ADDRESS``, ``TEMPORAL_NAMESPACE``, profiles), so existing setups just work. Bad input
(an unknown agent, module or run, an unreachable server) gives one clear line on stderr and a
non-zero exit status, never a traceback.

The commands live in one module per group (:mod:`~relaykit.cli.runs`, :mod:`~relaykit.cli.serve`,
:mod:`~relaykit.cli.deploy`, :mod:`~relaykit.cli.operate`, :mod:`~relaykit.cli.evals`,
:mod:`~relaykit.cli.listing`, :mod:`~relaykit.cli.approvals`), on what :mod:`~relaykit.cli.common`
shares; this module builds the app from them, in the order ``--help`` lists them.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from relaykit.cli import approvals, deploy, evals, listing, operate, runs, serve
from relaykit.cli.common import ui_url

__all__ = ["app", "main", "ui_url"]

app = typer.Typer(
    name="relaykit",
    help="Durable multi-agent LLM runs on Temporal.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    # Click's own help layout: typer's rich panels show every boolean flag as `--wait <bool>`.
    rich_markup_mode=None,
)


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


app.command()(serve.worker)
app.command()(runs.run)
app.command()(runs.result)
app.command("ui-url")(runs.ui_url_command)
app.command()(approvals.pending)
app.command()(approvals.approve)
app.command()(runs.send)
app.command()(runs.pause)
app.command()(runs.resume)
app.command()(runs.cancel)
app.command()(runs.terminate)
app.command()(runs.events)
app.command()(runs.watch)
app.command()(listing.runs)
app.command("replay-check")(deploy.replay_check)
app.command("codec-server")(serve.codec_server)
app.command()(serve.gc)
app.command()(serve.dev)
app.command()(serve.demo)
app.command()(operate.console)
app.command()(operate.inbox)
app.command()(operate.steer)
app.command()(operate.fork)
app.command()(operate.budget)
app.command("eval")(evals.evaluate)
app.add_typer(deploy.deployment_app, name="deployment")


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
