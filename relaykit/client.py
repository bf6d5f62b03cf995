"""Client helpers: connect the way Temporal users expect, start runs by agent name, and talk to
a run (result, state, events, approvals, messages, pause/resume, cancel).

A run is a plain Temporal workflow, so every helper here has an equivalent with any Temporal
client or the ``temporal`` CLI; these only add types and clear errors.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from temporalio.client import Client, WorkflowExecutionStatus, WorkflowFailureError, WorkflowHandle
from temporalio.common import TypedSearchAttributes
from temporalio.converter import DataConverter, PayloadCodec
from temporalio.envconfig import ClientConfig
from temporalio.exceptions import ApplicationError, CancelledError

from relaykit.agent import Agent, Budget
from relaykit.authors import author, cancel_reason
from relaykit.budget_state import BudgetChange, BudgetView
from relaykit.codec import codec_from_env, compose_data_converter
from relaykit.errors import (
    RUN_CANCELLED,
    ApprovalNotWaiting,
    ConfigurationError,
    RelaykitError,
    RunFailed,
    TextTooLong,
)
from relaykit.messages import Message
from relaykit.names import slug
from relaykit.payload_storage import with_external_storage
from relaykit.run_ids import check_run_id
from relaykit.runs import (
    AGENT_RUN_WORKFLOW,
    ApprovalDecision,
    PendingApproval,
    RunEvent,
    RunInput,
    RunResult,
    RunSnapshot,
)
from relaykit.schedule_options import task_queue_name
from relaykit.storage import Store
from relaykit.streaming import DEFAULT_POLL_INTERVAL, StreamCursor, StreamEvent, stream_run
from relaykit.tracing import has_tracing_interceptor, temporal_interceptor, tracing_enabled

DEFAULT_TASK_QUEUE = "relaykit"


async def connect(
    target: str | None = None,
    *,
    namespace: str | None = None,
    profile: str | None = None,
    tracing: bool | None = None,
    tracer: Any = None,
    store: Store | str | None = None,
    codec: PayloadCodec | None = None,
    data_converter: DataConverter | None = None,
    **options: Any,
) -> Client:
    """Connect with Temporal's environment configuration (``TEMPORAL_ADDRESS``,
    ``TEMPORAL_NAMESPACE``, ``TEMPORAL_PROFILE`` and the config file) and relaykit's pydantic
    data converter.

    ``tracing`` (default: ``RELAYKIT_TRACING``) adds Temporal's OpenTelemetry interceptor, so a
    run started with this client is one trace rooted at its ``StartWorkflow`` span (see
    :mod:`relaykit.tracing`); workers built on this client trace too.

    Payloads too large for Temporal history are kept in ``store`` (default ``RELAYKIT_STORE``;
    see :mod:`relaykit.storage`), the same store workers use.

    ``codec`` (default: the one ``RELAYKIT_CODEC`` names, when ``data_converter`` has none)
    encodes every payload, e.g. to encrypt it; a ``data_converter`` keeps its codec, failure
    converter and external storage and gets pydantic payload conversion (see
    :func:`relaykit.codec.compose_data_converter`). Workers built on this client use the same
    codec, for Temporal and for the transcript store."""
    config: dict[str, Any] = dict(ClientConfig.load_client_connect_config(profile=profile))
    if target:
        config["target_host"] = target
    config.setdefault("target_host", "localhost:7233")
    if namespace:
        config["namespace"] = namespace
    config.update(options)
    if codec is None and (data_converter is None or data_converter.payload_codec is None):
        codec = codec_from_env()
    config["data_converter"] = with_external_storage(
        compose_data_converter(data_converter, codec),
        store if isinstance(store, Store) else Store(store),
    )
    if tracing_enabled(tracing):
        interceptors = list(config.get("interceptors") or ())
        if not has_tracing_interceptor(interceptors):
            interceptors.append(temporal_interceptor(tracer))
        config["interceptors"] = interceptors
    try:
        return await Client.connect(**config)
    except RuntimeError as exc:
        raise RelaykitError(
            f"cannot reach the Temporal server at {config['target_host']}: {exc}",
            hint="start one with `relaykit dev`, or set TEMPORAL_ADDRESS",
        ) from None
    except ValueError as exc:  # e.g. "invalid target URL" for an address that is no host:port
        raise RelaykitError(
            f"not a Temporal address: {config['target_host']!r} ({exc})",
            hint="give host:port, e.g. localhost:7233",
        ) from None


MAX_TEXT_BYTES = 1 << 20
"""The longest text an operator sends a run (a message, a steer, a resume text, an approval's
reason), as JSON in UTF-8. An update's input comes back in the worker's answer that accepts it,
and the SDK refuses to send an answer over 2 MB: a longer text failed the run's workflow task
at every retry, and the run wedged. Signals over 2 MB the server refuses itself."""


def check_text(text: str | None, what: str) -> None:
    """:class:`TextTooLong` for a ``text`` over :data:`MAX_TEXT_BYTES`: the one check of every
    path that sends an operator's text (:class:`RunHandle`, answering in bulk)."""
    if text is None:
        return
    size = len(json.dumps(text, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    if size > MAX_TEXT_BYTES:
        raise TextTooLong(
            f"{what} is {size:,} bytes long, over the {MAX_TEXT_BYTES:,} a run takes",
            hint="put a long document where the run's tools can read it, and send its name",
        )


class RunHandle:
    """A handle on one run (a Temporal workflow handle with relaykit's types)."""

    def __init__(self, handle: WorkflowHandle[Any, Any], client: Client | None = None) -> None:
        self.workflow = handle
        self.client: Client = client or handle._client  # the SDK keeps no public accessor

    @property
    def id(self) -> str:
        return self.workflow.id

    @property
    def run_id(self) -> str | None:
        return self.workflow.result_run_id or self.workflow.run_id

    async def result(self) -> RunResult:
        """Wait for the run's end; raises :class:`RunFailed` (with its ``type``) if it failed."""
        try:
            result: RunResult = await self.workflow.result()
            return result
        except WorkflowFailureError as exc:
            cause = exc.cause
            if isinstance(cause, ApplicationError):
                raise RunFailed(cause.message, type=cause.type) from exc
            if isinstance(cause, CancelledError):
                raise RunFailed("the run was cancelled", type=RUN_CANCELLED) from exc
            raise RunFailed(str(cause or exc)) from exc

    async def state(self) -> RunSnapshot:
        snapshot: RunSnapshot = await self.workflow.query("state", result_type=RunSnapshot)
        return snapshot

    async def events(self, offset: int = 0) -> list[RunEvent]:
        events: list[RunEvent] = await self.workflow.query(
            "events", offset, result_type=list[RunEvent]
        )
        return events

    def stream(
        self,
        from_offset: int | str | StreamCursor = 0,
        *,
        children: bool = True,
        deltas: bool = True,
        poll_interval: float = DEFAULT_POLL_INTERVAL,
    ) -> AsyncIterator[StreamEvent]:
        """The run as it happens: its events, its child runs' events (with their run paths) and
        the model's text while it is written (``kind == "delta"``), ending when the run ends.

        ``from_offset`` is an event ``seq`` of this run, or, to resume exactly where a previous
        stream stopped (child runs and the text of a model call in flight included), the
        ``cursor`` of the last item handled. Reading adds nothing to the run's history; see
        :mod:`relaykit.streaming` for the ordering guarantees::

            async for item in handle.stream():
                print(item.kind, item.data)
        """
        return stream_run(
            self.client,
            self.id,
            from_offset,
            children=children,
            deltas=deltas,
            poll_interval=poll_interval,
        )

    async def waiting_calls(self) -> list[PendingApproval]:
        """The calls waiting for a person, read from the server without a worker when the run
        keeps ``RelayWaitingCalls`` (then only ``call_id`` and ``workflow_id`` are filled in),
        else by the ``pending_approvals`` query. The attribute follows each workflow task as it
        completes, so a call answered a moment ago may still be listed (its late answer is then
        recorded as refused, :mod:`relaykit.bulk_approvals`)."""
        from relaykit.search_attributes import RELAY_WAITING_CALLS, listed_calls

        description = await self.workflow.describe()
        if description.status != WorkflowExecutionStatus.RUNNING:
            return []  # a closed run waits for nothing (and its worker may be gone)
        listed = listed_calls(description.typed_search_attributes.get(RELAY_WAITING_CALLS))
        if listed is None:  # not kept by this run, nothing waits, or too many: the run says
            return await self.pending_approvals()
        return [waiting_call(self.id, call_id) for call_id in listed]

    async def pending_approvals(self) -> list[PendingApproval]:
        pending: list[PendingApproval] = await self.workflow.query(
            "pending_approvals", result_type=list[PendingApproval]
        )
        return pending

    async def approve(
        self,
        call_id: str,
        approved: bool = True,
        reason: str | None = None,
        *,
        wait: bool = True,
        by: str | None = None,
    ) -> PendingApproval:
        """Answer an approval; raises if the call id is unknown or already answered.

        ``wait=True`` (the default) answers by the ``approve`` update: it returns once the run
        has taken the answer (a workflow task on its worker). ``wait=False`` checks the call
        against the run's ``pending_approvals`` query (no workflow task) and then signals the
        answer, at signal speed, for answering many at once (see :mod:`relaykit.bulk_approvals`:
        a call that stops waiting in between keeps its first answer, and the run records this
        one as an ``approval_refused`` event). Both raise :class:`~relaykit.errors.
        ApprovalNotWaiting` for a call that is not waiting (the update:
        ``WorkflowUpdateFailedError``). ``by`` (default: this machine's user) is recorded with
        the answer, in the run's history and its ``approval_answered`` event."""
        check_text(reason, "the reason")
        decision = ApprovalDecision(
            call_id=call_id, approved=approved, reason=reason, by=author(by)
        )
        if not wait:
            return await signal_answer(self, await self.waiting_calls(), decision)
        answered: PendingApproval = await self.workflow.execute_update(
            "approve", decision, result_type=PendingApproval
        )
        return answered

    async def send_message(self, text: str, *, by: str | None = None) -> int:
        """Queue ``text`` for the run's next turn boundary; returns its place in the queue.
        ``by`` (default: this machine's user) is recorded with it."""
        check_text(text, "the message")
        place: int = await self.workflow.execute_update(
            "send_message", args=[text, author(by)], result_type=int
        )
        return place

    async def steer(self, text: str, *, by: str | None = None) -> bool:
        """Like :meth:`send_message`, but a model call in flight is cancelled (its answer is
        never used) and the next one, with ``text``, starts at once; returns whether a call
        was cancelled."""
        check_text(text, "the message")
        cancelled: bool = await self.workflow.execute_update(
            "steer", args=[text, author(by)], result_type=bool
        )
        return cancelled

    async def set_budget(
        self,
        max_usd: float | None = None,
        *,
        raise_by: float | None = None,
        finish: bool = False,
        by: str | None = None,
    ) -> BudgetView:
        """Set (``max_usd``) or raise (``raise_by``) the run's dollar limit, or ``finish``: one
        last call without tools for the best answer so far. A run waiting at its limit goes on
        where it stopped. ``by`` (default: this machine's user) is recorded with the change."""
        change = BudgetChange(max_usd=max_usd, raise_by=raise_by, finish=finish, by=author(by))
        view: BudgetView = await self.workflow.execute_update(
            "set_budget", change, result_type=BudgetView
        )
        return view

    async def pause(self, *, by: str | None = None) -> None:
        """Ask the run to stop at its next turn boundary; ``by`` (default: this machine's user)
        is in the signal and the ``paused`` event."""
        await self.workflow.signal("pause", author(by))

    async def resume(self, text: str | None = None, *, by: str | None = None) -> None:
        """Continue a paused run, with ``text`` for the model if given; ``by`` as for
        :meth:`pause`."""
        check_text(text, "the message")
        await self.workflow.signal("resume", args=[text, author(by)])

    async def cancel(self, *, by: str | None = None) -> None:
        """Ask the run to end, cancelled. Temporal's cancel request carries no payload, so
        ``by`` (default: this machine's user) goes in its reason (``cancelled by NAME``), kept
        in the history's ``WorkflowExecutionCancelRequested`` event and in the run's
        ``cancelled`` event (see :mod:`relaykit.authors`)."""
        await self.workflow.cancel(reason=cancel_reason(author(by)))


def waiting_call(run_id: str, call_id: str) -> PendingApproval:
    """A waiting call known by its id only (from ``RelayWaitingCalls``)."""
    return PendingApproval(call_id=call_id, tool="", arguments="", agent="", workflow_id=run_id)


async def signal_answer(
    run: RunHandle, pending: list[PendingApproval], decision: ApprovalDecision
) -> PendingApproval:
    """Signal ``decision`` to ``run`` when ``pending`` (its waiting calls, as its query just
    listed them) has the call; else raise :class:`~relaykit.errors.ApprovalNotWaiting`."""
    waiting = {item.call_id: item for item in pending}
    item = waiting.get(decision.call_id)
    if item is None:
        raise ApprovalNotWaiting(
            f"no pending approval with call id {decision.call_id!r} in run {run.id!r} "
            f"(waiting: {', '.join(waiting) or 'none'})",
            hint=f"`relaykit pending {run.id}` lists what it waits for",
        )
    await run.workflow.signal("approve_signal", decision)
    return item


def new_run_id(agent_name: str) -> str:
    """``<agent slug>-<12 hex digits>``, the slug cut to 64 characters (a run id is at most
    1,000, and child ids add to it)."""
    return f"{slug(agent_name)[:64].rstrip('_') or 'run'}-{uuid.uuid4().hex[:12]}"


async def start_run(
    client: Client,
    agent: str | Agent,
    input: str | list[Message],
    *,
    task_queue: str = DEFAULT_TASK_QUEUE,
    id: str | None = None,
    max_turns: int = 50,
    answer_on_last_turn: bool = False,
    budget: Budget | None = None,
    extra_instructions: str | None = None,
    context: dict[str, Any] | None = None,
    continue_as_new_after_turns: int | None = None,
    output_retries: int | None = None,
    priority: int | None = None,
    tenant: str | None = None,
    tenant_weight: float | None = None,
    **start_options: Any,
) -> RunHandle:
    """Start a run of ``agent`` (by name or object) and return its handle at once.

    ``output_retries`` overrides ``Agent.output_retries`` (repairs of an invalid structured
    answer) for every agent the run reaches. ``priority`` (1 first .. 5 last, default 3) and
    ``tenant`` / ``tenant_weight`` give the run and everything it starts Temporal's priority and
    fair share of the fleet's workers (:mod:`relaykit.fleet`, docs/fleet.md)."""
    from relaykit import fleet

    fleet.check(priority, tenant, tenant_weight)
    if not task_queue_name(task_queue, "task_queue"):
        raise ConfigurationError("task_queue is empty", hint="name the task queue of a worker")
    if id:
        check_run_id(id, "the run id")
    name = agent.name if isinstance(agent, Agent) else agent
    prompt = input if isinstance(input, str) else (input[-1].content if input else "")
    run_input = RunInput(
        agent=name,
        input=input,
        max_turns=max_turns,
        answer_on_last_turn=answer_on_last_turn,
        budget=budget,
        extra_instructions=extra_instructions,
        context=context or {},
        continue_as_new_after_turns=continue_as_new_after_turns,
        output_retries=output_retries,
        priority=priority,
        tenant=tenant,
        tenant_weight=tenant_weight,
    )
    start_options = _merged(await fleet.start_options(client, run_input), start_options)
    handle = await client.start_workflow(
        AGENT_RUN_WORKFLOW,
        run_input,
        id=id or new_run_id(name),
        task_queue=task_queue,
        result_type=RunResult,
        static_summary=f"{name}: {prompt[:200]}",
        **start_options,
    )
    return RunHandle(handle, client)


def _merged(ours: dict[str, Any], given: dict[str, Any]) -> dict[str, Any]:
    """``start_workflow`` options: the caller's win, and their search attributes are added to
    the run's own (theirs win for the same key)."""
    merged = {**ours, **given}
    if "search_attributes" in ours and isinstance(
        given.get("search_attributes"), TypedSearchAttributes
    ):
        theirs = given["search_attributes"]
        merged["search_attributes"] = TypedSearchAttributes(
            [
                *(pair for pair in ours["search_attributes"] if theirs.get(pair.key) is None),
                *theirs,
            ]
        )
    return merged


def get_run(client: Client, run_id: str) -> RunHandle:
    return RunHandle(client.get_workflow_handle(run_id, result_type=RunResult), client)


async def run(client: Client, agent: str | Agent, input: str, **options: Any) -> RunResult:
    """Start a run and wait for its result."""
    handle = await start_run(client, agent, input, **options)
    return await handle.result()


POLLER_FRESH_SECONDS = 120.0
"""A poller seen this recently counts as a live worker (an idle worker re-polls about once a
minute; the server keeps listing a stopped worker's pollers for minutes)."""


async def _pollers(client: Client, task_queue: str) -> list[Any]:
    from temporalio.api.enums.v1 import TaskQueueType
    from temporalio.api.taskqueue.v1 import TaskQueue
    from temporalio.api.workflowservice.v1 import DescribeTaskQueueRequest

    response = await client.workflow_service.describe_task_queue(
        DescribeTaskQueueRequest(
            namespace=client.namespace,
            task_queue=TaskQueue(name=task_queue),
            task_queue_type=TaskQueueType.TASK_QUEUE_TYPE_WORKFLOW,
        )
    )
    return list(response.pollers)


async def task_queue_has_worker(client: Client, task_queue: str = DEFAULT_TASK_QUEUE) -> bool:
    """Whether a worker has recently polled ``task_queue`` for workflow tasks.

    A run on a queue nobody polls waits silently (Temporal keeps its task until a worker comes),
    so callers use this to tell a person why nothing happens. It reads Temporal's
    DescribeTaskQueue, which lists a queue's pollers."""
    now = time.time()
    return any(
        not poller.HasField("last_access_time")
        or now - poller.last_access_time.ToSeconds() < POLLER_FRESH_SECONDS
        for poller in await _pollers(client, task_queue)
    )


async def task_queue_last_poll(client: Client, task_queue: str) -> float | None:
    """Seconds since a worker last polled ``task_queue`` for workflow tasks (``None``: none
    listed). Temporal keeps listing a stopped worker's pollers for minutes, and an idle live
    worker polls about once a minute, so this alone cannot tell them apart: callers use it to
    word what they found otherwise (a task nobody takes)."""
    now = time.time()
    seen = [
        now - poller.last_access_time.ToSeconds()
        for poller in await _pollers(client, task_queue)
        if poller.HasField("last_access_time")
    ]
    return max(0.0, min(seen)) if seen else None
