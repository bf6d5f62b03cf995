"""Which agent graph serves which task queue, inside this worker process.

A run is started by agent name, so its workflow code must find the agent objects. Workers record
their graph here when they start; the workflow sandbox passes the ``relaykit`` package through, so
workflow code sees this very dictionary (agents are configuration: nothing here is mutated by a
run, which keeps replays deterministic).
"""

from __future__ import annotations

from relaykit.graph import AgentGraph

_GRAPHS: dict[str, AgentGraph] = {}


def register(task_queue: str, graph: AgentGraph) -> None:
    known = _GRAPHS.get(task_queue)
    if known is not None and known is not graph and known.agents != graph.agents:
        from relaykit.errors import ConfigurationError

        raise ConfigurationError(
            f"task queue {task_queue!r} already has a worker in this process serving other agents",
            hint="use one task queue per agent graph",
        )
    _GRAPHS[task_queue] = graph


def unregister(task_queue: str, graph: AgentGraph) -> None:
    if _GRAPHS.get(task_queue) is graph:
        del _GRAPHS[task_queue]


def graph_for(task_queue: str) -> AgentGraph | None:
    return _GRAPHS.get(task_queue)
