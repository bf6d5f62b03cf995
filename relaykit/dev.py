"""``relaykit dev`` and ``relaykit demo``: the embedded Temporal server, a worker and (for the
demo) one run, in one process tree, stopped cleanly on Ctrl-C.

Which model serves agents defined without one is decided here (:func:`choose_model`, shared by
``dev``, ``demo``, ``worker``, the repository's ``worker.py`` and the compose worker), from the
environment, and said on the command's first line: ``RELAYKIT_MODEL``; else OpenAI when
``OPENAI_API_KEY``/``OPENAI_BASE_URL`` is set; else Anthropic when ``ANTHROPIC_API_KEY`` is set;
else the deterministic scripted stand-in (labelled as such), so the quick start runs offline and
its examples end the way they are written to. The bundled tiny local model is never picked on
its own: it answers most requests wrongly (docs/local-model.md), so it is a choice a user makes
(``RELAYKIT_MODEL=local``, ``relaykit demo --model local``).
"""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import Callable, Mapping, Sequence
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from temporalio.client import Client

from relaykit.agent import Agent
from relaykit.client import connect
from relaykit.devserver import DEFAULT_PORT, DEFAULT_UI_URL, HOST, DevServer, PortInUseError
from relaykit.errors import ConfigurationError
from relaykit.loading import load_agents
from relaykit.models.spec import ModelSpec, parse_model
from relaykit.testing.scripted_server import Responder, ScriptedModelServer, ScriptedRequest, Step
from relaykit.worker import Worker

console = Console(stderr=True, soft_wrap=True)

SCRIPTED_MODEL_NAME = "relaykit-scripted"
REAL_MODEL_HINT = (
    "for a real model set RELAYKIT_MODEL=openai:gpt-4.1 and OPENAI_API_KEY (or ANTHROPIC_API_KEY)"
)
LOCAL_MODEL_NOTE = (
    "the bundled 135M-parameter model, offline and on CPU: it often picks the wrong tool or "
    "answers wrongly, see docs/local-model.md; " + REAL_MODEL_HINT
)
SCRIPTED_LABEL = (
    "scripted stand-in model (no LLM is configured: each example's deterministic script plays the "
    "model); " + REAL_MODEL_HINT + ", or RELAYKIT_MODEL=local for the bundled tiny offline LLM"
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


def choose_model(env: Mapping[str, str] | None = None) -> ModelChoice:
    """The model for agents defined without one, and the line that says so."""
    env = dict(os.environ if env is None else env)
    wanted = env.get("RELAYKIT_MODEL", "").strip()
    if wanted == "scripted":
        return ModelChoice(None, "scripted stand-in model (RELAYKIT_MODEL=scripted: no LLM)")
    if wanted:
        spec = parse_model(wanted)
        if spec.provider == "local":
            if not local_model_available():
                from relaykit.models.local_server import INSTALL_COMMANDS

                raise ConfigurationError(
                    f"RELAYKIT_MODEL={wanted} asks for the bundled local model, which is not "
                    "installed",
                    hint=f"install it with: {INSTALL_COMMANDS}",
                )
            return ModelChoice(spec, f"local:{spec.name} ({LOCAL_MODEL_NOTE})")
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
    return ModelChoice(None, SCRIPTED_LABEL)


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
    stack: AsyncExitStack,
    target: str,
    port: int,
    ui_port: int,
    data_dir: str,
    task_queue: str,
    scripted_responder: Responder | None,
    worker_options: dict[str, Any] | None = None,
) -> tuple[DevServer, Worker, ModelChoice]:
    agents = load_agents(target)
    spec, choice = await serve_default_model(stack, [target], scripted_responder=scripted_responder)
    console.print(f"model: [bold]{choice.label}[/bold]")  # first: what plays the model
    console.print("starting the embedded Temporal server…")
    server = await asyncio.to_thread(start_server, port, ui_port, data_dir)
    stack.callback(server.stop)
    client = await connect(server.address)
    worker = Worker(
        client, agents, task_queue=task_queue, default_model=spec, **(worker_options or {})
    )
    await stack.enter_async_context(worker)
    console.print(f"Temporal UI: [bold]{server.ui_url}[/bold]  ·  frontend {server.address}")
    if server.ui_url != DEFAULT_UI_URL or server.address != f"{HOST}:{DEFAULT_PORT}":
        # other commands reach the default ports unless told: say how, or their links mislead
        console.print(
            f"in other shells: export TEMPORAL_ADDRESS={server.address} "
            f"RELAYKIT_UI_URL={server.ui_url}",
            highlight=False,
        )
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
    named: Responder | None = getattr(module, "scripted_responder", None)
    if callable(named):
        return named
    found = {
        id(value): value
        for name, value in vars(module).items()
        if name.startswith("scripted_")
        and callable(value)
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
            agent.instructions
            for agent in load_agents(target)
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
    target: str,
    *,
    port: int,
    ui_port: int,
    data_dir: str,
    task_queue: str,
    worker_options: dict[str, Any] | None = None,
) -> None:
    """Serve until SIGTERM or Ctrl-C; then the worker stops gracefully (calls in flight may
    finish within its ``graceful_shutdown_timeout``) before the server stops. A second signal
    stops at once."""
    load_agents(target)  # a clear error for a bad module before anything starts
    stop_on_sigterm()  # while starting up; once serving, the first signal stops gracefully
    async with AsyncExitStack() as stack:
        await _serve(stack, target, port, ui_port, data_dir, task_queue, None, worker_options)
        console.print('ready: start runs with `relaykit run AGENT "…"`; Ctrl-C stops everything')
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
            (
                "model worker (no runs) for: "
                if served.models_only
                else f"worker on task queue [bold]{task_queue}[/bold] serving: "
            )
            + ", ".join(sorted(served.graph.agents))
        )
        for queue, limit in served.model_queues().items():
            console.print(f"model calls on [bold]{queue}[/bold] (limit: {limit})")
        if not served.models_only:
            console.print(
                f"keeps up to {served.max_cached_workflows} runs in memory between their steps "
                "(--max-cached-workflows)"
            )
        if served.build is not None:
            console.print(
                f"deployment [bold]{served.build.deployment_name}[/bold], build "
                f"[bold]{served.build.build_id}[/bold] (runs are pinned to their build; "
                "`relaykit deployment set-current` sends new runs here)"
            )
        await served.run_until_signalled(on_signal)
