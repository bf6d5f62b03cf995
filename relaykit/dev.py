"""``relaykit dev`` and ``relaykit demo``: the embedded Temporal server, a worker and (for the
demo) one run, in one process tree, stopped cleanly on Ctrl-C.

Which model serves agents defined without one is decided here, from the environment, and said
plainly: ``RELAYKIT_MODEL``; else OpenAI when ``OPENAI_API_KEY``/``OPENAI_BASE_URL`` is set; else
Anthropic when ``ANTHROPIC_API_KEY`` is set; else the bundled local model when it is installed;
else a scripted stand-in (labelled as such) so the quick start always runs offline.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
from contextlib import AsyncExitStack
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from temporalio.client import Client

from relaykit.client import connect, start_run
from relaykit.devserver import DevServer, PortInUseError
from relaykit.errors import ConfigurationError
from relaykit.runs import RunEvent
from relaykit.agent import Agent
from relaykit.loading import load_agents
from relaykit.testing.scripted_server import Responder, ScriptedModelServer, ScriptedRequest, Step
from relaykit.models.spec import ModelSpec, parse_model
from relaykit.worker import Worker

console = Console(stderr=True, soft_wrap=True)

SCRIPTED_MODEL_NAME = "relaykit-scripted"
LOCAL_MODEL_NOTE = (
    "tiny local model: expect weak answers; set OPENAI_API_KEY or OPENAI_BASE_URL for a real one"
)


@dataclass
class ModelChoice:
    spec: ModelSpec | None
    """``None``: the scripted stand-in serves the run."""
    label: str


def local_model_available() -> bool:
    try:
        from relaykit.models.local_server import find_bundled_model

        find_bundled_model()
        import importlib.util

        return importlib.util.find_spec("xllamacpp") is not None
    except Exception:  # noqa: BLE001 - any failure means: not usable here
        return False


def choose_model(env: dict[str, str] | None = None, *, allow_local: bool = True) -> ModelChoice:
    env = dict(os.environ if env is None else env)
    if env.get("RELAYKIT_MODEL") == "scripted":
        return ModelChoice(None, "scripted stand-in model (RELAYKIT_MODEL=scripted: no LLM)")
    if env.get("RELAYKIT_MODEL"):
        spec = parse_model(env["RELAYKIT_MODEL"])
        return ModelChoice(spec, f"{spec.provider}:{spec.name} (RELAYKIT_MODEL)")
    if env.get("OPENAI_BASE_URL") and not env.get("OPENAI_API_KEY"):
        raise ConfigurationError(
            "OPENAI_BASE_URL is set but no model name is",
            hint="set RELAYKIT_MODEL to the model your server serves, e.g. RELAYKIT_MODEL=llama3.2",
        )
    if env.get("OPENAI_API_KEY"):
        return ModelChoice(parse_model("openai:gpt-4.1-mini"), "openai:gpt-4.1-mini")
    if env.get("ANTHROPIC_API_KEY"):
        return ModelChoice(
            parse_model("anthropic:claude-sonnet-4-5"), "anthropic:claude-sonnet-4-5"
        )
    if allow_local and local_model_available():
        return ModelChoice(parse_model("local:smollm2"), f"local:smollm2 ({LOCAL_MODEL_NOTE})")
    return ModelChoice(
        None,
        "scripted stand-in model (no LLM: a script plays the model; set OPENAI_API_KEY, "
        "OPENAI_BASE_URL + RELAYKIT_MODEL, or ANTHROPIC_API_KEY for a real one)",
    )


def _show(event: RunEvent) -> None:
    data = event.data
    if event.kind == "tool_call":
        console.print(f"  [cyan]→ {data['name']}[/cyan]({data['arguments']})")
    elif event.kind == "tool_result":
        console.print(f"  [green]← {data['name']}[/green]: {str(data['content'])[:100]}")
    elif event.kind == "handoff":
        console.print(f"  [magenta]⇢ handoff {data['from']} → {data['to']}[/magenta]")


def start_server(port: int, ui_port: int, data_dir: str) -> DevServer:
    server = DevServer(port=port, ui_port=ui_port, data_dir=data_dir)
    try:
        return server.start()
    except PortInUseError as exc:
        raise ConfigurationError(
            str(exc.message), hint="is `relaykit dev` already running? pass --port/--ui-port"
        ) from None


def load_all(targets: Sequence[str]) -> list[Agent]:
    """The agents of several ``MODULE[:ATTR]`` targets, each once."""
    agents: list[Agent] = []
    for target in targets:
        agents.extend(a for a in load_agents(target) if all(a is not b for b in agents))
    return agents


def needs_default_model(agents: Sequence[Agent]) -> bool:
    """Whether any agent reachable from ``agents`` has no model of its own."""
    from relaykit.graph import AgentGraph

    probe = AgentGraph.build(agents, default_model=ModelSpec(name="default"))
    return any(agent.model is None for agent in probe.agents.values())


OWN_MODELS = ModelChoice(None, "each agent's own (every agent names its model)")


async def serve_default_model(
    stack: AsyncExitStack,
    targets: Sequence[str],
    *,
    scripted_responder: Responder | None = None,
    env: Mapping[str, str] | None = None,
) -> tuple[ModelSpec | None, ModelChoice]:
    """The model that serves agents defined without one, for ``dev``, ``demo`` and ``worker``
    alike (one resolution: :func:`choose_model`). When the choice is the scripted stand-in, its
    server is started here (stopped by ``stack``) and answers with the modules' own stand-ins.
    When every agent names its model, nothing is resolved (``None``)."""
    if not needs_default_model(load_all(targets)):
        return None, OWN_MODELS
    choice = choose_model(None if env is None else dict(env))
    if choice.spec is not None:
        return choice.spec, choice
    responder = scripted_responder or responder_for(targets)
    scripted = ScriptedModelServer(fallback=responder).start()
    stack.callback(scripted.stop)
    spec = ModelSpec(
        provider="openai", name=SCRIPTED_MODEL_NAME, base_url=f"{scripted.base_url}/v1"
    )
    return spec, choice


async def _serve(
    stack: AsyncExitStack, target: str, port: int, ui_port: int, data_dir: str, task_queue: str,
    scripted_responder: Responder | None, worker_options: dict[str, Any] | None = None,
) -> tuple[DevServer, Worker, ModelChoice]:
    agents = load_agents(target)
    spec, choice = await serve_default_model(
        stack, [target], scripted_responder=scripted_responder
    )
    console.print("starting the embedded Temporal server…")
    server = await asyncio.to_thread(start_server, port, ui_port, data_dir)
    stack.callback(server.stop)
    client = await connect(server.address)
    worker = Worker(
        client, agents, task_queue=task_queue, default_model=spec, **(worker_options or {})
    )
    await stack.enter_async_context(worker)
    console.print(f"Temporal UI: [bold]{server.ui_url}[/bold]  ·  frontend {server.address}")
    console.print(f"model: [bold]{choice.label}[/bold]")
    console.print(
        f"worker on task queue [bold]{task_queue}[/bold] serving: "
        + ", ".join(sorted(worker.graph.agents))
    )
    return server, worker, choice


def find_scripted_responder(target: str) -> Responder | None:
    """A module's own scripted stand-in for a model: ``scripted_responder``, else its single
    ``scripted_*`` function (examples ship one so they run offline)."""
    import importlib

    module = importlib.import_module(target.partition(":")[0])
    named = getattr(module, "scripted_responder", None)
    if callable(named):
        return named
    found = {
        id(value): value
        for name, value in vars(module).items()
        if name.startswith("scripted_") and callable(value)
        and getattr(value, "__module__", None) == module.__name__
    }
    return next(iter(found.values())) if len(found) == 1 else None


def responder_for(targets: Sequence[str]) -> Responder:
    """The scripted stand-in for the agents of ``targets``: each module's own
    (:func:`find_scripted_responder`), else the echo rule. With several modules, a request goes
    to the module whose agent's instructions open its system prompt."""
    from relaykit.testing.scripted_server import echo

    found: list[tuple[list[str], Responder]] = []
    for target in targets:
        responder = find_scripted_responder(target)
        if responder is None:
            continue
        prompts = [
            agent.instructions for agent in load_agents(target)
            if isinstance(agent.instructions, str) and agent.instructions
        ]
        found.append((prompts, responder))
    if not found:
        return echo
    if len(found) == 1:
        return found[0][1]

    def dispatch(request: ScriptedRequest) -> Step:
        system = request.system
        for prompts, responder in found:
            if any(prompt in system for prompt in prompts):
                return responder(request)
        return echo(request)

    return dispatch


def stop_on_sigterm() -> None:
    """Treat SIGTERM (a process manager, ``kill``, a closed terminal tab) like Ctrl-C: cancel the
    running command so its exit stack stops the embedded server and the worker. Python's default
    for SIGTERM ends the process at once and would leave the server holding the ports."""
    task = asyncio.current_task()
    if task is None or os.name == "nt":
        return
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)


async def run_dev(
    target: str, *, port: int, ui_port: int, data_dir: str, task_queue: str,
    worker_options: dict[str, Any] | None = None,
) -> None:
    """Serve until SIGTERM or Ctrl-C; then the worker stops gracefully (calls in flight may
    finish within its ``graceful_shutdown_timeout``) before the server stops. A second signal
    stops at once."""
    load_agents(target)  # a clear error for a bad module before anything starts
    stop_on_sigterm()  # while starting up; once serving, the first signal stops gracefully
    async with AsyncExitStack() as stack:
        await _serve(stack, target, port, ui_port, data_dir, task_queue, None, worker_options)
        console.print("ready: start runs with `relaykit run AGENT \"…\"`; Ctrl-C stops everything")
        await _wait_for_stop_signal()
        console.print("stopping: the worker finishes calls in flight, then the server stops")


async def _wait_for_stop_signal() -> None:
    """Return on the first SIGTERM/SIGINT; the handlers go with it, so a second signal acts as
    usual (Ctrl-C interrupts the shutdown, SIGTERM ends the process)."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    installed = []
    for signum in (signal.SIGTERM, signal.SIGINT):
        try:
            loop.add_signal_handler(signum, stop.set)
            installed.append(signum)
        except (NotImplementedError, RuntimeError):
            pass
    try:
        await stop.wait()
    finally:
        for signum in installed:
            loop.remove_signal_handler(signum)


async def run_worker(
    targets: Sequence[str],
    *,
    client: Client,
    task_queue: str,
    on_signal: Callable[[Any], None] | None = None,
    **worker_options: Any,
) -> None:
    """``relaykit worker`` and the repository's ``worker.py``: serve the agents of ``targets``
    against an existing Temporal server, with the model :func:`serve_default_model` picks."""
    agents = load_all(targets)
    async with AsyncExitStack() as stack:
        spec, choice = await serve_default_model(stack, targets)
        served = Worker(client, agents, task_queue=task_queue, default_model=spec, **worker_options)
        console.print(f"model: [bold]{choice.label}[/bold]")
        console.print(
            f"worker on task queue [bold]{task_queue}[/bold] serving: "
            + ", ".join(sorted(served.graph.agents))
        )
        if served.build is not None:
            console.print(
                f"deployment [bold]{served.build.deployment_name}[/bold], build "
                f"[bold]{served.build.build_id}[/bold] (runs are pinned to their build; "
                "`relaykit deployment set-current` sends new runs here)"
            )
        await served.run_until_signalled(on_signal)


async def run_demo(*, port: int, ui_port: int, data_dir: str, stay: bool | None) -> None:
    """Serve examples/demo.py, run it once, print the result and the run's UI link."""
    from examples.demo import DEMO_PROMPT, scripted_demo, travel_assistant

    task_queue = "relaykit-demo"
    stop_on_sigterm()
    async with AsyncExitStack() as stack:
        server, worker, choice = await _serve(
            stack, "examples.demo:travel_assistant", port, ui_port, data_dir, task_queue,
            scripted_demo,
        )
        handle = await start_run(
            worker.client, travel_assistant, DEMO_PROMPT, task_queue=task_queue,
            max_turns=4, answer_on_last_turn=True,
        )
        console.print(f"\nrun [bold]{handle.id}[/bold] started — follow it in the Temporal UI:")
        print(server.ui_link(handle.id), flush=True)
        console.print(f"[dim]prompt: {DEMO_PROMPT}[/dim]\n")
        result_task = asyncio.ensure_future(handle.result())
        seen = 0
        while True:  # show the run's steps as they happen
            done = result_task.done()
            events = await handle.events(seen)
            for event in events:
                _show(event)
            seen += len(events)
            if done:
                break
            await asyncio.wait({result_task}, timeout=0.3)
        result = result_task.result()
        print(f"\n{result.output}\n", flush=True)
        console.print(
            f"served by {choice.label}\n{result.turns} turns · {result.usage.requests} model "
            f"calls · {result.usage.total_tokens} tokens · agent {result.final_agent}"
        )
        console.print(f"run in the Temporal UI: {server.ui_link(handle.id)}")
        if stay is None:
            stay = sys.stdin.isatty() and not os.environ.get("CI")
        if stay:
            console.print("\nthe server and UI stay up; Ctrl-C stops them")
            await asyncio.Event().wait()
