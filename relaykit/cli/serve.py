"""Commands that serve: ``worker``, ``codec-server``, ``gc``, ``dev`` and ``demo``."""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Annotated

import typer

from relaykit.cli.common import (
    AddressOpt,
    CacheOpt,
    GraceOpt,
    MaxActivitiesOpt,
    NamespaceOpt,
    StickyOpt,
    TaskQueueOpt,
    ToolThreadsOpt,
    _client,
    _fail,
    _stop_message,
    command,
    err_console,
    listening_socket,
    ui_base,
    worker_options,
)
from relaykit.client import (
    DEFAULT_TASK_QUEUE,
)
from relaykit.errors import RelaykitError, RunFailed
from relaykit.worker import DEFAULT_GRACEFUL_SHUTDOWN, DEFAULT_STICKY_TIMEOUT, DEFAULT_TOOL_THREADS


@command
async def worker(
    target: Annotated[
        list[str],
        typer.Argument(
            help="MODULE or MODULE:ATTR (an agent or a list of agents); several may be given"
        ),
    ],
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    max_cached_workflows: CacheOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
    deployment: Annotated[
        str | None,
        typer.Option(
            "--deployment",
            help="Worker deployment name (default: RELAYKIT_DEPLOYMENT); "
            "with --build-id, runs are pinned to this worker's build",
        ),
    ] = None,
    build_id: Annotated[
        str | None,
        typer.Option(
            "--build-id", help="Build id of this worker's code (default: RELAYKIT_BUILD_ID)"
        ),
    ] = None,
    upgrade_on_continue_as_new: Annotated[
        bool,
        typer.Option(
            "--upgrade-on-continue-as-new",
            help="Long runs move to the deployment's current build at their next continue-as-new",
        ),
    ] = False,
    model_limit: Annotated[
        list[str] | None,
        typer.Option(
            "--model-limit",
            help="PROVIDER=CONCURRENT[,RATE/s] (repeatable), e.g. openai=8,20/s: at most 8 calls "
            "at once on this worker, 20 a second across the cluster (default: "
            "RELAYKIT_MODEL_LIMITS)",
        ),
    ] = None,
    models_only: Annotated[
        bool,
        typer.Option(
            "--models-only",
            help="Serve only the model calls of these agents (their provider queues), no runs",
        ),
    ] = False,
) -> None:
    """Run a worker serving the agents of a module (and every agent they reach).

    Agents without a model get the same one `relaykit dev` would pick (RELAYKIT_MODEL, provider
    keys, else the scripted stand-in; RELAYKIT_MODEL=local for the bundled tiny model); the
    first lines say which.
    SIGTERM or Ctrl-C stops it gracefully: it takes no new work, lets calls in flight finish
    (up to --graceful-shutdown seconds) and exits, so a rolling restart stalls no run."""
    from relaykit.dev import run_worker
    from relaykit.loading import load_agents
    from relaykit.models.queues import parse_limit
    from relaykit.versioning import deployment_config

    for one in target:  # a bad module fails before anything connects
        load_agents(one)
    deployment_config(deployment, build_id)  # so does a bad deployment name
    limits = dict(parse_limit(entry) for entry in model_limit or ())  # and a bad limit
    client = await _client(address, namespace)
    await run_worker(
        target,
        client=client,
        task_queue=task_queue,
        on_signal=_stop_message(graceful_shutdown),
        deployment=deployment,
        build_id=build_id,
        upgrade_on_continue_as_new=upgrade_on_continue_as_new,
        model_limits=limits or None,
        models_only=models_only,
        **worker_options(
            tool_threads,
            max_concurrent_activities,
            sticky_timeout,
            graceful_shutdown,
            max_cached_workflows,
        ),
    )
    err_console.print("worker stopped")


@command
async def codec_server(
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port to listen on (0: any free port)")
    ] = 8081,
    host: Annotated[str, typer.Option(help="Interface to listen on")] = "127.0.0.1",
    origin: Annotated[
        list[str] | None,
        typer.Option(
            help="Browser origin allowed to call it (repeatable; default: the Temporal "
            "UI on 127.0.0.1/localhost:8233 and :8080 and RELAYKIT_UI_URL)"
        ),
    ] = None,
) -> None:
    """Serve the codec RELAYKIT_CODEC names over Temporal's remote codec protocol, so the
    Temporal UI and `temporal --codec-endpoint` show decoded payloads. Set
    RELAYKIT_CODEC_AUTH to require that exact Authorization header."""
    from urllib.parse import urlsplit

    from relaykit.codec import (
        CODEC_AUTH_ENV,
        CODEC_ENV,
        DEFAULT_UI_ORIGINS,
        codec_app,
        codec_from_env,
    )

    codec = codec_from_env()
    if codec is None:
        raise RelaykitError(
            f"no codec to serve: {CODEC_ENV} is not set", hint="set it to module:attr"
        )
    try:
        import uvicorn
    except ImportError:
        raise RelaykitError(
            "the codec server needs uvicorn and starlette", hint="pip install 'relaykit[codec]'"
        ) from None
    origins = list(origin or DEFAULT_UI_ORIGINS)
    if not origin and os.environ.get("RELAYKIT_UI_URL"):
        parts = urlsplit(ui_base())
        origins.append(f"{parts.scheme}://{parts.netloc}")
    app_ = codec_app(codec, origins=origins, authorization=os.environ.get(CODEC_AUTH_ENV) or None)
    sock, url = listening_socket(host, port)
    auth = " (Authorization required)" if os.environ.get(CODEC_AUTH_ENV) else ""
    err_console.print(f"codec server on {url}{auth} for {type(codec).__name__}", highlight=False)
    err_console.print(
        f"[dim]temporal workflow show --codec-endpoint {url} …; Temporal UI: codec endpoint "
        f"{url}[/dim]",
        highlight=False,
    )
    import logging

    from relaykit import codec as codec_module

    refusals = logging.StreamHandler(sys.stderr)  # uvicorn configures only its own loggers
    refusals.setFormatter(logging.Formatter("%(asctime)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    codec_module.logger.addHandler(refusals)
    codec_module.logger.setLevel(logging.INFO)
    server = uvicorn.Server(uvicorn.Config(app_, log_level="warning", lifespan="off"))
    await server.serve(sockets=[sock])


@command
async def gc(
    retention: Annotated[
        str | None,
        typer.Option(
            "--retention",
            help="Keep runs closed less than this long (default RELAYKIT_STORE_RETENTION or 7d)",
        ),
    ] = None,
    store: Annotated[
        str | None, typer.Option("--store", help="Store URL (default RELAYKIT_STORE)")
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Only say what would be deleted")
    ] = False,
    address: AddressOpt = None,
    namespace: NamespaceOpt = None,
) -> None:
    """Delete stored transcripts and payloads of runs that closed longer ago than the retention."""
    from relaykit.retention import collect_garbage, parse_duration
    from relaykit.storage import Store

    kept_for = parse_duration(retention) if retention else None  # bad input before connecting
    target = Store(store)
    target.check()
    client = await _client(address, namespace)
    report = await collect_garbage(target, client, retention=kept_for, dry_run=dry_run)
    verb = "would delete" if dry_run else "deleted"
    for run_id, count in sorted(report.deleted.items()):
        print(f"{verb} {run_id}: {count} objects")
    for run_id, why in sorted(report.kept.items()):
        print(f"kept {run_id}: {why}")
    print(f"{target.location}: {verb} {len(report.deleted)} runs, kept {len(report.kept)}")


def dev(
    target: Annotated[
        str, typer.Argument(help="MODULE[:ATTR] whose agents the worker serves")
    ] = "examples.demo",
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[
        str, typer.Option(help="Where the server keeps its SQLite file")
    ] = ".relaykit",
    task_queue: TaskQueueOpt = DEFAULT_TASK_QUEUE,
    tool_threads: ToolThreadsOpt = DEFAULT_TOOL_THREADS,
    max_concurrent_activities: MaxActivitiesOpt = None,
    max_cached_workflows: CacheOpt = None,
    sticky_timeout: StickyOpt = DEFAULT_STICKY_TIMEOUT.total_seconds(),
    graceful_shutdown: GraceOpt = DEFAULT_GRACEFUL_SHUTDOWN.total_seconds(),
) -> None:
    """Start the embedded Temporal server (with its UI) and a worker; Ctrl-C or SIGTERM stops
    both, the worker gracefully first."""
    from relaykit.dev import run_dev

    options = worker_options(
        tool_threads,
        max_concurrent_activities,
        sticky_timeout,
        graceful_shutdown,
        max_cached_workflows,
    )
    try:
        asyncio.run(
            run_dev(
                target,
                port=port,
                ui_port=ui_port,
                data_dir=data_dir,
                task_queue=task_queue,
                worker_options=options,
            )
        )
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C or SIGTERM while starting
        err_console.print("stopped")
    except RelaykitError as exc:
        _fail(str(exc))


def demo(
    port: Annotated[int, typer.Option(help="Temporal frontend port")] = 7233,
    ui_port: Annotated[int, typer.Option(help="Temporal UI port")] = 8233,
    data_dir: Annotated[
        str, typer.Option(help="Where the server keeps its SQLite file")
    ] = ".relaykit",
    stay: Annotated[
        bool | None, typer.Option("--stay/--exit", help="Keep the server and UI up afterwards")
    ] = None,
    model: Annotated[
        str | None,
        typer.Option(
            help="Model to play the demo (as RELAYKIT_MODEL: openai:gpt-4.1, local, …); "
            "default: the deterministic scripted stand-in unless a provider is configured"
        ),
    ] = None,
) -> None:
    """Run the quick-start demo: embedded server, two worker processes and one multi-step run
    whose first worker is killed mid-run."""
    from relaykit.demo import run_demo

    try:
        asyncio.run(run_demo(port=port, ui_port=ui_port, data_dir=data_dir, stay=stay, model=model))
    except (KeyboardInterrupt, asyncio.CancelledError):  # Ctrl-C or SIGTERM
        err_console.print("stopped")
    except RunFailed as exc:
        _fail(f"run failed ({exc.type or 'error'}): {exc.message}")
    except RelaykitError as exc:
        _fail(str(exc))
