"""What a run takes, keeps and returns.

Every model here is persisted in Temporal history (workflow input, continue-as-new input, query
and update payloads, result), so each one is a compatibility obligation for runs in flight: add
fields with defaults; never rename, retype or remove one.

A run can be started from any Temporal client with a JSON input of :class:`RunInput`'s shape,
e.g. ``temporal workflow start --type AgentRun --task-queue relaykit
--input '{"agent": "triage", "input": "I was charged twice"}'``.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field

from relaykit.budget_state import BudgetView, SpendState
from relaykit.eval_context import EvalCall, EvalContext
from relaykit.messages import Message, Usage

RunStatus = Literal[
    "running",
    "waiting_approval",
    "paused",
    "budget_reached",
    "waiting_parent_budget",
    "completed",
    "failed",
    "cancelled",
]
"""``waiting_parent_budget``: a child run at its dollar reservation waits for its parent to
grant more (docs/budgets.md); ``budget_reached``: a run waits at its own limit for a person."""

EventKind = Literal[
    "run_started",
    "model_call",
    "message",
    "tool_call",
    "tool_result",
    "tool_outcome_unknown",
    "handoff",
    "approval_requested",
    "approval_answered",
    "approval_refused",
    "message_injected",
    "steered",
    "paused",
    "resumed",
    "cancelled",
    "budget_reached",
    "budget_changed",
    "budget_asked",
    "budget_granted",
    "subagent_started",
    "subagent_finished",
    "report_delivered",
    "error",
    "context_compacted",
    "continued_as_new",
    "final",
]


AGENT_RUN_WORKFLOW = "AgentRun"
"""Workflow type of a run (compatibility data: runs in flight depend on it)."""
MODEL_ACTIVITY = "relaykit.model_call"
"""Activity type of every model call (compatibility data)."""


OnLimit = Literal["pause", "finish", "fail"]


class Budget(BaseModel):
    """Limits on what a run may spend. ``None`` means no limit. A child run's usage counts
    towards its parent's budget, so the root budget caps the whole tree.

    ``max_usd`` limits the dollars of the whole tree (docs/budgets.md): each model call's worst
    case must fit what remains, and a child (agent tool, subagent) is given ``child_share`` of
    what remains (default: an equal part among the children that may run at once and the
    parent), returned when it ends; at its reservation a child asks its parent for more, which
    grants from what it has left or is at its own limit. At the limit, ``on_limit``:
    ``"pause"`` waits for a person (``relaykit budget``), ``"finish"`` makes one last call
    without tools for the best answer so far, paid from ``finish_reserve`` (a fraction of the
    limit kept for it), ``"fail"`` ends the run with ``BudgetExceeded``. A model without a
    known price makes such a run refuse to start, unless ``unpriced="free"`` counts its calls
    as free."""

    max_total_tokens: int | None = Field(None, ge=0)
    max_requests: int | None = Field(None, ge=0)
    max_usd: float | None = Field(None, ge=0, allow_inf_nan=False)
    child_share: float | None = Field(None, gt=0, le=1)
    on_limit: OnLimit = "pause"
    finish_reserve: float = Field(0.1, ge=0, lt=1)
    unpriced: Literal["refuse", "free"] = "refuse"


_EVERY_FIELD: dict[type[BaseModel], set[str]] = {}
_Model = TypeVar("_Model", bound=BaseModel)


def share_field_sets(model: _Model) -> _Model:
    """Give ``model`` and the models it holds one set of given field names per class, where
    every field was given; returns ``model``.

    Pydantic keeps a set of the field names given for each instance. A model decoded from JSON
    (every field is in the JSON) or built with all its fields holds one with every name: 2.3 kB
    of a decoded ``RunInput``'s 3.3 kB, 0.7 kB of a ``RunEvent``'s 1.4 kB, and a waiting run
    keeps its input and events for as long as it waits (bench/README.md, issue 34). The shared
    set is only ever added to with names it already has (assigning a field adds its name), so
    every instance still reports every field as given.
    """
    fields = type(model).model_fields
    given = model.__pydantic_fields_set__
    if len(given) == len(fields):
        shared = _EVERY_FIELD.get(type(model))
        if shared is None:
            shared = _EVERY_FIELD[type(model)] = set(fields)
        if given is not shared and given == shared:
            object.__setattr__(model, "__pydantic_fields_set__", shared)
    for value in model.__dict__.values():
        if isinstance(value, BaseModel):
            share_field_sets(value)
        elif isinstance(value, list | tuple):
            for item in value:
                if isinstance(item, BaseModel):
                    share_field_sets(item)
        elif isinstance(value, dict):
            for item in value.values():
                if isinstance(item, BaseModel):
                    share_field_sets(item)
    return model


class RunEvent(BaseModel):
    """One fact about a run, in order (modelled on Eino's AgentEvent).

    ``run_path`` runs from the root run's agent to the agent that produced the event; it is set by
    relaykit only (children's events get their parent's path in front).
    """

    seq: int
    kind: EventKind
    agent: str
    turn: int
    run_path: list[str] = Field(default_factory=list)
    data: dict[str, Any] = Field(default_factory=dict)
    at: datetime | None = None


class PendingApproval(BaseModel):
    """A tool call waiting for a person.

    ``workflow_id`` is the run that owns the call: a child run's approvals surface in its
    parent (and up to the root), so a person answers them through the run they started.
    """

    call_id: str
    tool: str
    arguments: str
    agent: str
    run_path: list[str] = Field(default_factory=list)
    turn: int = 0
    requested_at: datetime | None = None
    workflow_id: str | None = None
    reason: str | None = None
    """Why a person is asked when it is not the tool's approval rule: e.g. a ``"write"`` call
    whose outcome is unknown, asked under ``<call id>.rerun`` (approve runs it again)."""


class ApprovalDecision(BaseModel):
    """A person's answer to a :class:`PendingApproval` (update and signal payload)."""

    call_id: str
    approved: bool
    reason: str | None = None
    timed_out: bool = False
    """Set by relaykit when nobody answered within the tool's ``approval_timeout``."""
    by: str = Field("", max_length=200)
    """Who answered (default ``""``: an old client, or relaykit on a timeout); recorded in the
    update's payload in history and in the ``approval_answered`` event."""


TaskStatus = Literal["running", "finished", "failed", "cancelled"]


class SubagentTask(BaseModel):
    """A background subagent the run spawned."""

    id: str
    agent: str
    workflow_id: str
    prompt: str = ""
    status: TaskStatus = "running"
    report: str | None = None
    delivered: bool = False
    usage: Usage = Field(default_factory=Usage)
    started_at: datetime | None = None
    """When the parent spawned it (``workflow.now()``): the status reminder shows elapsed time."""


class ChildReport(BaseModel):
    """What a child run tells its parent when it ends (signal payload). Sent by workflow id, so
    it reaches the parent's current run even after the parent continued as new."""

    task_id: str
    workflow_id: str
    agent: str
    status: TaskStatus
    output: str | None = None
    usage: Usage = Field(default_factory=Usage)


class ReportTarget(BaseModel):
    """Where a background run sends its :class:`ChildReport`: a signal to a workflow, and/or an
    HTTP POST (detached subagents whose parent may be gone)."""

    task_id: str
    workflow_id: str | None = None
    signal: str = "subagent_report"
    url: str | None = None


DELIVER_ACTIVITY = "relaykit.deliver_report"
"""Activity type that POSTs a detached task's report (compatibility data)."""
RECORD_DECISIONS_ACTIVITY = "relaykit.record_decisions"
"""The local activity that records what a run decided (:func:`relaykit.workflows.call_record.
recorded`): it returns its input, a list of short codes (compatibility data, as is the name)."""


class DeliveryRequest(BaseModel):
    """Input of :data:`DELIVER_ACTIVITY` (compatibility data)."""

    url: str
    report: ChildReport


class RunSetup(BaseModel):
    """Choices that change the commands a run issues and depend on a worker's configuration.

    Made once, at a run's first workflow task (and recorded there as patch markers: since
    ``relaykit.run-setup.v2`` one for every behaviour of new runs), then carried by the state,
    so any worker can replay any run whatever its own configuration. Frozen: runs that made
    the same choices share one (``relaykit.workflows.run_setup.shared_setup``).
    """

    model_config = ConfigDict(frozen=True)

    search_attributes: bool = False
    """Whether the run upserts relaykit's search attributes."""
    event_groups: bool = False
    """Whether each turn's commands carry an event group for the Temporal UI."""
    # lovia's semantics (issue 25). Each is ``False`` for runs started before it, which keep the
    # behaviour they began with, also across continue-as-new (relaykit.workflows.semantics).
    lovia_tool_names: bool = False
    """Handoff and agent-tool names follow lovia's rule (``transfer_to_billing_team``), not the
    earlier one (``transfer_to_billing_team_40edd973``)."""
    lenient_handoff_args: bool = False
    """Handoff arguments may carry other keys and a reason of any JSON type."""
    output_retries_setting: bool = False
    """Repairs of an invalid structured answer follow ``output_retries`` (default one), not
    the earlier fixed two."""
    output_schema_in_prompt: bool = False
    """The output schema is also stated in the system prompt."""
    handoff_in_request_order: bool = False
    """A turn's calls run in request order around its handoff, not the handoff last."""
    tool_effects: bool = False
    """Tool calls carry their effect, so a ``"write"`` lost in flight is reported or asked about
    instead of run again (``relaykit.workflows.tool_outcome``); ``False`` for runs started
    before, which keep running in-flight calls again, also across continue-as-new."""
    capped_outputs: bool = False
    """Every kind's result reaches the model cut to its ``max_output_chars`` (an agent tool's
    child answer too, not only function and MCP tools'); ``False`` for runs started before."""
    handoff_effects: bool = False
    """An ``on_handoff`` callback is an effect like a tool's (heartbeat, attempt claim, unknown
    outcome, idempotency key: ``relaykit.workflows.handoffs``); ``False`` for runs started
    before, whose lost callbacks run again."""
    recorded_calls: bool = False
    """Each call's decision (refused, asked a person, ran) is recorded when it is made and read
    back on replay, so edited agent definitions never change what a run already did
    (``relaykit.workflows.call_record``); ``False`` for runs started before."""
    recorded_decisions: bool = False
    """Those decisions are recorded by a local activity (one per turn with tool calls, one per
    call admitted after an approval wait, one per checked answer), not by a patch marker per
    decision (``relaykit.workflows.call_record``); ``False`` for runs started before."""
    provider_queues: bool = False
    """Model calls run on their provider's task queue (:mod:`relaykit.models.queues`), not on
    the run's; ``False`` for runs started before, which keep theirs."""
    # Since ``relaykit.run-setup.v3`` (which implies v2's choices).
    dollar_budgets: bool = False
    """A ``Budget(max_usd=...)`` is kept: prices recorded at the start, each call's worst case
    checked, children given reservations (``relaykit.workflows.spend``); ``False`` for runs
    started before, which count tokens and requests only."""
    cost_attribute: bool = False
    """Whether the run upserts ``RelayCostUSD`` with the other search attributes."""
    list_attributes: bool = False
    """Whether the run also upserts ``RelayWaitingFor`` and ``RelayLastActivity`` (the namespace
    had them when the run started; recorded in the id of the ``relaykit.run-setup.v4`` marker,
    in v3 runs by ``relaykit.run-setup.list-attributes``). ``False`` for runs started before."""
    # Since ``relaykit.run-setup.v4`` (which implies v3's choices).
    batched_attributes: bool = False
    """The run's search attributes are upserted at most once per workflow task, after its other
    commands, with the values it ends the task with (``relaykit.workflows.agent_run``);
    ``False`` for runs started before, which upsert at each change of agent or status."""
    waiting_calls_attribute: bool = False
    """Whether the run upserts ``RelayWaitingCalls`` (the call ids waiting for a person) with its
    other search attributes."""
    # Since ``relaykit.run-setup.v5`` (which implies v4's choices).
    changed_attributes: bool = False
    """An upsert writes only the search attributes whose values differ from the run's (so none at
    the first workflow task of a run whose start carried them), and ``RelayLastActivity`` only
    with a change of agent, status or what the run waits for
    (``relaykit.workflows.agent_run``); ``False`` for runs started before, whose upserts write
    them all."""
    # Since ``relaykit.run-setup.v6`` (which implies v5's choices but ``recorded_decisions``).
    bounded_decision_markers: bool = False
    """Decisions are recorded by a patch marker each, and only those that are not "run it"
    (a plain turn records nothing), for the run's first
    :data:`relaykit.workflows.call_record.MARKER_BOUND` of them; every tool turn after that is
    recorded by the local activity (``relaykit.workflows.call_record``). ``False`` for runs
    started before."""


class RepeatedCall(BaseModel):
    """One distinct tool call (name and canonical arguments) the loop guard has seen."""

    count: int = 0
    """How many times it ran since the last user-side message."""
    last_call_id: str = ""
    result: str | None = None
    """The head of its latest result, once that result is in the transcript."""


class RepeatGuardState(BaseModel):
    """What the loop guard remembers (:mod:`relaykit.workflows.loop_guard`); it lives in the
    run state so that it survives continue-as-new."""

    seen: int = 0
    """Absolute transcript length at the last check (messages after it are read at the next)."""
    calls: dict[str, RepeatedCall] = Field(default_factory=dict)
    blocked_turn: int = 0
    """The last turn in which a call was refused as a repeat, and how many were refused then
    out of how many calls that turn made."""
    blocked: int = 0
    calls_in_turn: int = 0


class RunState(BaseModel):
    """Everything a run must carry across a continue-as-new (and what queries read)."""

    agent: str
    transcript: list[Message] = Field(default_factory=list)
    usage: Usage = Field(default_factory=Usage)
    turn: int = 0
    output_retries: int = 0
    run_path: list[str] = Field(default_factory=list)
    events: list[RunEvent] = Field(default_factory=list)
    event_offset: int = 0
    """Sequence number of ``events[0]`` (older events were dropped to bound history)."""
    mailbox: list[str] = Field(default_factory=list)
    mailbox_by: list[str] = Field(default_factory=list)
    """Who sent each message of ``mailbox``, in the same order (``""``: no name given; a state
    carried from before names has none, and its messages count as unnamed)."""
    paused: bool = False
    paused_by: str = ""
    """Who last paused or resumed the run (the ``paused`` and ``resumed`` events say it)."""
    pending_approvals: dict[str, PendingApproval] = Field(default_factory=dict)
    decisions: dict[str, ApprovalDecision] = Field(default_factory=dict)
    status: RunStatus = "running"
    tasks: dict[str, SubagentTask] = Field(default_factory=dict)
    report_queue: list[str] = Field(default_factory=list)
    """Ids of finished tasks whose report waits for the next turn boundary."""
    tasks_started: int = 0
    agent_tools_started: int = 0
    """Agent-as-tool child runs started so far: numbers their workflow ids (``…/<agent>-<n>``)."""
    context_ref: str | None = None
    """Digest of the transcript prefix the last model call stored (see relaykit.transcripts)."""
    context_ref_count: int = 0
    static_refs: list[str] = Field(default_factory=list)
    """Digests of request parts (system, tools, …) the model workers have stored."""
    transcript_offset: int = 0
    """Messages before this index are kept only in the transcript store (dropped from workflow
    state at a continue-as-new so the new run's input stays small)."""
    task: Message | None = None
    """The original task (first user message); kept through context compaction."""
    runs: int = 1
    """How many workflow runs (continue-as-new generations) this run has had."""
    setup: RunSetup | None = None
    """Recorded at the first workflow task (see :class:`RunSetup`)."""
    repeats: RepeatGuardState = Field(default_factory=RepeatGuardState)
    """The loop guard's memory of identical tool calls."""
    decision_markers: list[str] = Field(default_factory=list)
    """The decision markers the run has written (``RunSetup.bounded_decision_markers``), up to
    their bound: counted from history alike live and on replay."""
    spend: SpendState | None = None
    """The dollar budget, in runs that have one (``Budget.max_usd``)."""


class ForkOrigin(BaseModel):
    """Where a forked run came from: the run and the last of its turns the fork kept."""

    run_id: str
    turn: int
    by: str = Field("", max_length=200)
    """Who forked (``""`` in forks made before names were recorded); in the new run's
    ``run_started`` event."""

    def __str__(self) -> str:
        return f"{self.run_id}@{self.turn}"


class RunInput(BaseModel):
    """The input of the ``AgentRun`` workflow."""

    agent: str
    """Name of the agent that starts the run."""
    input: str | list[Message] = ""
    """The task: a prompt, or a whole conversation to continue."""
    max_turns: int = Field(50, ge=1)
    answer_on_last_turn: bool = False
    """On the last allowed turn, withhold tools (``tool_choice="none"``) so the model must answer,
    instead of the run failing with ``MaxTurnsExceeded``."""
    budget: Budget | None = None
    extra_instructions: str | None = None
    """Appended to the system prompt of every agent the run reaches."""
    context: dict[str, Any] = Field(default_factory=dict)
    """Application data for dynamic instructions (must be JSON; never put secrets here)."""
    run_path: list[str] = Field(default_factory=list)
    """Set by relaykit for child runs: the parent's path."""
    state: RunState | None = None
    """Set by relaykit on continue-as-new."""
    parent_workflow_id: str | None = None
    """Set for agent-as-tool children: approvals requested inside surface in the parent."""
    report_to: ReportTarget | None = None
    """Set for background subagents: where the final report goes."""
    budget_from: str | None = None
    """Set by relaykit for a child whose dollar limit is a reservation of a parent that grants
    more: the parent's workflow id, which the child asks at its limit (docs/budgets.md)."""
    unattended: bool = False
    """No person watches this run: tools needing approval are rejected at once."""
    transcript_transport: Literal["stored", "inline"] = "stored"
    """How the transcript reaches model calls (see relaykit.workflows.context)."""
    continue_as_new_after_turns: int | None = None
    """Continue as new after this many turns in one workflow run (besides when Temporal suggests
    it or the history passes ``continue_as_new_after_events``)."""
    continue_as_new_after_events: int = 10_000
    output_retries: int | None = Field(None, ge=0)
    """Repair requests after an invalid structured answer, for every agent the run reaches
    (``None``: each agent's ``Agent.output_retries``)."""
    fork: ForkOrigin | None = None
    """Set by :func:`relaykit.fork_run`: ``input`` holds the origin's first ``fork.turn`` turns,
    and this run counts its turns on from there."""
    priority: int | None = Field(None, ge=1, le=5)
    """Temporal's ``priority_key`` of the run (1 first, 3 when unset), recorded: the run's
    workflow tasks, model calls, tools and children inherit it (:mod:`relaykit.fleet`)."""
    tenant: str | None = Field(None, min_length=1, max_length=64)
    """Temporal's ``fairness_key`` of the run and of all it starts (:mod:`relaykit.fleet`)."""
    tenant_weight: float | None = Field(None, gt=0)
    """Temporal's ``fairness_weight`` for :attr:`tenant` (1.0 when unset)."""
    evaluation: EvalContext | None = None
    """Set by an evaluation (:mod:`relaykit.evals`) on a candidate run: its tool calls are
    answered from the recorded run's results, never by surprise (:mod:`relaykit.eval_context`)."""


class RunResult(BaseModel):
    """What a finished run returns."""

    output: Any
    """The final answer: text, or the JSON form of the agent's ``output_type``."""
    final_agent: str
    usage: Usage
    turns: int
    transcript: list[Message] = Field(default_factory=list)
    """The transcript since the run's last continue-as-new (``transcript_offset`` messages
    before it are in the transcript store, under ``transcript_ref``)."""
    transcript_ref: str | None = None
    transcript_offset: int = 0
    forked_from: str | None = None
    """``"<run id>@<turn>"`` for a run started by :func:`relaykit.fork_run`."""
    evaluation: list[EvalCall] | None = None
    """For a candidate run of an evaluation: each tool call it made and whether it was answered
    from the recording, run live or blocked (``None`` on other runs)."""


class RunSnapshot(BaseModel):
    """The ``state`` query: a run's status without side effects."""

    status: RunStatus
    agent: str
    turn: int
    usage: Usage
    pending_approvals: list[PendingApproval] = Field(default_factory=list)
    paused: bool = False
    mailbox: int = 0
    budget: BudgetView | None = None
    """The dollar budget, in runs that have one."""
