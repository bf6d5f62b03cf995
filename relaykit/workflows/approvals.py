"""Approvals: a call that needs a person waits (durably, at no cost) for their decision.

The tool path asks :meth:`Approvals.decide` for every call whose kind says it needs approval,
whatever the kind (function tools, MCP tools), and gets back ``None`` (go ahead) or the result
the model reads instead. The order of a turn's calls around one that waits
(``Agent.approval_order``, lovia's request order) is :meth:`Approvals.gates`.

Approvals cross the agent-tool boundary (Eino's action scoping): a child run announces its
pending approvals to its parent (and so to the root), and an answer sent to the parent is
forwarded to the child that owns the call.

Workflow code: deterministic, no I/O.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from temporalio import workflow

from relaykit.agent import Agent
from relaykit.messages import ToolCall
from relaykit.runs import ApprovalDecision, PendingApproval
from relaykit.workflows.run_state import Run, signal_workflow
from relaykit.workflows.tool_kind import ToolKind, ToolResult

CHILD_APPROVAL_SIGNAL = "child_approval"
CHILD_APPROVAL_DONE_SIGNAL = "child_approval_done"
PATCH_APPROVAL_ORDER = "relaykit.approval-request-order"

Gate = tuple[asyncio.Event | None, asyncio.Event | None]
"""The decision a call waits for before it starts, and the one its own decision sets."""


class Approvals:
    """The approvals of one run: waiting for decisions, answering them, forwarding them."""

    def __init__(self, run: Run) -> None:
        self.run = run
        self._decided: dict[str, asyncio.Event] = {}
        """Approval decisions later calls of the turn wait for (lovia's request order)."""

    # --- the order of a turn's calls ------------------------------------------------------------

    def gates(self, calls: list[ToolCall], wanted: list[bool], in_order: bool) -> list[Gate]:
        """For each call: the approval decision it waits for before it starts, and the event
        its own approval decision sets (lovia's order: a later call may depend on the approved
        action, so it never runs before that action is decided). ``wanted``: which calls will
        wait for a person; ``in_order``: the agent's ``approval_order`` is the request order."""
        none: list[Gate] = [(None, None)] * len(calls)
        if not in_order:
            return none
        if True not in wanted or True not in wanted[: len(calls) - 1]:
            return none  # no call comes after one that waits for a person
        if not self.run.patched(PATCH_APPROVAL_ORDER):  # recorded when every call ran at once
            return none
        gates: list[Gate] = []
        waiting: asyncio.Event | None = None
        for call, needed in zip(calls, wanted, strict=True):
            decided = asyncio.Event() if needed else None
            gates.append((waiting, decided))
            if decided is not None:
                self._decided[call.id] = decided
                waiting = decided
        return gates

    def release(self, call: ToolCall, decided: asyncio.Event | None) -> None:
        """The call is over (also when it failed before asking a person): later calls go."""
        if decided is not None:
            decided.set()
            self._decided.pop(call.id, None)

    # --- deciding -------------------------------------------------------------------------------

    async def decide(
        self, agent: Agent, kind: ToolKind, call: ToolCall, timeout: timedelta | None
    ) -> ToolResult | None:
        """Wait for a person's decision on ``call`` (at most ``timeout``, as the tool path
        decided it); ``None`` to go ahead, else the error result the model reads. Later calls
        of the turn may start as soon as it is decided."""
        decision = await self._await(agent, kind, call, timeout=timeout)
        if call.id in self._decided:
            self._decided.pop(call.id).set()
        if decision.approved:
            return None
        if decision.timed_out:
            text = "The call was not run: nobody approved it in time (approval timed out)."
        elif decision.reason:
            text = f"The call was rejected by a person: {decision.reason}."
        else:
            text = "The call was rejected by a person."
        return ToolResult(text, is_error=True)

    async def ask(
        self, agent: Agent, kind: ToolKind, call: ToolCall, *, reason: str | None = None
    ) -> ApprovalDecision:
        """Wait (durably, at no cost) for a person to approve or reject ``call``; ``reason``
        tells the person why they are asked when it is not the tool's own rule (an unknown
        outcome, :mod:`relaykit.workflows.tool_outcome`). ``kind`` names the tool and its
        approval timeout."""
        return await self._await(agent, kind, call, reason=reason, timeout=kind.approval_timeout)

    async def _await(
        self,
        agent: Agent,
        kind: ToolKind,
        call: ToolCall,
        *,
        timeout: timedelta | None,
        reason: str | None = None,
    ) -> ApprovalDecision:
        run = self.run
        state = run.state
        if call.id in state.decisions:  # answered before a continue-as-new
            return state.decisions.pop(call.id)
        if run.input.unattended:
            return ApprovalDecision(
                call_id=call.id,
                approved=False,
                reason="no person can approve calls in an unattended background task",
            )
        pending = PendingApproval(
            call_id=call.id,
            tool=kind.name,
            arguments=call.arguments,
            agent=agent.name,
            run_path=state.run_path,
            turn=state.turn,
            requested_at=workflow.now(),
            workflow_id=workflow.info().workflow_id,
            reason=reason,
        )
        state.pending_approvals[call.id] = pending
        run.emit("approval_requested", pending.model_dump(mode="json"))
        run.set_status("waiting_approval")
        parent = run.input.parent_workflow_id
        if parent:  # the parent (and so the root) shows it to a person
            await signal_workflow(parent, CHILD_APPROVAL_SIGNAL, pending)
        try:
            await workflow.wait_condition(lambda: call.id in state.decisions, timeout=timeout)
            decision = state.decisions.pop(call.id)
        except TimeoutError:
            decision = ApprovalDecision(
                call_id=call.id, approved=False, reason="approval timed out", timed_out=True
            )
        state.pending_approvals.pop(call.id, None)
        run.emit("approval_answered", decision.model_dump(mode="json"))
        if parent:
            await signal_workflow(parent, CHILD_APPROVAL_DONE_SIGNAL, call.id)
        if not state.pending_approvals:
            run.set_status("running")
        return decision

    # --- answers from people (update and signal handlers) ---------------------------------------

    def answer(self, decision: ApprovalDecision) -> None:
        """Record a person's answer; answers for a child run's call are forwarded to it."""
        run = self.run
        if self._forward(decision):
            run.state.pending_approvals.pop(decision.call_id, None)
            run.emit("approval_answered", decision.model_dump(mode="json"))
            if not run.state.pending_approvals:
                run.set_status("running")
            return
        run.state.decisions[decision.call_id] = decision

    def refused(self, decision: ApprovalDecision, why: str) -> None:
        """A signalled answer that could not apply: recorded as an event (it changes no state a
        replay depends on, so runs recorded before replay as they did)."""
        data = decision.model_dump(mode="json", exclude_defaults=True)
        self.run.emit("approval_refused", {**data, "why": why})

    def validate(self, decision: ApprovalDecision) -> None:
        state = self.run.state
        if decision.call_id in state.decisions:
            raise ValueError(f"call {decision.call_id!r} was already answered")
        if decision.call_id not in state.pending_approvals:
            if any(
                event.kind == "approval_answered" and event.data.get("call_id") == decision.call_id
                for event in state.events
            ):
                raise ValueError(f"call {decision.call_id!r} was already answered")
            waiting = ", ".join(state.pending_approvals) or "none"
            raise ValueError(
                f"no pending approval with call id {decision.call_id!r} (waiting: {waiting})"
            )

    def _forward(self, decision: ApprovalDecision) -> bool:
        """Send an answer to the child that owns the call; ``False`` if the call is ours."""
        pending = self.run.state.pending_approvals.get(decision.call_id)
        if pending is None or pending.workflow_id in (None, workflow.info().workflow_id):
            return False
        self.run.spawn(signal_workflow(pending.workflow_id, "approve_signal", decision))
        return True

    # --- a child's approvals (signal handlers) --------------------------------------------------

    def on_child_approval(self, pending: PendingApproval) -> None:
        run = self.run
        run.state.pending_approvals[pending.call_id] = pending
        run.set_status("waiting_approval")
        run.emit("approval_requested", pending.model_dump(mode="json"), agent=pending.agent)
        parent = run.input.parent_workflow_id
        if parent:
            run.spawn(signal_workflow(parent, CHILD_APPROVAL_SIGNAL, pending))

    def on_child_approval_done(self, call_id: str) -> None:
        run = self.run
        if run.state.pending_approvals.pop(call_id, None) is not None:
            if not run.state.pending_approvals:
                run.set_status("running")
        parent = run.input.parent_workflow_id
        if parent:
            run.spawn(signal_workflow(parent, CHILD_APPROVAL_DONE_SIGNAL, call_id))
