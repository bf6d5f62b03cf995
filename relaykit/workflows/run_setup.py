"""What a run decides once, in its first workflow task, about the commands it will issue, and how
that choice is recorded (docs/replay.md): the behaviours new runs have, search-attribute upserts
and event groups. Any worker replays the run the way it was recorded, whatever its own
configuration; the choice then travels in ``RunState.setup`` across continue-as-new.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

from temporalio import workflow

from relaykit.graph import AgentGraph
from relaykit.runs import RunSetup
from relaykit.workflows.call_record import recorded_calls
from relaykit.workflows.semantics import (
    PATCHES,
    recorded_attribute_choices,
    recorded_choice,
    recorded_path_checks,
    recorded_semantics,
    recorded_tool_effects,
)

# Patch ids (docs/replay.md): each guards a change in the commands a run issues, and is only
# consulted when the change applies (a marker lands in history only then).
PATCH_RUN_SETUP = "relaykit.run-setup"
PATCH_RUN_SETUP_V2 = "relaykit.run-setup.v2"
"""A run that makes every choice of :data:`NEW_RUN_CHOICES` as new runs do, recorded by this
one marker instead of a marker each (each also upserts ``TemporalChangeVersion``, and a dozen
filled the first screen of the Temporal UI's compact view). A later change of what new runs
do gets a patch of its own, asked for after this one (or a ``v3`` that implies it)."""
PATCH_RUN_SETUP_V3 = "relaykit.run-setup.v3"
"""v2's choices and those of :data:`NEW_RUN_CHOICES_V3` (dollar budgets, provider queues), by
one marker."""
PATCH_RUN_SETUP_V4 = "relaykit.run-setup.v4"
"""v3's choices and :data:`NEW_RUN_CHOICES_V4`, with the worker's search-attribute choices
recorded by the same marker (:data:`SETUP_V4_IDS`): a new run writes one marker and one
``TemporalChangeVersion`` upsert where v3 wrote up to three of each."""
SETUP_V4_IDS: dict[tuple[bool, bool, bool, bool], str] = {
    (False, False, False, False): PATCH_RUN_SETUP_V4,
    **{
        (True, cost, listed, waiting): f"{PATCH_RUN_SETUP_V4}+search-attributes"
        + ("+cost" if cost else "")
        + ("+list-attributes" if listed else "")
        + ("+waiting-calls" if waiting else "")
        for cost in (False, True)
        for listed in (False, True)
        for waiting in (False, True)
    },
}
"""The v4 marker's id for each (search attributes, ``RelayCostUSD``, ``RelayWaitingFor`` with
``RelayLastActivity``, ``RelayWaitingCalls``) choice (compatibility data: never rename)."""
PATCH_RUN_SETUP_V5 = "relaykit.run-setup.v5"
"""v4's choices and :data:`NEW_RUN_CHOICES_V5` (upserts write only what changed), with the same
search-attribute choices in its id (:data:`SETUP_V5_IDS`)."""
SETUP_V5_IDS: dict[tuple[bool, bool, bool, bool], str] = {
    choice: PATCH_RUN_SETUP_V5 + patch_id.removeprefix(PATCH_RUN_SETUP_V4)
    for choice, patch_id in SETUP_V4_IDS.items()
}
"""The v5 marker's id for each choice, as :data:`SETUP_V4_IDS` (compatibility data)."""
PATCH_RUN_SETUP_V6 = "relaykit.run-setup.v6"
"""v5's choices with :data:`NEW_RUN_CHOICES_V6` (a decision marker only for a decision that is
not "run it", up to a bound, instead of a local activity per tool turn), with the same
search-attribute choices in its id (:data:`SETUP_V6_IDS`)."""
SETUP_V6_IDS: dict[tuple[bool, bool, bool, bool], str] = {
    choice: PATCH_RUN_SETUP_V6 + patch_id.removeprefix(PATCH_RUN_SETUP_V4)
    for choice, patch_id in SETUP_V4_IDS.items()
}
"""The v6 marker's id for each choice, as :data:`SETUP_V4_IDS` (compatibility data)."""
PATCH_PROVIDER_QUEUES = "relaykit.run-setup.provider-queues"
"""Model calls on provider queues, in runs recorded with :data:`PATCH_RUN_SETUP_V2` (asked right
after it: runs recorded with v2 before it have no such marker and keep their queue); runs with
:data:`PATCH_RUN_SETUP_V3` have them by that marker alone."""
PATCH_SEARCH_ATTRIBUTES = "relaykit.run-setup.search-attributes"
PATCH_EVENT_GROUPS = "relaykit.run-setup.event-groups"


def recorded_setup(graph: AgentGraph) -> RunSetup:
    """Decide the run's setup from ``graph`` (the worker's configuration) and record it, as
    patch markers in the first workflow task: since v4 one marker for everything, since v2 one
    for the behaviours, before one each; on replay, read back what was recorded."""
    recorded = _recorded_attribute_choice(graph)  # since v4: one marker for all its choices
    if recorded is not None:
        version, (search_attributes, cost_attribute, list_attributes, waiting_calls) = recorded
        choices = dict.fromkeys(_CHOICES_OF[version], True)
        return shared_setup(
            search_attributes=search_attributes,
            cost_attribute=cost_attribute,
            list_attributes=list_attributes,
            waiting_calls_attribute=waiting_calls,
            event_groups=recorded_choice(PATCH_EVENT_GROUPS, graph.event_groups),
            **choices,
        )
    v3 = workflow.patched(PATCH_RUN_SETUP_V3)  # recorded by v3: a marker for its choices
    current = v3 or workflow.patched(PATCH_RUN_SETUP_V2)
    if not current and not workflow.patched(PATCH_RUN_SETUP):  # before they were recorded
        return shared_setup(
            search_attributes=graph.search_attributes,
            event_groups=graph.event_groups,
        )
    search_attributes = recorded_choice(PATCH_SEARCH_ATTRIBUTES, graph.search_attributes)
    event_groups = recorded_choice(PATCH_EVENT_GROUPS, graph.event_groups)
    if current:
        choices = dict.fromkeys(NEW_RUN_CHOICES_V3 if v3 else NEW_RUN_CHOICES, True)
        if v3 and search_attributes:  # RelayCostUSD, and RelayWaitingFor/RelayLastActivity
            choices.update(recorded_attribute_choices(graph))
        if not v3:  # provider queues came after v2, with a marker of their own
            choices["provider_queues"] = workflow.patched(PATCH_PROVIDER_QUEUES)
    else:  # recorded before v2: a marker each, in this order
        choices = {
            **recorded_semantics(),  # [lovia semantics, issue 25] relaykit.workflows.semantics
            **recorded_tool_effects(),  # [tool effects] relaykit.workflows.tool_outcome
            **recorded_calls(),  # [deploys] relaykit.workflows.call_record
            **recorded_path_checks(),  # [one tool path] output caps, handoff callback effects
        }
    return shared_setup(search_attributes=search_attributes, event_groups=event_groups, **choices)


_SHARED: dict[tuple[tuple[str, bool], ...], RunSetup] = {}


def shared_setup(**choices: bool) -> RunSetup:
    """The one :class:`RunSetup` (frozen) for these choices, shared by every run on this worker
    that made them: a worker holding thousands of waiting runs keeps a handful of setups, not
    one each (its field set alone is over a kilobyte, and ``share_field_sets`` cannot share a
    set that names only the fields given)."""
    key = tuple(sorted(choices.items()))
    setup = _SHARED.get(key)
    if setup is None:
        setup = _SHARED[key] = RunSetup(**choices)
    return setup


NEW_RUN_CHOICES = (
    *PATCHES,  # [lovia semantics, issue 25] relaykit.workflows.semantics
    "tool_effects",  # relaykit.workflows.tool_outcome
    "recorded_calls",  # [deploys] relaykit.workflows.call_record
    "recorded_decisions",  # by the local activity (relaykit.workflows.call_record)
    "capped_outputs",  # [one tool path] every kind's result capped (relaykit.workflows.tool_path)
    "handoff_effects",  # [one tool path] on_handoff guarded as an effect
)
"""The ``RunSetup`` fields a run with :data:`PATCH_RUN_SETUP_V2` has on."""
NEW_RUN_CHOICES_V3 = (*NEW_RUN_CHOICES, "dollar_budgets", "provider_queues")
"""Those a run with :data:`PATCH_RUN_SETUP_V3` has on (``dollar_budgets``:
relaykit.workflows.spend; ``provider_queues``: relaykit.models.queues)."""
NEW_RUN_CHOICES_V4 = (*NEW_RUN_CHOICES_V3, "batched_attributes")
"""Those a run with :data:`PATCH_RUN_SETUP_V4` has on (``batched_attributes``:
relaykit.workflows.agent_run)."""
NEW_RUN_CHOICES_V5 = (*NEW_RUN_CHOICES_V4, "changed_attributes")
"""Those a run with :data:`PATCH_RUN_SETUP_V5` has on (``changed_attributes``:
relaykit.workflows.agent_run)."""
NEW_RUN_CHOICES_V6 = (
    *(choice for choice in NEW_RUN_CHOICES_V5 if choice != "recorded_decisions"),
    "bounded_decision_markers",
)
"""Those a run with :data:`PATCH_RUN_SETUP_V6` has on: v5's, with its decisions recorded by a
bounded number of markers before the local activity (``bounded_decision_markers``:
relaykit.workflows.call_record)."""
_CHOICES_OF = {4: NEW_RUN_CHOICES_V4, 5: NEW_RUN_CHOICES_V5, 6: NEW_RUN_CHOICES_V6}


def _recorded_attribute_choice(
    graph: AgentGraph,
) -> tuple[int, tuple[bool, bool, bool, bool]] | None:
    """The marker version (4 to 6) and the (search attributes, ``RelayCostUSD``, list
    attributes, ``RelayWaitingCalls``) choice of a run recorded with :data:`PATCH_RUN_SETUP_V4`
    or later, or ``None`` for a run recorded before v4. Live, the worker's configuration decides
    and the one matching v6 marker records it; a replay reads which marker the history has (a
    ``patched`` call for an id not recorded writes nothing then)."""
    if workflow.unsafe.is_replaying():
        for version, ids in ((6, SETUP_V6_IDS), (5, SETUP_V5_IDS), (4, SETUP_V4_IDS)):
            for choice, patch_id in ids.items():
                if workflow.patched(patch_id):
                    return version, choice
        return None
    on = graph.search_attributes
    choice = (
        on,
        on and graph.cost_attribute,
        on and graph.list_attributes,
        on and graph.waiting_calls_attribute,
    )
    workflow.patched(SETUP_V6_IDS[choice])  # live: true, and its marker records the choice
    return 6, choice
