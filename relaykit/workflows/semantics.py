"""lovia's semantics where relaykit once differed (issue 25), chosen once per run.

Five behaviours changed to match lovia 0.9.119: handoff and agent-tool names
(:func:`relaykit.names.agent_tool_name`), lenient handoff arguments
(:func:`relaykit.handoff.parse_handoff_args`), the number of output repairs
(:func:`relaykit.output.repairs_allowed`), the output schema in the system prompt
(:meth:`relaykit.output.OutputType.instructions`), and the request order of a turn's calls
around its handoff (:meth:`relaykit.workflows.tool_path.ToolPath.run_calls`).

Each changes what a run sends or the commands it issues, so each is decided once, at the run's
first workflow task, and recorded in :class:`relaykit.runs.RunSetup`, which a continue-as-new
carries: in runs started since ``relaykit.run-setup.v2`` by that one marker
(:data:`relaykit.workflows.run_setup.NEW_RUN_CHOICES`), before by a patch marker each
(``workflow.patched``, below). A run started before the change replays without the markers and
keeps its old behaviour to its end, on any worker; a run continued from one keeps it too (the
fields default to ``False``).

The same way, once per run: which of the search attributes added later (``RelayCostUSD``, then
``RelayWaitingFor`` and ``RelayLastActivity``) a run upserts, as the namespace had them
(:func:`recorded_attribute_choices`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from temporalio import workflow

if TYPE_CHECKING:
    from relaykit.graph import AgentGraph

PATCHES = {
    "lovia_tool_names": "relaykit.lovia-tool-names",
    "lenient_handoff_args": "relaykit.lenient-handoff-arguments",
    "output_retries_setting": "relaykit.output-retries-setting",
    "output_schema_in_prompt": "relaykit.output-schema-in-prompt",
    "handoff_in_request_order": "relaykit.handoff-in-request-order",
}
"""``RunSetup`` field → patch id (compatibility data: never rename a patch id)."""


PATCH_TOOL_EFFECTS = "relaykit.tool-effects"
"""``RunSetup.tool_effects``: tool calls carry their effect
(:mod:`relaykit.workflows.tool_outcome`)."""


def recorded_tool_effects() -> dict[str, bool]:
    """The ``RunSetup`` field of effects, for a run's first workflow task: ``True`` for a new run
    (a marker is written), ``False`` when replaying a run recorded before."""
    return {"tool_effects": workflow.patched(PATCH_TOOL_EFFECTS)}


PATCH_PATH_CHECKS = "relaykit.path-checks-for-every-kind"
"""``RunSetup.capped_outputs`` and ``RunSetup.handoff_effects``: the tool path caps every kind's
result (an agent tool's child answer too), and an ``on_handoff`` callback is scheduled as an
effect (:mod:`relaykit.workflows.handoffs`)."""


def recorded_path_checks() -> dict[str, bool]:
    """The ``RunSetup`` fields of :data:`PATCH_PATH_CHECKS`, for a run's first workflow task:
    ``True`` for a new run (one marker is written for both), ``False`` when replaying a run
    recorded before."""
    checked = workflow.patched(PATCH_PATH_CHECKS)
    return {"capped_outputs": checked, "handoff_effects": checked}


def recorded_semantics() -> dict[str, bool]:
    """The ``RunSetup`` fields of lovia's semantics, for a run's first workflow task: ``True``
    for a new run (a marker is written), ``False`` when replaying a run recorded before."""
    return {field: workflow.patched(patch_id) for field, patch_id in PATCHES.items()}


PATCH_COST_ATTRIBUTE = "relaykit.run-setup.cost-attribute"
"""Whether a v3 run upserts ``RelayCostUSD`` with its other search attributes (the namespace had
it registered when the run started)."""
PATCH_LIST_ATTRIBUTES = "relaykit.run-setup.list-attributes"
"""``RunSetup.list_attributes`` and ``cost_attribute`` by one marker: a v3 run with search
attributes also upserts ``RelayCostUSD``, ``RelayWaitingFor`` and ``RelayLastActivity`` (the
namespace had them all when it started). Runs since ``relaykit.run-setup.v4`` record it in
that marker's id instead (relaykit.workflows.run_setup)."""


def recorded_attribute_choices(graph: AgentGraph) -> dict[str, bool]:
    """Which of the search attributes added after the first ones a v3 run with search attributes
    upserts, for its first workflow task: all (one marker), ``RelayCostUSD`` only (its own
    marker: a namespace without the list's attributes, or a run recorded before them), or
    none."""
    if recorded_choice(PATCH_LIST_ATTRIBUTES, graph.cost_attribute and graph.list_attributes):
        return {"cost_attribute": True, "list_attributes": True}
    return {"cost_attribute": recorded_choice(PATCH_COST_ATTRIBUTE, graph.cost_attribute)}


def recorded_choice(patch_id: str, configured: bool) -> bool:
    """A yes/no choice recorded as a patch marker: made from the worker's configuration when the
    run first executes, read back from the marker when it is replayed (on any worker)."""
    if workflow.unsafe.is_replaying():
        return workflow.patched(patch_id)
    return configured and workflow.patched(patch_id)
