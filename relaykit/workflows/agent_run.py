"""``AgentRun``: the workflow that runs one agent run, started by agent name.

It is a thin shell around :class:`relaykit.workflows.loop.TurnLoop`: it finds the agent graph the
worker serves, exposes the loop's state to people (queries, the Temporal UI's current details and
search attributes), and turns signals and updates into changes the loop applies at turn
boundaries. The workflow type name, query/signal/update names and their payloads are
compatibility data for runs in flight.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from temporalio import workflow
from temporalio.api.common.v1 import Payload
from temporalio.common import RawValue, SearchAttributeUpdate
from temporalio.exceptions import ApplicationError, is_cancelled_exception

from relaykit import errors, registry
from relaykit.authors import MAX_AUTHOR_LENGTH, received_author
from relaykit.budget_state import BudgetAnswer, BudgetAsk, BudgetChange, BudgetView
from relaykit.runs import (
    AGENT_RUN_WORKFLOW,
    ApprovalDecision,
    ChildReport,
    PendingApproval,
    ReportTarget,
    RunEvent,
    RunInput,
    RunResult,
    RunSnapshot,
    RunState,
    TaskStatus,
    share_field_sets,
)
from relaykit.search_attributes import (
    RELAY_AGENT,
    RELAY_COST_USD,
    RELAY_LAST_ACTIVITY,
    RELAY_STATUS,
    RELAY_TOKENS,
    RELAY_WAITING_CALLS,
    RELAY_WAITING_FOR,
    changed_only,
    keyword,
    waiting_call_ids,
)
from relaykit.workflows.agent_tools import cancel_parent
from relaykit.workflows.approvals import CHILD_APPROVAL_DONE_SIGNAL, CHILD_APPROVAL_SIGNAL
from relaykit.workflows.budget_plan import ANSWER_SIGNAL, ASK_SIGNAL, change_problem
from relaykit.workflows.loop import TurnLoop
from relaykit.workflows.spend import Spend
from relaykit.workflows.subagent_tasks import REPORT_SIGNAL, send_report

NO_INPUT = RawValue(Payload())
"""What a start request without any input arrives as (it then fails with ``InvalidRunInput``)."""


@workflow.defn(name=AGENT_RUN_WORKFLOW)
class AgentRun:
    @workflow.init
    def __init__(self, input: RawValue = NO_INPUT) -> None:
        graph = registry.graph_for(workflow.info().task_queue)
        if graph is None:  # pragma: no cover - a relaykit Worker always registers its graph
            raise RuntimeError("no relaykit agent graph registered for this task queue")
        self._graph = graph
        self._input, self._input_error = _parse_input(input)
        self._loop = TurnLoop(graph, self._input)
        self._loop.on_change = self._publish
        self._published: tuple[str, str, tuple[str, ...], int, str] | None = None
        self._upsert_due = False
        """An upsert is scheduled for the end of this workflow task (``batched_attributes``)."""

    @workflow.run
    async def run(self, input: RawValue = NO_INPUT) -> RunResult:
        """``input`` is a :class:`RunInput`; it arrives raw and is parsed here, so that a start
        request with a malformed input (from the ``temporal`` CLI or any client) fails the run
        with ``InvalidRunInput`` instead of failing every workflow task, forever."""
        if self._input_error is not None:
            raise ApplicationError(
                self._input_error, type=errors.INVALID_RUN_INPUT, non_retryable=True
            )
        try:
            return await self._run()
        finally:
            self._flush_attributes()

    async def _run(self) -> RunResult:
        report_to = self._input.report_to
        if report_to is None:
            try:
                return await self._loop.run()
            except BaseException as exc:
                if is_cancelled_exception(exc):  # an agent-tool child cancels its parent too
                    await cancel_parent(self._input)
                raise
        # A background subagent: whatever happens, its parent (or delivery target) hears of it.
        try:
            result = await self._loop.run()
        except BaseException as exc:
            if is_cancelled_exception(exc):
                await self._report(report_to, "cancelled", None)
            elif isinstance(exc, ApplicationError):
                await self._report(report_to, "failed", exc.message)
            raise
        output = result.output if isinstance(result.output, str) else json.dumps(result.output)
        await self._report(report_to, "finished", output)
        return result

    async def _report(self, target: ReportTarget, status: TaskStatus, output: str | None) -> None:
        await send_report(
            target,
            ChildReport(
                task_id=target.task_id,
                workflow_id=workflow.info().workflow_id,
                agent=self._loop.state.agent,
                status=status,
                output=output,
                usage=self._loop.state.usage,
            ),
        )

    # --- what people see ------------------------------------------------------------------------

    def _publish(self) -> None:
        """Keep the Temporal UI's current details and search attributes in step with the run."""
        state = self._loop.state
        waiting = tuple(state.pending_approvals) if self._waiting_calls else ()
        key = (state.agent, state.status, waiting, state.usage.total_tokens, waiting_for(state))
        if key == self._published:
            return
        details = [
            f"**agent:** {state.agent}  ·  **status:** {state.status}  ·  **turn:** {state.turn}"
        ]
        for pending in state.pending_approvals.values():
            why = f" — {pending.reason}" if pending.reason else ""  # e.g. an unknown outcome
            details.append(
                f"- waiting for approval: `{pending.tool}` (call `{pending.call_id}`){why}"
            )
        workflow.set_current_details("\n".join(details))
        # One upsert per change of agent or status (not per turn: each is a history event), and
        # in runs that write RelayWaitingFor, per change of what the run waits for.
        listed = self._loop.setup_flag("list_attributes")
        if self._loop.setup_flag("search_attributes") and (
            self._published is None
            or key[:3] != self._published[:3]
            or (listed and key[4] != self._published[4])
        ):
            if not self._loop.setup_flag("batched_attributes"):
                self._upsert_attributes()
            elif not self._upsert_due:  # once per workflow task, after its other commands
                self._upsert_due = True
                asyncio.get_running_loop().call_soon(self._flush_attributes)
        self._published = key

    def _upsert_attributes(self) -> None:
        """Upsert the run's search attributes as they stand now (the last values of the task)."""
        self._upsert_due = False
        state = self._loop.state
        updates: list[SearchAttributeUpdate[Any]] = [
            RELAY_AGENT.value_set(keyword(state.agent)),
            RELAY_STATUS.value_set(state.status),
            RELAY_TOKENS.value_set(state.usage.total_tokens),
        ]
        if self._loop.setup_flag("cost_attribute"):
            updates.append(RELAY_COST_USD.value_set(state.usage.cost_usd))
        if self._loop.setup_flag("list_attributes"):
            reason = waiting_for(state)
            updates.append(
                RELAY_WAITING_FOR.value_set(reason) if reason else RELAY_WAITING_FOR.value_unset()
            )
            updates.append(RELAY_LAST_ACTIVITY.value_set(workflow.now()))
        if self._waiting_calls:
            waiting = list(state.pending_approvals)
            updates.append(
                RELAY_WAITING_CALLS.value_set(waiting_call_ids(waiting))
                if waiting
                else RELAY_WAITING_CALLS.value_unset()
            )
        if self._loop.setup_flag("changed_attributes"):
            updates = changed_only(updates, workflow.info().typed_search_attributes)
            if not updates:  # e.g. the first task of a run that started with its attributes
                return
        workflow.upsert_search_attributes(updates)

    @property
    def _waiting_calls(self) -> bool:
        return self._loop.setup_flag("waiting_calls_attribute")

    def _flush_attributes(self) -> None:
        """Before the run ends (or continues as new): the upsert its last task still owes comes
        before the command that ends it."""
        if self._upsert_due:
            self._upsert_attributes()

    @workflow.query
    def state(self) -> RunSnapshot:
        state = self._loop.state
        return RunSnapshot(
            status=state.status,
            agent=state.agent,
            turn=state.turn,
            usage=state.usage,
            pending_approvals=list(state.pending_approvals.values()),
            paused=state.paused,
            mailbox=len(state.mailbox),
            budget=self._budget_view(),
        )

    def _budget_view(self) -> BudgetView | None:
        spend = self._loop.state.spend
        if spend is None:
            return None
        reserved = sum(spend.reserved.values())
        cost = self._loop.state.usage.cost_usd
        phase = spend.phase if spend.asking is None else "waiting_for_parent"
        parent = self._input.budget_from if spend.grants else None
        return BudgetView(
            limit=spend.limit, spent=cost, reserved=reserved, phase=phase, parent=parent
        )

    @workflow.query
    def current_agent(self) -> str:
        return self._loop.state.agent

    @workflow.query
    def pending_approvals(self) -> list[PendingApproval]:
        return list(self._loop.state.pending_approvals.values())

    @workflow.query
    def events(self, offset: int = 0) -> list[RunEvent]:
        return self._loop.run_state.events_from(offset)

    # --- approvals ------------------------------------------------------------------------------

    @workflow.update
    def approve(self, decision: ApprovalDecision) -> PendingApproval:
        """Answer a pending approval; the caller learns at once whether it was accepted."""
        pending = self._loop.state.pending_approvals[decision.call_id]
        self._loop.approvals.answer(decision)
        return pending

    @approve.validator
    def _validate_approve(self, decision: ApprovalDecision) -> None:
        self._loop.approvals.validate(decision)

    @workflow.signal(name="approve_signal")
    def approve_signal(self, decision: ApprovalDecision) -> None:
        """The signal variant of :meth:`approve` (bulk answers: the sender checked the call was
        waiting, :mod:`relaykit.approvals`). An answer to a call that no longer waits (answered
        a moment before by someone else, timed out) changes nothing and is recorded as an
        ``approval_refused`` event with why: never dropped unseen."""
        try:
            self._loop.approvals.validate(decision)
        except ValueError as exc:
            workflow.logger.warning("refused approval: %s", exc)
            self._loop.approvals.refused(decision, str(exc))
            return
        self._loop.approvals.answer(decision)

    # --- child runs ---------------------------------------------------------------------------

    @workflow.signal(name=REPORT_SIGNAL)
    def subagent_report(self, report: ChildReport) -> None:
        self._loop.tasks.on_report(report)

    @workflow.signal(name=CHILD_APPROVAL_SIGNAL)
    def child_approval(self, pending: PendingApproval) -> None:
        self._loop.approvals.on_child_approval(pending)

    @workflow.signal(name=CHILD_APPROVAL_DONE_SIGNAL)
    def child_approval_done(self, call_id: str) -> None:
        self._loop.approvals.on_child_approval_done(call_id)

    # --- the dollar budget ------------------------------------------------------------------------

    @workflow.update
    def set_budget(self, change: BudgetChange) -> BudgetView:
        """Raise or set the run's dollar limit (a run waiting at it goes on where it stopped),
        or ask for its last answer; recorded in history with who asked."""
        Spend(self._loop.run_state).change(
            change.max_usd, change.raise_by, change.finish, change.by
        )
        view = self._budget_view()
        assert view is not None
        return view

    @workflow.signal(name=ASK_SIGNAL)
    def budget_ask(self, ask: BudgetAsk) -> None:
        """A child at its reservation asks for more: granted from what this run has left, or
        it waits with this run (docs/budgets.md)."""
        Spend(self._loop.run_state).on_ask(ask)

    @workflow.signal(name=ANSWER_SIGNAL)
    def budget_answer(self, answer: BudgetAnswer) -> None:
        """The parent's answer to this run's ask."""
        Spend(self._loop.run_state).on_answer(answer)

    @set_budget.validator
    def _validate_set_budget(self, change: BudgetChange) -> None:
        problem = change_problem(self._loop.run_state, change)
        if problem is not None:
            raise ValueError(problem)

    # --- mailbox, pause, resume -----------------------------------------------------------------

    # Each handler takes who acted (``by``) as an optional argument after its old ones: an old
    # client's call has no name, and a new client's call to an old worker still acts (the SDK
    # drops arguments a handler does not take). See relaykit.authors.

    @workflow.update
    def steer(self, text: str, by: str = "") -> bool:
        """Correct the run now: ``text`` goes to the next model call, and the turn's call in
        flight (if any) is cancelled, its answer unused; returns whether a call was cancelled. A
        summary call in flight is left to finish: the turn's call after it has ``text``."""
        return self._loop.steer(text, received_author(by))

    @steer.validator
    def _validate_steer(self, text: str, by: str = "") -> None:
        self._validate_send_message(text, by)

    @workflow.update
    def send_message(self, text: str, by: str = "") -> int:
        """Queue a user message for the next turn boundary; returns its place in the queue."""
        return self._loop.run_state.queue_message(text, received_author(by))

    @send_message.validator
    def _validate_send_message(self, text: str, by: str = "") -> None:
        if not isinstance(text, str) or not text.strip():
            raise ValueError("a message needs non-empty text")
        if not isinstance(by, str) or len(by) > MAX_AUTHOR_LENGTH:
            raise ValueError(f"a name is a string of at most {MAX_AUTHOR_LENGTH} characters")
        if self._loop.state.status in ("completed", "failed", "cancelled"):
            raise ValueError(f"the run has {self._loop.state.status}")

    @workflow.signal(name="send_message_signal")
    def send_message_signal(self, text: str, by: str = "") -> None:
        if isinstance(text, str) and text.strip():
            self._loop.run_state.queue_message(text, received_author(by))

    @workflow.signal
    def pause(self, by: str = "") -> None:
        """Stop at the next turn boundary (no model call starts while paused)."""
        self._loop.run_state.set_paused(True, received_author(by))

    @workflow.signal
    def resume(self, text: str | None = None, by: str = "") -> None:
        """Continue a paused run, optionally with a message for the model."""
        name = received_author(by)
        if text:
            self._loop.run_state.queue_message(text, name)
        self._loop.run_state.set_paused(False, name)


def _parse_input(raw: RawValue) -> tuple[RunInput, str | None]:
    """The run's input, or a stand-in and the reason the given one cannot start a run."""
    try:
        run_input = workflow.payload_converter().from_payload(raw.payload, RunInput)
    except Exception as exc:  # noqa: BLE001 - whatever a client sent, the run must end, not hang
        detail = errors.error_detail(exc)
        message = (
            f"the input is not a valid AgentRun input: {detail} (expected a JSON object such as "
            '{"agent": "triage", "input": "…"}; see relaykit.RunInput)'
        )
        return RunInput(agent=""), message
    share_field_sets(run_input)  # the run holds it (and a continued run's state) while it waits
    return run_input, None


def waiting_for(state: RunState) -> str:
    """What the run waits for a person for (``RelayWaitingFor``), ``""`` while it works: a
    decision on an unknown outcome counts before plain approvals (it is the rarer, riskier)."""
    if state.status == "waiting_approval":
        unknown = any(
            (p.reason or "").startswith("outcome unknown") for p in state.pending_approvals.values()
        )
        return "unknown_outcome" if unknown else "approval"
    return {"budget_reached": "budget", "paused": "paused"}.get(state.status, "")
