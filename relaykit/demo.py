"""``relaykit demo``: one durable run of the travel assistant that survives its worker's death.

The demo shows the promise rather than describing it. Its workers are real processes
(``python -m relaykit.demo worker``), so the crash is a real one: SIGKILL in the middle of the
run, no cleanup, the call in flight lost. A second worker process then takes the run over; it
replays the run's history, so the calls that had finished are not run again, and the run ends
with the same answer it would have had without the crash.

What is printed about who ran what is read from the run's Temporal history, not from the demo's
own bookkeeping: each activity task started event carries the identity (``pid@host``) of the
worker that ran the call, and each workflow task started event the identity of the worker that
replayed the run. At the end the history is checked: no call that finished ran twice.

Where it kills: with the scripted stand-in model (the default when nothing is configured) the
stand-in's server runs in this process, and worker 1 is killed while it waits for the model's
second turn, after the first tool call finished, on every run. With a real model the demo kills
worker 1 as soon as the history shows its first finished tool call. Model calls get a 2 s
heartbeat timeout here, so the server notices the dead worker within seconds (the default, 30 s,
suits slow models on busy machines better than a demo).
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import threading
import uuid
from collections.abc import Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

from temporalio.api.enums.v1 import EventType
from temporalio.client import Client, WorkflowHandle

from relaykit.errors import ConfigurationError
from relaykit.models.spec import ModelSpec
from relaykit.testing.scripted_server import (
    Responder,
    ScriptedModelServer,
    ScriptedRequest,
    Step,
)

DEMO_TARGET = "examples.demo:travel_assistant"
DEMO_TASK_QUEUE = "relaykit-demo"
DEMO_HEARTBEAT_SECONDS = 2.0
"""Heartbeat timeout of the demo's model calls: how soon the killed worker's call is retried."""
DEMO_STICKY_TIMEOUT = timedelta(seconds=1)
"""How long the run's next step waits for the worker that has it cached (the killed one)
before the other worker replays it (workers default to 3 s)."""
MODEL_ENV = "RELAYKIT_DEMO_MODEL"
"""How the demo hands its worker processes the model (a ``ModelSpec`` as JSON: never a key)."""
_READY = "relaykit-demo-worker ready"


# --- the worker process ---------------------------------------------------------------------


async def _serve_demo_agent(task_queue: str, spec: ModelSpec) -> None:
    from examples.demo import travel_assistant
    from relaykit.client import connect
    from relaykit.worker import Worker

    # Imported and waiting: the demo says when to become a worker (see WorkerProcess.serve).
    command = (await asyncio.to_thread(sys.stdin.readline)).split()
    if command[:1] != ["serve"] or len(command) != 2:
        return
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    client = await connect(command[1])
    async with Worker(
        client,
        travel_assistant,
        task_queue=task_queue,
        default_model=spec,
        sticky_queue_schedule_to_start_timeout=DEMO_STICKY_TIMEOUT,
    ):
        # The identity is what the server writes into the history of each call this worker runs.
        print(f"{_READY} {client.identity}", flush=True)
        await stop.wait()  # SIGTERM: the demo is over (SIGKILL: the crash; nothing runs then)


def worker_main(argv: list[str]) -> None:
    """``python -m relaykit.demo worker TASK_QUEUE``, then ``serve ADDRESS`` on stdin: serve the
    demo agent until SIGTERM."""
    (task_queue,) = argv
    spec = ModelSpec.model_validate_json(os.environ[MODEL_ENV])
    # Ctrl-C in the terminal reaches the whole process group: the demo stops its workers itself
    # (SIGTERM: a worker that serves stops gracefully; one still waiting just ends).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_serve_demo_agent(task_queue, spec))


@dataclass
class WorkerProcess:
    """A demo worker process. It is started early and imports relaykit, then waits on its stdin:
    Python's imports take seconds on a busy machine, and the takeover after the crash need not
    wait for them. It connects to Temporal, and becomes a worker, only in :meth:`serve`."""

    number: int
    process: asyncio.subprocess.Process
    log: Path
    identity: str = ""

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def label(self) -> str:
        return f"worker {self.number} (pid {self.pid})"

    async def serve(self, address: str) -> None:
        """Connect to ``address`` and poll the task queue; returns once the worker polls it."""
        assert self.process.stdin is not None and self.process.stdout is not None
        self.process.stdin.write(f"serve {address}\n".encode())
        await self.process.stdin.drain()
        while True:
            line = (await self.process.stdout.readline()).decode()
            if not line:
                code = await self.process.wait()
                raise ConfigurationError(
                    f"demo worker {self.number} exited ({code}) before serving",
                    hint=f"its log is {self.log}",
                )
            if line.startswith(_READY):
                self.identity = line[len(_READY) :].strip()
                return


async def start_worker_process(
    number: int, spec: ModelSpec, log_dir: Path, task_queue: str
) -> WorkerProcess:
    """Start a demo worker process (waiting for :meth:`WorkerProcess.serve`)."""
    import examples

    # The child must import the examples from where this process did, whatever its cwd.
    examples_root = str(Path(examples.__file__).resolve().parent.parent)
    env = dict(os.environ)
    env[MODEL_ENV] = spec.model_dump_json()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (examples_root, env.get("PYTHONPATH", "")) if p)
    log_dir.mkdir(parents=True, exist_ok=True)
    log = log_dir / f"demo-worker-{number}.log"
    with open(log, "wb") as stderr:  # the SDK's own log lines (e.g. the lost call) go here
        process = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "relaykit.demo",
            "worker",
            task_queue,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=stderr,
            env=env,
        )
    return WorkerProcess(number, process, log)


# --- reading the run's story from its history -----------------------------------------------


@dataclass
class Call:
    """One activity the run scheduled, as its history tells it."""

    activity_id: str
    kind: str
    summary: str
    identity: str = ""
    attempt: int = 0
    finished: bool = False


@dataclass
class Story:
    """The run's history read so far, turned into lines about workers and calls."""

    workers: dict[str, WorkerProcess] = field(default_factory=dict)
    calls: dict[int, Call] = field(default_factory=dict)
    """Scheduled event id → call."""
    replayed_by: set[str] = field(default_factory=set)
    """Identities of the workers that have run a workflow task of the run, in order."""
    seen: int = 0
    lost: dict[str, str] = field(default_factory=dict)
    """Activity id → the killed worker that was running it."""

    def worker(self, identity: str) -> str:
        found = self.workers.get(identity)
        return found.label if found is not None else f"worker {identity}"

    def finished(self) -> list[Call]:
        return [c for c in self.calls.values() if c.finished]

    async def read(self, handle: WorkflowHandle[Any, Any], client: Client) -> list[str]:
        lines: list[str] = []
        events = [e async for e in handle.fetch_history_events()]
        for event in events[self.seen :]:
            lines.extend(await self._take(event, client))
        self.seen = max(self.seen, len(events))
        return lines

    async def _take(self, event: Any, client: Client) -> list[str]:
        kind = event.event_type
        if kind == EventType.EVENT_TYPE_ACTIVITY_TASK_SCHEDULED:
            attrs = event.activity_task_scheduled_event_attributes
            summary = attrs.activity_type.name
            if event.user_metadata.HasField("summary"):
                decoded = await client.data_converter.decode([event.user_metadata.summary])
                summary = str(decoded[0])
            self.calls[event.event_id] = Call(attrs.activity_id, attrs.activity_type.name, summary)
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_STARTED:
            attrs = event.activity_task_started_event_attributes
            call = self.calls.get(attrs.scheduled_event_id)
            if call is not None:
                call.identity, call.attempt = attrs.identity, attrs.attempt
        elif kind == EventType.EVENT_TYPE_ACTIVITY_TASK_COMPLETED:
            call = self.calls.get(event.activity_task_completed_event_attributes.scheduled_event_id)
            if call is not None:
                call.finished = True
                lost = self.lost.get(call.activity_id)
                retried = f", which {lost} had not finished (attempt {call.attempt})"
                return [
                    f"{self.worker(call.identity)} ran {describe(call)}"
                    + (retried if lost and call.attempt > 1 else "")
                ]
        elif kind == EventType.EVENT_TYPE_WORKFLOW_TASK_STARTED:
            identity = event.workflow_task_started_event_attributes.identity
            if identity in self.replayed_by:
                return []
            self.replayed_by.add(identity)
            if len(self.replayed_by) > 1:  # a worker new to the run: it rebuilt it from history
                done = [c for c in self.finished() if c.identity != identity]
                names = ", ".join(describe(c) for c in done)
                return [
                    f"{self.worker(identity)} resumed the run: replayed {len(done)} finished "
                    f"calls from history without running them again ({names})"
                ]
        return []


def describe(call: Call) -> str:
    from relaykit.workflows.loop import MODEL_ACTIVITY

    if call.kind == MODEL_ACTIVITY:
        turn = next((p for p in call.summary.split(" · ") if p.startswith("turn ")), "")
        return f"the model call ({turn})" if turn else "a model call"
    return call.summary


def repeated_calls(story: Story) -> list[str]:
    """Tool calls that finished more than once with the same arguments (there must be none)."""
    from relaykit.workflows.loop import MODEL_ACTIVITY

    seen: set[str] = set()
    repeated = []
    for call in story.finished():
        if call.kind != MODEL_ACTIVITY:
            if call.summary in seen:
                repeated.append(call.summary)
            seen.add(call.summary)
    return repeated


# --- the demo -------------------------------------------------------------------------------


class KillGate:
    """Holds the scripted model's answer to the second turn until worker 1 is dead, so the kill
    lands at the same point of the run every time (a scripted model answers in microseconds)."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.reached = asyncio.Event()
        self.done = threading.Event()

    def wrap(self, responder: Responder) -> Responder:
        def respond(request: ScriptedRequest) -> Step:
            if len(request.tool_results) == 1 and not self.done.is_set():
                self.loop.call_soon_threadsafe(self.reached.set)
                self.done.wait(timeout=30)  # the worker that asked is gone: nobody reads this
            return responder(request)

        return respond


async def _pending_summary(
    handle: WorkflowHandle[Any, Any], story: Story, worker: WorkerProcess
) -> str:
    """What ``worker`` is running, from the server's view of the run (noted in ``story``)."""
    description = await handle.describe()
    running = [
        p
        for p in description.raw_description.pending_activities
        if p.last_worker_identity == worker.identity
    ]
    story.lost.update({p.activity_id: worker.label for p in running})
    by_id = {c.activity_id: c for c in story.calls.values()}
    names = [describe(by_id[p.activity_id]) for p in running if p.activity_id in by_id]
    return f" while it ran {', '.join(names)}" if names else " between two calls"


def demo_model_choice(model: str | None, env: Mapping[str, str] | None = None) -> Any:
    """The model that plays the demo: ``--model`` (read as ``RELAYKIT_MODEL`` would be), else
    what :func:`relaykit.dev.choose_model` picks for every command (a
    :class:`relaykit.dev.ModelChoice`)."""
    from relaykit.dev import choose_model

    chosen = dict(os.environ if env is None else env)
    if model:
        chosen["RELAYKIT_MODEL"] = model
    return choose_model(chosen)


async def run_demo(
    *, port: int, ui_port: int, data_dir: str, stay: bool | None, model: str | None = None
) -> None:
    """Serve examples/demo.py on worker processes, run it once, kill worker 1 mid-run, finish on
    worker 2, and print the answer, the story and the run's UI link."""
    from examples.demo import DEMO_PROMPT, scripted_demo, travel_assistant
    from relaykit.client import connect, start_run
    from relaykit.dev import SCRIPTED_MODEL_NAME, console, start_server, stop_on_sigterm
    from relaykit.workflows.loop import MODEL_ACTIVITY

    choice = demo_model_choice(model)
    console.print(f"model: [bold]{choice.label}[/bold]")
    stop_on_sigterm()
    loop = asyncio.get_running_loop()
    gate: KillGate | None = None
    async with AsyncExitStack() as stack:
        if choice.spec is None:
            gate = KillGate(loop)
            scripted = ScriptedModelServer(fallback=gate.wrap(scripted_demo)).start()
            stack.callback(scripted.stop)
            stack.callback(gate.done.set)
            spec = ModelSpec(
                provider="openai", name=SCRIPTED_MODEL_NAME, base_url=f"{scripted.base_url}/v1"
            )
        else:
            spec = choice.spec
        spec = spec.model_copy(update={"heartbeat_timeout_seconds": DEMO_HEARTBEAT_SECONDS})
        task_queue = f"{DEMO_TASK_QUEUE}-{uuid.uuid4().hex[:8]}"
        """A queue of this demo's own: runs left by an earlier demo in the same data directory
        (stopped with Ctrl-C) are not picked up by these workers."""
        console.print("starting the embedded Temporal server…")
        workers = [await start_worker_process(n, spec, Path(data_dir), task_queue) for n in (1, 2)]

        async def stop_workers() -> None:
            for w in workers:
                if w.process.returncode is None:
                    w.process.terminate()
                    try:
                        await asyncio.wait_for(w.process.wait(), timeout=15)
                    except TimeoutError:
                        w.process.kill()
                        await w.process.wait()

        stack.push_async_callback(stop_workers)
        server = await asyncio.to_thread(start_server, port, ui_port, data_dir)
        stack.callback(server.stop)
        client = await connect(server.address)
        console.print(f"Temporal UI: [bold]{server.ui_url}[/bold]  ·  frontend {server.address}")

        story = Story()

        async def serve(worker: WorkerProcess, indent: str = "") -> None:
            await worker.serve(server.address)
            story.workers[worker.identity] = worker
            console.print(
                f"{indent}{worker.label} started: a separate process, polling {task_queue}"
            )

        first, second = workers
        await serve(first)
        handle = await start_run(
            client,
            travel_assistant,
            DEMO_PROMPT,
            task_queue=task_queue,
            max_turns=4,
            answer_on_last_turn=True,
        )
        console.print(f"\nrun [bold]{handle.id}[/bold] started — follow it in the Temporal UI:")
        print(server.ui_link(handle.id), flush=True)
        console.print(f"[dim]prompt: {DEMO_PROMPT}[/dim]\n")

        result_task = asyncio.ensure_future(handle.result())
        killed = False
        while True:
            done = result_task.done()
            for line in await story.read(handle.workflow, client):
                console.print(f"  {line}")
            if not killed:
                tool_finished = any(
                    c.finished and c.identity == first.identity and c.kind != MODEL_ACTIVITY
                    for c in story.calls.values()
                )
                if (gate is not None and gate.reached.is_set()) or (gate is None and tool_finished):
                    killed = True
                    doing = await _pending_summary(handle.workflow, story, first)
                    first.process.send_signal(signal.SIGKILL)
                    await first.process.wait()
                    if gate is not None:
                        gate.done.set()
                    console.print(f"  [bold red]{first.label} killed (SIGKILL){doing}[/bold red]")
                    await serve(second, "  ")
            if done:
                break
            await asyncio.wait({result_task}, timeout=0.2)
        result = result_task.result()
        for line in await story.read(handle.workflow, client):
            console.print(f"  {line}")

        print(f"\n{result.output}\n", flush=True)
        repeated = repeated_calls(story)
        calls = story.finished()
        retried = sum(1 for c in calls if c.attempt > 1)
        if repeated:
            console.print(f"[bold red]calls that ran twice: {', '.join(repeated)}[/bold red]")
        else:
            console.print(
                f"checked in the run's history: {len(calls)} calls finished, each once"
                + (f"; {retried} taken over from the killed worker" if retried else "")
                + ("" if killed else " (the run ended before the demo could kill its worker)")
            )
        console.print(
            f"served by {choice.label.split(' (')[0]}\n{result.turns} turns · "
            f"{result.usage.requests} model "
            f"calls · {result.usage.total_tokens} tokens · agent {result.final_agent}"
        )
        console.print(f"run in the Temporal UI: {server.ui_link(handle.id)}")
        if stay is None:
            stay = sys.stdin.isatty() and not os.environ.get("CI")
        if stay:
            console.print("\nthe server and UI stay up; Ctrl-C stops them")
            await asyncio.Event().wait()


if __name__ == "__main__":
    if sys.argv[1:2] == ["worker"]:
        worker_main(sys.argv[2:])
    else:
        sys.exit("usage: python -m relaykit.demo worker TASK_QUEUE (started by relaykit demo)")
