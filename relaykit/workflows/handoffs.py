"""Handoffs as a kind of tool: the call's arguments, its ``on_handoff`` activity, its outcome.

A handoff goes through the tool path like every other tool (events, argument check, loop
guard, transcript message); it is a *barrier*: it runs after the turn's other calls, and only
the first valid handoff of a turn runs (the tool path rejects a second one). Its outcome names
the switch; the turn loop switches agents at the end of the turn (one place:
``TurnLoop._switch_agent``), running the handoff's ``input_filter`` through
:func:`filtered_history`.

Workflow code: deterministic, no I/O (``on_handoff`` is an activity).
"""

from __future__ import annotations

import json
from datetime import timedelta

from temporalio import workflow
from temporalio.common import RetryPolicy
from temporalio.exceptions import ActivityError, ApplicationError, is_cancelled_exception

from relaykit import errors
from relaykit.agent import Agent, Handoff
from relaykit.handoff import HandoffArgs, HandoffCallbackInput, HandoffInputData, parse_handoff_args
from relaykit.messages import Message, ToolCall, ToolSpec
from relaykit.tools import ToolOutcome
from relaykit.workflows import tool_outcome
from relaykit.workflows.approvals import Approvals
from relaykit.workflows.call_record import ROUTE_HANDOFF, route
from relaykit.workflows.loop_guard import PATCH_ALL_KINDS
from relaykit.workflows.run_state import Run, head
from relaykit.workflows.tool_kind import PATCH_BAD_ARGUMENTS, Prepared, ToolKind, ToolResult

HANDOFF_CALLBACK_RETRY = RetryPolicy(
    initial_interval=timedelta(milliseconds=200),
    backoff_coefficient=2.0,
    maximum_attempts=3,
)
"""``on_handoff`` is on the conversation's critical path: a few quick retries for a blip, then the
handoff fails with an error result (Temporal's default policy would retry a broken callback
forever and stall the run)."""


def handoff_heartbeat(handoff: Handoff) -> timedelta:
    """``Handoff.heartbeat_timeout`` as a ``timedelta`` (the definition accepts seconds)."""
    value = handoff.heartbeat_timeout
    return value if isinstance(value, timedelta) else timedelta(seconds=value)


class HandoffTool(ToolKind):
    barrier = True
    guard_patch = PATCH_ALL_KINDS  # guarded since the tool path is one

    def __init__(
        self,
        run: Run,
        agent: str,
        handoff: Handoff,
        name: str,
        run_name: str,
        *,
        approvals: Approvals | None = None,
        source: Agent | None = None,
    ) -> None:
        self.run = run
        self.agent = agent
        self.approvals = approvals
        self.source = source
        """Who a person is asked on behalf of when the callback's outcome is unknown and the
        handoff says ``on_unknown="ask"``."""
        self.handoff = handoff
        self.name = name
        """The name a call uses: the run's, or an earlier one that still resolves."""
        self.run_name = run_name
        """The name this run uses (lovia's, or the earlier one a run started before it
        recorded): what the model is shown, and the ``on_handoff`` activity's type."""
        callback = ("callback",) if handoff.on_handoff is not None else ()
        self.route = route(ROUTE_HANDOFF, handoff.target.name, *callback)

    def spec(self) -> ToolSpec:
        return self.handoff.spec_named(self.run_name)

    def prepare(self, call: ToolCall) -> Prepared | ToolResult:
        """The handoff's arguments, or the error result for invalid ones (a handoff the model
        got wrong does not switch agents: the model reads why and may call it again)."""
        # [lovia semantics] extra keys ignored, any JSON reason kept as text (runs recorded
        # before: the strict schema)
        args, problem = parse_handoff_args(
            call.arguments, lenient=self.run.setup_flag("lenient_handoff_args")
        )
        if args is not None:
            return Prepared(call, args)
        if not self.run.patched(PATCH_BAD_ARGUMENTS):  # recorded when any handoff switched
            return Prepared(call, HandoffArgs())
        return ToolResult(
            f"The handoff did not happen: invalid arguments for {call.name!r}: {problem}. "
            'Call it again with {} or {"reason": "<text>"}.',
            is_error=True,
        )

    def replayed(self, call: ToolCall) -> Prepared:
        prepared = self.prepare(call)
        if isinstance(prepared, ToolResult):  # arguments today's rule refuses: the switch stands
            prepared = Prepared(call, HandoffArgs())
        return prepared

    async def execute(self, prepared: Prepared) -> ToolResult:
        """Run the handoff's ``on_handoff``; the switch itself waits for the end of the turn."""
        handoff, args = self.handoff, prepared.arguments
        said: dict[str, str] = {"assistant": handoff.target.name}
        if handoff.on_handoff is not None:
            try:
                unknown = await self._callback(prepared.call, args)
            except ActivityError as exc:
                if is_cancelled_exception(exc):
                    raise
                detail = getattr(exc.cause, "message", None) or str(exc)
                return ToolResult(
                    f"The handoff did not happen: on_handoff failed: {detail}", is_error=True
                )
            if unknown is not None:
                said["on_handoff"] = unknown
        return ToolResult(json.dumps(said), switch=(handoff, args.reason))

    async def _callback(self, call: ToolCall, args: HandoffArgs) -> str | None:
        """Run ``on_handoff`` as its activity; returns what the model reads when the callback's
        outcome is unknown (``None``: it returned).

        [effects] In runs that record it (``RunSetup.handoff_effects``) the callback is guarded
        like a tool of its effect: it heartbeats, carries an idempotency key, and a ``"write"``
        lost while it ran is not started again (:mod:`relaykit.workflows.tool_outcome`). The
        handoff then still happens: the model chose it, and failing it would invite the model
        to call it again, starting the callback a second time. Runs recorded before schedule
        the callback as they did, and its lost attempts run again."""
        handoff = self.handoff
        effects = self.run.setup_flag("handoff_effects")
        data = HandoffCallbackInput(
            source=self.agent,
            target=handoff.target.name,
            reason=args.reason,
            turn=self.run.state.turn,
            workflow_id=workflow.info().workflow_id,
            **(
                tool_outcome.invocation_fields(self.run, call, handoff.effect, handoff.on_unknown)
                if effects
                else {}
            ),
        )

        async def execute(sent: HandoffCallbackInput) -> ToolOutcome:
            await workflow.execute_activity(
                self.run_name,  # [lovia] the name as the run recorded it
                sent,
                start_to_close_timeout=timedelta(minutes=1),
                heartbeat_timeout=handoff_heartbeat(handoff) if effects else None,
                retry_policy=HANDOFF_CALLBACK_RETRY,
                summary=tool_outcome.summary(f"{self.agent} → {handoff.target.name}", sent),
            )
            return ToolOutcome(content="")

        if not effects or self.approvals is None or self.source is None:
            await execute(data)
            return None
        outcome = await tool_outcome.run_guarded(
            self.run,
            self.approvals,
            self.source,
            self,
            call,
            data,
            execute,
            what=f"on_handoff of {call.name!r}",
        )
        return outcome.content if outcome.is_error else None


def filtered_history(handoff: Handoff, source: str, history: list[Message]) -> list[Message]:
    """Run a handoff's ``input_filter``. It is user code in the workflow: one that raises (the
    sandbox's refusals included) or returns something other than messages would do the same on
    every retry, so the run ends with ``HandoffFilterFailed`` rather than failing its workflow
    task forever."""
    target = handoff.target.name
    assert handoff.input_filter is not None
    try:
        filtered = list(
            handoff.input_filter(HandoffInputData(source=source, target=target, history=history))
        )
    except Exception as exc:  # noqa: BLE001 - any bug in the filter ends the run the same way
        problem = f"raised {type(exc).__name__}: {head(str(exc))}"
    else:
        wrong = next((item for item in filtered if not isinstance(item, Message)), None)
        if wrong is None:
            return filtered
        problem = f"returned a {type(wrong).__name__} among its messages"
    raise ApplicationError(
        f"the input_filter of handoff {source} → {target} {problem}",
        type=errors.HANDOFF_FILTER_FAILED,
        non_retryable=True,
    )
