"""The worker: one process that serves an agent graph on a task queue.

It registers the ``AgentRun`` workflow, the model activity, the local activity that records a
run's decisions, and one activity per tool (named after the tool) and per ``on_handoff``
callback. The workflow sandbox stays on; the ``relaykit`` package
is passed through it so workflow code sees the same agent objects the worker was given.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import os
import signal
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from temporalio.client import Client
from temporalio.worker import Worker as TemporalWorker

from relaykit import registry
from relaykit.activities.decisions import record_decisions
from relaykit.activities.delivery import deliver_report
from relaykit.activities.gone_tools import gone_tool
from relaykit.activities.heartbeats import AttemptHeartbeats
from relaykit.activities.model_call import ModelActivities
from relaykit.activities.tool_activities import handoff_activity, tool_activity
from relaykit.agent import Agent
from relaykit.errors import ConfigurationError
from relaykit.graph import AgentGraph
from relaykit.models.queues import ModelLimit, limit_for, limits_from_env, model_queue, parse_limits
from relaykit.models.spec import ModelSpec, parse_model
from relaykit.payload_conversion import shared_payload_conversion
from relaykit.payload_storage import with_external_storage
from relaykit.sandbox import sandbox_runner
from relaykit.schedule_options import task_queue_name
from relaykit.search_attributes import upsert_choices
from relaykit.storage import Store
from relaykit.streaming import DEFAULT_DELTA_INTERVAL
from relaykit.tools import MAX_OFFLOADED_TOOL_RESULT_BYTES, MAX_TOOL_RESULT_BYTES
from relaykit.tracing import has_tracing_interceptor, tracing_enabled, worker_interceptors
from relaykit.transcripts import TranscriptStore
from relaykit.versioning import deployment_config
from relaykit.workflows.agent_run import AgentRun

DEFAULT_TASK_QUEUE = "relaykit"
DEFAULT_TOOL_THREADS = 32
"""Threads of the pool sync tools run on (one pool per worker, shared by nothing else)."""
DEFAULT_STICKY_TIMEOUT = timedelta(seconds=3)
"""How long a run's next workflow task waits for the worker that has the run cached before any
worker may take it. Temporal's 10 s is what every run on a crashed worker loses; replaying a
run elsewhere costs far less."""
TEMPORAL_MAX_CACHED_WORKFLOWS: int = (
    inspect.signature(TemporalWorker).parameters["max_cached_workflows"].default
)
"""Temporal's own bound on the runs a worker keeps in memory between their steps (read from its
worker, so it stays Temporal's)."""
DEFAULT_GRACEFUL_SHUTDOWN = timedelta(seconds=10)
"""How long ``relaykit worker`` and ``relaykit dev`` let calls in flight finish on SIGTERM or
Ctrl-C before cancelling them (cancelled calls are retried on another worker)."""


def default_model_from_env() -> ModelSpec | None:
    value = os.environ.get("RELAYKIT_MODEL")
    # "scripted" names the CLI's stand-in (a server `relaykit worker`/`dev` start), not a model
    # an OpenAI-compatible endpoint serves; relaykit.dev.serve_default_model resolves it.
    return parse_model(value) if value and value != "scripted" else None


class Worker:
    """Serve ``agents`` (and every agent they reach) on ``task_queue``.

    ``default_model`` serves agents defined without a model; it defaults to ``RELAYKIT_MODEL``.
    ``store`` is where model calls keep transcript prefixes and where payloads too large for
    Temporal history go (a :class:`~relaykit.storage.Store` or its URL; else the directory
    ``transcript_dir``; else ``RELAYKIT_STORE``, ``RELAYKIT_TRANSCRIPT_DIR`` or
    ``.relaykit/store``). Workers serving the same runs should share it: a bucket, or a
    directory on one machine (see :mod:`relaykit.storage`). The store encodes with the client's
    payload codec, so an encrypting codec also covers what is stored.
    Extra ``workflows``/``activities`` let you run your own workflows (which may call
    :func:`relaykit.run_agent`) on the same worker.

    ``tracing`` turns on OpenTelemetry spans (default: ``RELAYKIT_TRACING``; see
    :mod:`relaykit.tracing`), sent with ``tracer`` or the global tracer provider.
    Agents' MCP servers (:class:`relaykit.MCPServer`) get one session per server in this worker:
    stdio servers are subprocesses started on first use and stopped with the worker.
    ``delta_interval`` is how often a streaming model call sends the text written so far to the
    Temporal server, where clients watching the run read it (:mod:`relaykit.streaming`): lower
    is livelier, and costs one heartbeat RPC per interval per streaming call, no history.

    ``deployment`` and ``build_id`` (default ``RELAYKIT_DEPLOYMENT`` and ``RELAYKIT_BUILD_ID``)
    make this a versioned worker of Temporal's Worker Deployment Versioning: runs it starts are
    pinned to its build until they end, and the worker does not make its build current by
    itself (:mod:`relaykit.versioning`, docs/deploy.md). ``upgrade_on_continue_as_new`` moves
    long runs to the deployment's current build at their next continue-as-new.

    ``tool_threads`` sizes the pool sync tools run on; the worker owns it, and nothing else
    uses it, so hung tools can stall only other sync tools, never model calls or the transcript
    store. ``sticky_queue_schedule_to_start_timeout`` (default :data:`DEFAULT_STICKY_TIMEOUT`),
    ``max_concurrent_activities`` and ``graceful_shutdown_timeout`` (default Temporal's: none;
    the CLI uses :data:`DEFAULT_GRACEFUL_SHUTDOWN`) are Temporal worker options, as is anything
    else passed as a keyword.

    ``max_cached_workflows`` (default Temporal's, :data:`TEMPORAL_MAX_CACHED_WORKFLOWS`) bounds
    the runs the worker keeps in memory between their steps, and so its memory: a waiting run
    not kept costs almost nothing, and replays its history on its next step (docs/fleet.md,
    "Sizing workers"). 0 keeps none.

    Model calls of new runs run on their provider's task queue (``<task_queue>.model.<provider>``
    or ``ModelSpec.task_queue``; :mod:`relaykit.models.queues`), which this worker polls too, for
    every model of the agents it serves. ``model_limits`` (``{"openai": "8,20/s"}``, keyed by
    provider or queue; default ``RELAYKIT_MODEL_LIMITS``, then ``ModelSpec.concurrent`` and
    ``ModelSpec.per_second``) caps each provider queue: that many calls at once on this worker,
    that many a second across the cluster. ``models_only`` makes a dedicated model worker: it
    polls the provider queues only, not the run queue. A model whose ``task_queue`` is this
    worker's own queue is served with the workflows, and may have no limits (docs/fleet.md).
    """

    def __init__(
        self,
        client: Client,
        agents: Agent | Sequence[Agent],
        *,
        task_queue: str = DEFAULT_TASK_QUEUE,
        default_model: str | ModelSpec | None = None,
        workflows: Sequence[type] = (),
        activities: Sequence[Any] = (),
        search_attributes: bool | None = None,
        transcript_dir: str | os.PathLike[str] | None = None,
        store: Store | str | None = None,
        event_groups: bool = False,
        tracing: bool | None = None,
        tracer: Any = None,
        delta_interval: timedelta = DEFAULT_DELTA_INTERVAL,
        tool_threads: int = DEFAULT_TOOL_THREADS,
        sticky_queue_schedule_to_start_timeout: timedelta = DEFAULT_STICKY_TIMEOUT,
        max_concurrent_activities: int | None = None,
        max_cached_workflows: int | None = None,
        graceful_shutdown_timeout: timedelta | None = None,
        deployment: str | None = None,
        build_id: str | None = None,
        upgrade_on_continue_as_new: bool = False,
        model_limits: dict[str, ModelLimit | str] | None = None,
        models_only: bool = False,
        **worker_options: Any,
    ) -> None:
        if tool_threads < 1:
            raise ConfigurationError(f"tool_threads must be at least 1, got {tool_threads}")
        if max_cached_workflows is not None and max_cached_workflows < 0:
            raise ConfigurationError(
                f"max_cached_workflows cannot be negative, got {max_cached_workflows}"
            )
        if not task_queue_name(task_queue, "the worker's task_queue"):
            raise ConfigurationError("the worker's task_queue is empty", hint="name a task queue")
        roots = [agents] if isinstance(agents, Agent) else list(agents)
        model = parse_model(default_model) if default_model else default_model_from_env()
        self.graph = AgentGraph.build(roots, default_model=model)
        codec = client.data_converter.payload_codec
        if isinstance(store, Store):
            self.store = store.with_codec(codec) if store.codec is None else store
        else:
            self.store = Store(store or transcript_dir, codec=codec)
        # Large payloads go to the store instead of failing at Temporal's 2 MB limit, and the
        # payload converter every cached run builds shares its encoders with the others.
        converter = shared_payload_conversion(
            with_external_storage(client.data_converter, self.store)
        )
        if converter is not client.data_converter:
            config = client.config()
            config["data_converter"] = converter
            client = Client(**config)
        self.client = client
        self.max_tool_result_bytes = (
            MAX_OFFLOADED_TOOL_RESULT_BYTES
            if client.data_converter.external_storage is not None
            else MAX_TOOL_RESULT_BYTES
        )
        """The encoded size past which tool results are cut (larger when payloads offload)."""
        self.task_queue = task_queue
        self._workflows = list(workflows)
        self._activities = list(activities)
        self._search_attributes = search_attributes
        self._tracing = tracing_enabled(tracing)
        self._tracer = tracer
        self._delta_interval = delta_interval
        self.transcripts = TranscriptStore(self.store)
        self.graph.event_groups = event_groups
        worker_options["sticky_queue_schedule_to_start_timeout"] = (
            sticky_queue_schedule_to_start_timeout
        )
        if max_concurrent_activities is not None:
            worker_options["max_concurrent_activities"] = max_concurrent_activities
        if max_cached_workflows is not None:
            worker_options["max_cached_workflows"] = max_cached_workflows
        self.max_cached_workflows = worker_options.get(
            "max_cached_workflows", TEMPORAL_MAX_CACHED_WORKFLOWS
        )
        """How many runs this worker keeps in memory between their steps."""
        versioned = deployment_config(deployment, build_id)
        if versioned is not None:
            worker_options["deployment_config"] = versioned
        self.build = versioned.version if versioned is not None else None
        """The deployment version this worker serves, or ``None`` when unversioned."""
        self.graph.upgrade_on_continue_as_new = upgrade_on_continue_as_new and versioned is not None
        if graceful_shutdown_timeout is not None:
            worker_options["graceful_shutdown_timeout"] = graceful_shutdown_timeout
        self._options = worker_options
        self._tool_threads = tool_threads
        self._tool_executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._model_activities: ModelActivities | None = None
        self.mcp_sessions: Any = None
        """The worker's MCP sessions (:class:`relaykit.activities.mcp_activities.MCPSessions`)."""
        self._worker: TemporalWorker | None = None
        self._model_limits = parse_limits(model_limits)
        self._env_limits = limits_from_env()
        self.models_only = models_only
        self._model_workers: list[TemporalWorker] = []
        self._separate_model_queues()  # a model on this worker's own queue: refused here, or served

    def _separate_model_queues(self) -> dict[str, ModelLimit]:
        """The provider queues this worker polls besides its own task queue.

        A model whose ``task_queue`` is this worker's own queue is served by the worker that
        runs the workflows (Temporal then hands each call over with the workflow task that
        scheduled it). Such a model can have no limits of its own, which would hold every
        activity of the queue, and a ``models_only`` worker has nothing to poll for it."""
        queues = self.model_queues()
        for queue in queues:  # a derived name the server refuses would wedge every run
            shown = queue if len(queue) <= 40 else f"{queue[:40]}…"
            task_queue_name(queue, f"a model queue of this worker ({shown})")
        shared = queues.pop(self.task_queue, None)
        if shared is None:
            return queues
        names = sorted(
            agent.name
            for agent in self.graph.agents.values()
            if model_queue(self.graph.model_for(agent), self.task_queue) == self.task_queue
        )
        if shared.concurrent is not None or shared.per_second is not None:
            raise ConfigurationError(
                f"the model of {', '.join(names)} runs on this worker's own task queue "
                f"{self.task_queue!r}, so it cannot have limits ({shared}): they would hold "
                "every activity of the queue; give the model a task_queue of its own"
            )
        if self.models_only:
            raise ConfigurationError(
                f"the model of {', '.join(names)} runs on this worker's own task queue "
                f"{self.task_queue!r}: a models-only worker has no queue of its own to poll "
                "for it; give the model a task_queue of its own, or run a full worker"
            )
        return queues

    def model_queues(self) -> dict[str, ModelLimit]:
        """The provider queues of the agents this worker serves, with their limits."""
        queues: dict[str, ModelLimit] = {}
        for agent in self.graph.agents.values():
            spec = self.graph.model_for(agent)
            queue = model_queue(spec, self.task_queue)
            limit = limit_for(spec, queue, self._model_limits, self._env_limits)
            queues[queue] = queues[queue].over(limit) if queue in queues else limit
        return queues

    def _model_worker(self, queue: str, limit: ModelLimit, options: dict[str, Any]) -> Any:
        """A worker polling one provider queue for model calls only."""
        assert self._model_activities is not None
        keep = ("interceptors", "max_heartbeat_throttle_interval", "graceful_shutdown_timeout")
        own = {k: v for k, v in options.items() if k in keep}
        if limit.concurrent is not None:
            own["max_concurrent_activities"] = limit.concurrent
        if limit.per_second is not None:
            own["max_task_queue_activities_per_second"] = limit.per_second
        if "deployment_config" in options:
            own["deployment_config"] = options["deployment_config"]
        return TemporalWorker(
            self.client, task_queue=queue, activities=[self._model_activities.model_call], **own
        )

    @property
    def _all_workers(self) -> list[TemporalWorker]:
        main = [] if self._worker is None or self.models_only else [self._worker]
        return [*main, *self._model_workers]

    async def _build(self) -> TemporalWorker:
        if self._worker is not None:
            return self._worker
        graph = self.graph
        (
            graph.search_attributes,
            graph.cost_attribute,
            graph.list_attributes,
            graph.waiting_calls_attribute,
        ) = await upsert_choices(self.client, self._search_attributes)
        if any(
            self.graph.model_for(agent).provider == "local" for agent in self.graph.agents.values()
        ):
            from relaykit.models.local_server import ensure_local_server

            ensure_local_server()
        self.store.check()  # a bad RELAYKIT_STORE fails here, not in every model call
        mcp_activities = self._mcp_activities()  # may refuse: before anything is registered
        registry.register(self.task_queue, self.graph)
        self._model_activities = ModelActivities(transcripts=self.transcripts)
        self._tool_executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._tool_threads, thread_name_prefix=f"relaykit-tool-{self.task_queue}"
        )
        executor = self._tool_executor
        activities: list[Any] = [
            self._model_activities.model_call,
            deliver_report,
            record_decisions,
        ]
        activities.extend(
            tool_activity(t, executor, self.max_tool_result_bytes)
            for t in self.graph.tools.values()
        )
        activities.extend(
            handoff_activity(h, executor, name=name)
            for name, h in self.graph.handoffs.items()
            if h.on_handoff is not None
        )
        activities.extend(self._activities)
        # One dynamic activity: MCP's when the graph has servers (it also answers calls of tools
        # this code no longer defines), else the one for those calls, unless the user has one.
        activities.extend(mcp_activities or ([] if self._own_dynamic() else [gone_tool]))
        options = dict(self._options)
        # Heartbeats carry a streaming model call's text; by default Temporal would send them
        # only every 0.8 x heartbeat timeout (24 s for a model call).
        options.setdefault("max_heartbeat_throttle_interval", self._delta_interval)
        client_interceptors = self.client.config()["interceptors"]
        # Every activity.heartbeat(...) of a tool keeps the attempt's start record.
        options["interceptors"] = [*options.get("interceptors", ()), AttemptHeartbeats()]
        if self._tracing:
            added = worker_interceptors(client_interceptors, self.graph.tools, self._tracer)
            options["interceptors"] = [*added, *options["interceptors"]]
        if self._tracing or has_tracing_interceptor(client_interceptors):
            options.setdefault("workflow_runner", sandbox_runner("opentelemetry"))
        options.setdefault("workflow_runner", sandbox_runner())
        self._model_workers = [
            self._model_worker(queue, limit, options)
            for queue, limit in self._separate_model_queues().items()
        ]
        self._worker = TemporalWorker(
            self.client,
            task_queue=self.task_queue,
            workflows=[AgentRun, *self._workflows],
            activities=activities,
            **options,
        )
        return self._worker

    def _own_dynamic(self) -> bool:
        from temporalio import activity as temporal_activity

        for fn in self._activities:
            defn = temporal_activity._Definition.from_callable(fn)
            if defn is not None and defn.name is None:
                return True
        return False

    def _mcp_activities(self) -> list[Any]:
        """The dynamic activity serving MCP servers' lists and calls, when the graph has any
        (the ``mcp`` package is imported only then)."""
        if not self.graph.mcp_servers:
            return []
        if self._own_dynamic():
            raise ConfigurationError(
                "this worker serves MCP servers, which use the worker's dynamic activity",
                hint="run your dynamic activity on a worker of another task queue",
            )
        try:
            from relaykit.activities.mcp_activities import MCPSessions
        except ImportError as exc:  # pragma: no cover - depends on the installation
            raise ConfigurationError(
                f"agents use MCP servers but the mcp package cannot be imported: {exc}",
                hint="pip install 'relaykit[mcp]'",
            ) from exc
        self.mcp_sessions = MCPSessions(dict(self.graph.mcp_servers))
        return [self.mcp_sessions.activity()]

    async def run(self) -> None:
        """Run until cancelled (or until :meth:`shutdown`)."""
        await self._build()
        try:
            await asyncio.gather(*(w.run() for w in self._all_workers))
        finally:
            await self._close()

    async def run_until_signalled(
        self, on_signal: Callable[[signal.Signals], None] | None = None
    ) -> None:
        """Run until SIGTERM or SIGINT, then stop gracefully: stop polling, give calls in flight
        ``graceful_shutdown_timeout`` to finish, cancel the rest (Temporal retries them on
        another worker) and return. A second signal cancels at once. This is what keeps a
        rolling restart from stalling runs: a killed worker leaves its calls to time out."""
        await self._build()
        workers = self._all_workers
        loop = asyncio.get_running_loop()
        stopping: list[asyncio.Future[Any]] = []
        runner = asyncio.ensure_future(asyncio.gather(*(w.run() for w in workers)))

        def handle(signum: signal.Signals) -> None:
            if on_signal is not None:
                on_signal(signum)
            if not stopping:
                stopping.append(asyncio.gather(*(w.shutdown() for w in workers)))
            else:
                runner.cancel()

        installed = []
        for signum in (signal.SIGTERM, signal.SIGINT):
            try:
                loop.add_signal_handler(signum, handle, signum)
                installed.append(signum)
            except (NotImplementedError, RuntimeError):  # not the main thread, or Windows
                pass
        try:
            await runner
        finally:
            for signum in installed:
                loop.remove_signal_handler(signum)
            await self._close()

    async def shutdown(self) -> None:
        await asyncio.gather(*(w.shutdown() for w in self._all_workers))
        await self._close()

    async def _close(self) -> None:
        registry.unregister(self.task_queue, self.graph)
        if self._model_activities is not None:
            await self._model_activities.aclose()
            self._model_activities = None
        if self.mcp_sessions is not None:  # stops the stdio servers this worker started
            await self.mcp_sessions.aclose()
        if self._tool_executor is not None:
            # Threads of hung sync tools cannot be stopped; they must not delay the shutdown.
            self._tool_executor.shutdown(wait=False, cancel_futures=True)
            self._tool_executor = None

    async def __aenter__(self) -> Worker:
        await self._build()
        entered: list[TemporalWorker] = []
        try:
            for w in self._all_workers:
                await w.__aenter__()
                entered.append(w)
        except BaseException:
            for w in reversed(entered):
                await w.__aexit__(None, None, None)
            raise
        return self

    async def __aexit__(self, *exc_info: Any) -> None:
        assert self._worker is not None
        try:
            for w in reversed(self._all_workers):
                await w.__aexit__(*exc_info)
        finally:
            await self._close()
