"""The relaykit side of the benchmark: its agents, its tools, and the task prompts that tell the
scripted model (:mod:`bench.model_server`) how to behave.

A run's first user message is its task:

- ``turns=K``: call ``lookup`` once per turn for ``K`` turns, then answer;
- ``fanout=N``: call ``ask_helper`` ``N`` times in one response (each call is a child run with
  the task ``turns=1``), then answer;
- ``spawn=N``: call ``spawn_subagent`` ``N`` times in one response (background child runs of
  ``helper`` with the task ``turns=1``), then ``wait_subagents``, then answer;
- ``approve``: call ``guarded`` (which needs a person's approval), then answer.

``lookup`` is declared a read (it changes nothing), as the floor's tool activity is: a tool
left at the default ``effect="write"`` also records, before it runs, that its attempt started
(one heartbeat the server acknowledges, :mod:`relaykit.activities.attempts`), which the floor
has no counterpart for. The tools are ``async`` so that, like the floor's activities, they run on the worker's event loop
(a plain ``def`` tool would add a thread hop per call).
"""

from __future__ import annotations

from relaykit import Agent, ModelSpec, Subagents, tool

MODEL_NAME = "bench"
LOOKUP = "lookup"
GUARDED = "guarded"
APPROVAL_CALL_ID = "call_guarded"
"""The call id the scripted model gives every ``guarded`` call (approvals answer it by id)."""


@tool(effect="read")
async def lookup(q: str) -> str:
    """Look something up.

    Args:
        q: What to look up.
    """
    return f"found {q}"


@tool(needs_approval=True)
async def guarded(note: str) -> str:
    """An action a person must approve first.

    Args:
        note: What the action is about.
    """
    return f"did {note}"


def turns_task(k: int) -> str:
    return f"turns={k}"


def fanout_task(n: int) -> str:
    return f"fanout={n}"


def spawn_task(n: int) -> str:
    return f"spawn={n}"


MAX_SUBAGENTS = 20


APPROVE_TASK = "approve"


def build_agents(model_url: str, model_queue: str | None = None) -> list[Agent]:
    """The agents one relaykit bench worker serves (the graph also reaches ``helper``).

    ``spawner`` may run :data:`MAX_SUBAGENTS` background subagents at once (the default is 4).
    ``model_queue``: the model's ``task_queue`` (``None``: its provider queue, the default).
    """
    model = ModelSpec(
        provider="openai",
        name=MODEL_NAME,
        base_url=f"{model_url.rstrip('/')}/v1",
        task_queue=model_queue,
    )
    instructions = "You are a benchmark agent. Follow the task in the first message."
    looper = Agent(name="looper", instructions=instructions, model=model, tools=[lookup])
    helper = Agent(name="helper", instructions=instructions, model=model, tools=[lookup])
    fanout = Agent(name="fanout", instructions=instructions, model=model, tools=[helper.as_tool()])
    spawner = Agent(
        name="spawner",
        instructions=instructions,
        model=model,
        subagents=Subagents([helper], max_concurrent=MAX_SUBAGENTS),
    )
    approver = Agent(name="approver", instructions=instructions, model=model, tools=[guarded])
    return [looper, fanout, spawner, approver]


FANOUT_TOOL = "ask_helper"
