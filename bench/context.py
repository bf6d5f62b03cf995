"""What every scenario shares: the settings, the Temporal client, the model server, long-lived
workers, and one way to start, answer and time runs of either system."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle, WorkflowHistory

from relaykit import start_run
from relaykit.client import RunHandle
from relaykit.runs import RunInput, RunResult
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW, MODEL_ACTIVITY

from bench import agents
from bench.floor import FLOOR_MODEL
from bench.history import HistoryStats, history_stats
from bench.procs import Child, children_of, commit, cpu_seconds, memory_kb
from bench.report import SYSTEMS, Results

T = TypeVar("T")

MODEL_ACTIVITY_OF = {"relaykit": MODEL_ACTIVITY, "floor": FLOOR_MODEL}


def supports_transport() -> bool:
    """Whether this relaykit lets a run choose how the transcript reaches the model."""
    return "transcript_transport" in RunInput.model_fields


def supports_signalled_approvals() -> bool:
    """Whether this relaykit answers approvals by a checked signal (``approve(wait=False)``)."""
    import inspect

    return "wait" in inspect.signature(RunHandle.approve).parameters


RUN_TIMEOUT = 900.0


@dataclass
class Settings:
    quick: bool = False
    latency_ms: float = 0.0
    response_bytes: int = 100
    idle_runs: int | None = None
    throughput_runs: int | None = None
    """Concurrent runs of the throughput scenario (``None``: ``THROUGHPUT_RUNS``)."""
    reps: int | None = None
    """Overrides every scenario's repetition count when set."""
    max_cached_workflows: int | None = None
    """Sticky cache size of both workers (``None``: the Temporal SDK's default, 1000)."""
    model_on_run_queue: bool = False
    """relaykit's model calls on the run queue (docs/fleet.md) instead of the provider queue."""
    floor_lean_runner: bool = False
    """The floor's worker on relaykit's sandbox runner (``relaykit/sandbox.py``), not the stock
    one: a reference for what that runner alone saves a bare workflow."""
    floor_http: bool = False
    """The floor's model activity makes relaykit's HTTP call (``bench.floor``): a reference for
    what the model call itself costs, not the targets' floor."""
    server_args: tuple[str, ...] = ()
    """More ``temporal server start-dev`` arguments (``bench.server_work``: ``--metrics-port``)."""
    floor_extra: str = ""
    """One kind of command the floor's approval workflow adds before its wait
    (``bench.floor.APPROVAL_EXTRAS``; empty: none)."""

    def repetitions(self, full: int, quick: int) -> int:
        if self.reps is not None:
            return self.reps
        return quick if self.quick else full

    @property
    def idle_n(self) -> int:
        if self.idle_runs is not None:
            return self.idle_runs
        return 100 if self.quick else 1000


def rounds(reps: int) -> Iterable[tuple[int, tuple[str, ...]]]:
    """Round-robin order: each round runs both systems, alternating which goes first."""
    for rep in range(reps):
        yield rep, SYSTEMS if rep % 2 == 0 else tuple(reversed(SYSTEMS))


async def gather_limited(
    factory: Callable[[Any], Awaitable[T]], items: Iterable[Any], limit: int
) -> list[T]:
    semaphore = asyncio.Semaphore(limit)

    async def one(item: Any) -> T:
        async with semaphore:
            return await factory(item)

    return await asyncio.gather(*(one(item) for item in items))


@dataclass
class Worker:
    system: str
    child: Child
    task_queue: str

    @property
    def pid(self) -> int:
        return self.child.pid

    def stop(self) -> None:
        self.child.stop()


@dataclass
class CpuMeter:
    """CPU seconds used by the worker, the Temporal server and the model server over a span."""

    pids: dict[str, int]
    start: dict[str, float] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.start = {name: cpu_seconds(pid) for name, pid in self.pids.items()}

    def used(self) -> dict[str, float]:
        return {name: cpu_seconds(pid) - self.start[name] for name, pid in self.pids.items()}


class Bench:
    def __init__(
        self,
        settings: Settings,
        client: Client,
        address: str,
        model_url: str,
        server_pid: int | None,
        model_pid: int,
        results: Results,
        workdir: str,
    ) -> None:
        self.settings = settings
        self.client = client
        self.address = address
        self.model_url = model_url
        self.server_pid = server_pid
        self.model_pid = model_pid
        self.results = results
        self.workdir = workdir
        """Scratch directory: the workers' current directory and transcript store."""
        self._workers: dict[str, Worker] = {}
        self.histories: dict[tuple[str, int], list[WorkflowHistory]] = {}
        """(system, K) -> the history chain of a finished ``turns=K`` run."""

    # --- workers ------------------------------------------------------------------------------

    def start_worker(self, system: str) -> Worker:
        task_queue = f"bench-{system}-{uuid.uuid4().hex[:8]}"
        args = ["-m", "bench.worker", system, "--address", self.address, "--task-queue", task_queue]
        if self.settings.max_cached_workflows is not None:
            args += ["--max-cached-workflows", str(self.settings.max_cached_workflows)]
        if system == "relaykit":
            args += ["--model-url", self.model_url]
            if self.settings.model_on_run_queue:
                args.append("--model-on-run-queue")
        else:
            args += ["--latency-ms", str(self.settings.latency_ms)]
            if self.settings.floor_lean_runner:
                args.append("--lean-runner")
            if self.settings.floor_http:
                args += ["--http-model", "--model-url", self.model_url]
                args += ["--response-bytes", str(self.settings.response_bytes)]
        child = Child(
            f"{system}-worker",
            args,
            cwd=self.workdir,
            env={"RELAYKIT_TRANSCRIPT_DIR": os.path.join(self.workdir, "transcripts")},
        ).start()
        return Worker(system, child, task_queue)

    def worker(self, system: str) -> Worker:
        """The long-lived worker of ``system`` (started on first use)."""
        if system not in self._workers:
            self._workers[system] = self.start_worker(system)
        return self._workers[system]

    def stop_workers(self) -> None:
        for worker in self._workers.values():
            worker.stop()
        self._workers.clear()

    def cpu_meter(self, worker: Worker) -> CpuMeter:
        pids = {"worker": worker.pid, "model_server": self.model_pid}
        if self.server_pid is not None:
            pids["temporal_server"] = self.server_pid
        return CpuMeter(pids)

    @staticmethod
    def rss_mb(worker: Worker) -> dict[str, float]:
        return {key: value / 1024 for key, value in memory_kb(worker.pid).items()}

    # --- runs ---------------------------------------------------------------------------------

    def _id(self, system: str, what: str) -> str:
        return f"{system}-{what}-{uuid.uuid4().hex[:10]}"

    async def start_turns(
        self, worker: Worker, k: int, *, transport: str | None = None
    ) -> WorkflowHandle[Any, Any]:
        """Start a ``turns=K`` run; ``transport`` picks relaykit's transcript transport
        (``"inline"`` or ``"stored"``) instead of its default."""
        if worker.system == "relaykit" and transport is not None:
            return await self.client.start_workflow(
                AGENT_RUN_WORKFLOW,
                RunInput(
                    agent="looper",
                    input=agents.turns_task(k),
                    max_turns=k + 5,
                    transcript_transport=transport,  # type: ignore[call-arg]
                ),
                id=self._id(f"relaykit-{transport}", f"k{k}"),
                task_queue=worker.task_queue,
                result_type=RunResult,
            )
        if worker.system == "relaykit":
            run = await start_run(
                self.client,
                "looper",
                agents.turns_task(k),
                task_queue=worker.task_queue,
                id=self._id("relaykit", f"k{k}"),
                max_turns=k + 5,
            )
            return run.workflow
        return await self.client.start_workflow(
            "FloorRun", k, id=self._id("floor", f"k{k}"), task_queue=worker.task_queue,
            result_type=str,
        )

    async def start_fanout(self, worker: Worker, n: int) -> WorkflowHandle[Any, Any]:
        if worker.system == "relaykit":
            run = await start_run(
                self.client, "fanout", agents.fanout_task(n), task_queue=worker.task_queue,
                id=self._id("relaykit", "fanout"),
            )
            return run.workflow
        return await self.client.start_workflow(
            "FloorFanout", n, id=self._id("floor", "fanout"), task_queue=worker.task_queue,
            result_type=str,
        )

    async def start_background(self, worker: Worker, n: int) -> WorkflowHandle[Any, Any]:
        if worker.system == "relaykit":
            run = await start_run(
                self.client, "spawner", agents.spawn_task(n), task_queue=worker.task_queue,
                id=self._id("relaykit", "spawn"),
            )
            return run.workflow
        return await self.client.start_workflow(
            "FloorBackground", n, id=self._id("floor", "spawn"), task_queue=worker.task_queue,
            result_type=str,
        )

    async def start_approval(self, worker: Worker) -> WorkflowHandle[Any, Any]:
        if worker.system == "relaykit":
            run = await start_run(
                self.client, "approver", agents.APPROVE_TASK, task_queue=worker.task_queue,
                id=self._id("relaykit", "approve"),
            )
            return run.workflow
        return await self.client.start_workflow(
            "FloorApproval", args=[self.settings.floor_extra] if self.settings.floor_extra else [],
            id=self._id("floor", "approve"), task_queue=worker.task_queue, result_type=str,
        )

    async def answer_approval(self, system: str, handle: WorkflowHandle[Any, Any]) -> None:
        """relaykit: checked against the run's waiting calls, then signalled (``wait=False``),
        where this relaykit has it; before, by the ``approve`` update."""
        if system == "relaykit":
            if supports_signalled_approvals():
                await RunHandle(handle).approve(agents.APPROVAL_CALL_ID, wait=False, by="bench")
            else:
                await RunHandle(handle).approve(agents.APPROVAL_CALL_ID)
        else:
            await handle.signal("approve")

    async def answer_all(
        self, system: str, worker: Worker, handles: list[WorkflowHandle[Any, Any]]
    ) -> None:
        """Answer every parked run. relaykit, where it has the bulk path: ``relaykit approve
        --all``'s (one visibility listing of the waiting runs and their waiting calls, then a
        signal each); the floor and an older relaykit: one request per run, 100 at a time."""
        if system == "relaykit" and supports_signalled_approvals():
            from relaykit.bulk_approvals import ANSWERED, answer_waiting

            query = f"TaskQueue = '{worker.task_queue}'"
            answers = await answer_waiting(self.client, query, by="bench", concurrency=100)
            answered = sum(answer.status == ANSWERED for answer in answers)
            if answered != len(handles):
                raise RuntimeError(f"answered {answered} of {len(handles)} parked runs")
            return
        await gather_limited(lambda h: self.answer_approval(system, h), handles, 100)

    @staticmethod
    async def result(handle: WorkflowHandle[Any, Any], timeout: float = RUN_TIMEOUT) -> Any:
        return await asyncio.wait_for(handle.result(), timeout)

    async def timed(self, start: Awaitable[WorkflowHandle[Any, Any]]) -> tuple[float, Any]:
        """Seconds from the start request to the result, and the handle."""
        began = time.perf_counter()
        handle = await start
        await self.result(handle)
        return time.perf_counter() - began, handle

    async def history_chain(self, handle: WorkflowHandle[Any, Any]) -> list[WorkflowHistory]:
        """The histories of a finished workflow's runs, first to last (following
        continue-as-new)."""
        run_id = handle.first_execution_run_id or handle.run_id
        chain: list[WorkflowHistory] = []
        while True:
            history = await self.client.get_workflow_handle(handle.id, run_id=run_id).fetch_history()
            chain.append(history)
            last = history.events[-1]
            if last.event_type != EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW:
                return chain
            run_id = last.workflow_execution_continued_as_new_event_attributes.new_execution_run_id

    async def history(
        self, system: str, handle: WorkflowHandle[Any, Any]
    ) -> tuple[list[WorkflowHistory], HistoryStats]:
        chain = await self.history_chain(handle)
        events = [event for history in chain for event in history.events]
        model_activity = MODEL_ACTIVITY_OF["floor" if system == "floor" else "relaykit"]
        return chain, history_stats(events, model_activity, runs=len(chain))


@contextlib.asynccontextmanager
async def standalone_bench(
    settings: Settings, name: str, results: Results | None = None
) -> AsyncIterator[Bench]:
    """A :class:`Bench` on servers of its own: an in-memory dev server, the scripted model
    server (answering as ``settings`` say) and a scratch directory, all gone on the way out,
    with every worker the bench started."""
    from temporalio.contrib.pydantic import pydantic_data_converter

    from relaykit.devserver import DevServer

    workdir = tempfile.mkdtemp(prefix=f"relaykit-bench-{name}-")
    model = Child(
        "model-server",
        ["-m", "bench.model_server", "--latency-ms", str(settings.latency_ms),
         "--response-bytes", str(settings.response_bytes)],
    )
    try:
        async with DevServer(
            port=0, headless=True, in_memory=True, extra_args=settings.server_args
        ) as server:
            server_pid = next((pid for pid, what in children_of() if what == "temporal"), None)
            model.start()
            client = await Client.connect(
                server.address, namespace=server.namespace, data_converter=pydantic_data_converter
            )
            bench = Bench(
                settings, client, server.address, model.info, server_pid, model.pid,
                results if results is not None else Results(), workdir,
            )
            try:
                yield bench
            finally:
                bench.stop_workers()
    finally:
        model.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def side_by_side(
    name: str,
    measure_system: Callable[[Bench, str], Awaitable[Any]],
    settings: Settings | None = None,
    reps: int = 1,
    **options: Any,
) -> dict[str, Any]:
    """``measure_system(bench, system)`` for relaykit, then the floor, on one standalone bench
    (with ``settings``, the defaults if none); with ``options`` (the command's), the commit, the
    time taken and the load average around it, as the benchmarks that run alone print them.

    With ``reps`` above 1, each system is measured that many times, the order alternating from
    round to round (:func:`rounds`): the one measured second runs on a server that has just
    held the other's runs. Each system's figures are then the list of its rounds."""
    load_before = os.getloadavg()[0]
    began = time.time()
    measured: dict[str, list[Any]] = {system: [] for system in SYSTEMS}
    async with standalone_bench(settings or Settings(), name) as bench:
        for _, order in rounds(reps):
            for system in order:
                measured[system].append(await measure_system(bench, system))
    figures = {system: found[0] if reps == 1 else found for system, found in measured.items()}
    return {
        **options,
        "commit": commit(),
        "seconds": round(time.time() - began, 1),
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        **figures,
    }
