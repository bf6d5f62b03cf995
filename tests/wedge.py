"""The wedge detector: no test may leave a workflow task failing unless it says so.

relaykit's promise is that no input wedges a run, and a wedge is easy to miss in a test: the
run shows RUNNING, the client call under test times out or is never made, and the test may pass
on what it did check. So after every test that uses the session's dev server, each workflow
execution the test started (tests run one at a time against one server, so: every execution
whose ``StartTime`` is after the test began, children and continued runs included, in every
namespace of the server) is read back from its history, and each ``WorkflowTaskFailed`` event
that is not benign fails the test. Temporal's reported-problems search attribute
(``TemporalReportedProblems``, set by servers that have it once a task has failed a few times in
a row) is read from the same listing, so a wedge is reported even where history reading misses
it.

A test that wedges a run on purpose (a breaking deploy, a worker that serves other agents)
declares it with ``@pytest.mark.wedge_expected("why", cause="NON_DETERMINISTIC_ERROR",
match="regex")``: only failures of that cause (one of them, if a list) whose message matches
the regex are excused, so another failure in the same test is still reported, and a declared
wedge that never happens fails the test too (``strict=False`` where it depends on timing).

Benign causes (:data:`BENIGN`) are Temporal's normal protocol, not a stuck run:

- ``UNHANDLED_COMMAND`` / ``UNHANDLED_UPDATE``: a signal or update arrived while the worker was
  completing a task; the server rejects that completion so the worker sees the new event, and the
  next task carries on. It is how Temporal keeps a workflow from closing over an unseen signal.
- ``RESET_STICKY_TASK_QUEUE``: the worker dropped the run from its cache (eviction, shutdown)
  and asks for the full history on the next task; the run replays and carries on.
- ``RESET_WORKFLOW``: an operator reset, recorded on the run that was reset.

Every other cause is a wedge: non-determinism (a deploy that changed what a run decided), an
exception out of workflow code (``WORKFLOW_WORKER_UNHANDLED_FAILURE``), a command the server
refuses (``BAD_*``, duplicate ids, limits, payload sizes).

The cost per test is one visibility listing per namespace and one history read per execution
found. Visibility is eventually consistent, so executions still open when their test ended are
read again when the session ends (they may wedge after the test stopped looking), together with
any execution the listings never showed; what they find is reported against the test that
started them. Tests on a dev server of their own watch it the same way (:func:`watching`, as
``test_codec`` does), or check all its runs before it stops (:func:`wedges_on`: the server
restart in ``test_crash_recovery``, the demo in ``test_demo``); ``relaykit dev`` in
``test_demo`` starts no run.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Iterable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import pytest
from temporalio.api.enums.v1 import EventType, WorkflowTaskFailedCause
from temporalio.api.workflowservice.v1 import ListNamespacesRequest
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

MARKER = "wedge_expected"
REPORTED_PROBLEMS = "TemporalReportedProblems"
_CAUSE_PREFIX = "WORKFLOW_TASK_FAILED_CAUSE_"
BENIGN = frozenset(
    {"UNHANDLED_COMMAND", "UNHANDLED_UPDATE", "RESET_STICKY_TASK_QUEUE", "RESET_WORKFLOW"}
)
_SYSTEM_NAMESPACES = frozenset({"temporal-system"})
_CONCURRENCY = 16


@dataclass(frozen=True)
class Wedge:
    """One workflow task failure that is not Temporal's normal protocol."""

    namespace: str
    workflow_id: str
    run_id: str
    workflow_type: str
    cause: str
    message: str
    event_id: int = 0

    def __str__(self) -> str:
        where = f"{self.workflow_type} {self.workflow_id} (run {self.run_id}"
        where += f", event {self.event_id})" if self.event_id else ")"
        namespace = "" if self.namespace == "default" else f" in namespace {self.namespace}"
        return f"{self.cause}: {where}{namespace}: {self.message}"


@dataclass
class Execution:
    """An execution the detector saw."""

    namespace: str
    workflow_id: str
    run_id: str
    workflow_type: str
    started: datetime
    reported_problems: list[str] = field(default_factory=list)


def cause_name(cause: int) -> str:
    """``NON_DETERMINISTIC_ERROR`` for the enum's long name."""
    return WorkflowTaskFailedCause.Name(cause).removeprefix(_CAUSE_PREFIX)  # type: ignore[arg-type]


async def namespaces(client: Client) -> list[str]:
    """The server's user namespaces (a test may register its own)."""
    found: list[str] = []
    token = b""
    while True:
        page = await client.workflow_service.list_namespaces(
            ListNamespacesRequest(page_size=100, next_page_token=token)
        )
        found += [n.namespace_info.name for n in page.namespaces]
        token = page.next_page_token
        if not token:
            return [n for n in found if n not in _SYSTEM_NAMESPACES]


def _in(client: Client, namespace: str) -> Client:
    if namespace == client.namespace:
        return client
    return Client(client.service_client, namespace=namespace, data_converter=client.data_converter)


async def started_since(client: Client, since: datetime | None) -> list[Execution]:
    """Every execution started at or after ``since`` (every one, if None), in every namespace."""
    query = f'StartTime >= "{since.isoformat()}"' if since else ""
    found: list[Execution] = []
    for namespace in await namespaces(client):
        async for info in _in(client, namespace).list_workflows(query, page_size=1000):
            problems = [
                str(value)
                for pair in info.typed_search_attributes
                if pair.key.name == REPORTED_PROBLEMS
                for value in (pair.value if isinstance(pair.value, list) else [pair.value])
            ]
            found.append(
                Execution(
                    namespace=namespace,
                    workflow_id=info.id,
                    run_id=info.run_id,
                    workflow_type=info.workflow_type,
                    started=info.start_time,
                    reported_problems=problems,
                )
            )
    return found


async def wedges_of(client: Client, execution: Execution) -> tuple[list[Wedge], bool]:
    """The execution's non-benign workflow task failures, and whether it is still open (read
    from its history, which is consistent where visibility may lag)."""
    handle = _in(client, execution.namespace).get_workflow_handle(
        execution.workflow_id, run_id=execution.run_id
    )
    wedges: list[Wedge] = []
    still_open = True
    async for event in handle.fetch_history_events():
        if event.event_type == EventType.EVENT_TYPE_WORKFLOW_TASK_FAILED:
            attributes = event.workflow_task_failed_event_attributes
            cause = cause_name(attributes.cause)
            if cause not in BENIGN:
                wedges.append(_wedge(execution, cause, attributes.failure.message, event.event_id))
        elif event.event_type in _CLOSE_EVENTS:
            still_open = False
    if not wedges and execution.reported_problems:
        wedges.append(_wedge(execution, "REPORTED_PROBLEM", ", ".join(execution.reported_problems)))
    return wedges, still_open


_CLOSE_EVENTS = frozenset(
    {
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_COMPLETED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_FAILED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TIMED_OUT,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CANCELED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_TERMINATED,
        EventType.EVENT_TYPE_WORKFLOW_EXECUTION_CONTINUED_AS_NEW,
    }
)


def _wedge(execution: Execution, cause: str, message: str, event_id: int = 0) -> Wedge:
    return Wedge(
        namespace=execution.namespace,
        workflow_id=execution.workflow_id,
        run_id=execution.run_id,
        workflow_type=execution.workflow_type,
        cause=cause,
        message=(message.strip().splitlines() or [""])[0][:500],
        event_id=event_id,
    )


async def find_wedges(
    client: Client, executions: Iterable[Execution]
) -> tuple[list[Wedge], list[Execution]]:
    """The wedges of these executions, and those of them still open, a few read at a time."""
    gate = asyncio.Semaphore(_CONCURRENCY)

    async def one(execution: Execution) -> tuple[list[Wedge], bool]:
        async with gate:
            try:
                return await wedges_of(client, execution)
            except RPCError as e:  # an execution deleted meanwhile has nothing to report
                if e.status == RPCStatusCode.NOT_FOUND:
                    return [], False
                raise

    executions = list(executions)
    results = await asyncio.gather(*(one(e) for e in executions))
    wedges = [w for found, _ in results for w in found]
    open_ = [e for e, (_, still_open) in zip(executions, results, strict=True) if still_open]
    return wedges, open_


async def wedges_on(address: str) -> list[Wedge]:
    """Every wedge on a dev server a test started for itself (the detector watches only the
    session's server)."""
    client = await Client.connect(address)
    wedges, _ = await find_wedges(client, await started_since(client, None))
    return wedges


# --- what a test declares ---------------------------------------------------------------------


@dataclass(frozen=True)
class Expected:
    """One ``wedge_expected`` marker: which failures it excuses."""

    reason: str
    causes: frozenset[str]
    match: str | None
    strict: bool

    def excuses(self, wedge: Wedge) -> bool:
        if self.causes and wedge.cause not in self.causes:
            return False
        return self.match is None or re.search(self.match, wedge.message) is not None


def expected(item: pytest.Item) -> list[Expected]:
    """The test's declared wedges (a marker must say why)."""
    declared = []
    for mark in item.iter_markers(MARKER):
        if not mark.args or not str(mark.args[0]).strip():
            raise pytest.UsageError(f"{item.nodeid}: @pytest.mark.{MARKER} needs a reason")
        cause: str | Sequence[str] = mark.kwargs.get("cause", ())
        causes = frozenset([cause] if isinstance(cause, str) else cause)
        declared.append(
            Expected(
                str(mark.args[0]), causes, mark.kwargs.get("match"), mark.kwargs.get("strict", True)
            )
        )
    return declared


def verdict(declared: Sequence[Expected], wedges: Sequence[Wedge], *, final: bool) -> list[str]:
    """What is wrong: each wedge no declaration excuses, and (when ``final``) each strict
    declaration that excused nothing."""
    problems = [
        f"workflow task failed: {w}" for w in wedges if not any(d.excuses(w) for d in declared)
    ]
    if final:
        problems += [
            f"declared wedge did not happen: {d.reason} (cause {sorted(d.causes) or 'any'},"
            f" match {d.match!r})"
            for d in declared
            if d.strict and not any(d.excuses(w) for w in wedges)
        ]
    return problems


# --- the fixture and the session's last look --------------------------------------------------


@dataclass
class _Watch:
    """What the session still has to look at again: open executions and their tests."""

    clients: dict[str, Client] = field(default_factory=dict)
    open: dict[tuple[str, str], tuple[Execution, str, list[Expected]]] = field(default_factory=dict)
    seen: set[tuple[str, str]] = field(default_factory=set)
    judged: set[Wedge] = field(default_factory=set)
    windows: list[tuple[datetime, str, list[Expected]]] = field(default_factory=list)


_watch = _Watch()


async def _client(address: str, namespace: str) -> Client:
    if address not in _watch.clients:
        _watch.clients[address] = await Client.connect(address, namespace=namespace)
    return _watch.clients[address]


@asynccontextmanager
async def watching(
    item: pytest.Item, address: str, namespace: str = "default", *, session: bool = False
) -> AsyncIterator[None]:
    """Fails ``item`` if a workflow started on the server at ``address`` while the block ran
    has a workflow task failure the item did not declare (``session``: the server outlives the
    test, so what is still open is read again when the session ends)."""
    client = await _client(address, namespace)
    declared = expected(item)
    since = datetime.now(UTC)
    if session:
        _watch.windows.append((since, item.nodeid, declared))
    yield
    executions = await started_since(client, since)
    wedges, still_open = await find_wedges(client, executions)
    if session:
        _watch.judged.update(wedges)
        _watch.seen.update((e.namespace, e.run_id) for e in executions)
        for execution in still_open:
            key = (execution.namespace, execution.run_id)
            _watch.open[key] = (execution, item.nodeid, declared)
    problems = verdict(declared, wedges, final=True)
    if problems:
        pytest.fail("\n".join(problems), pytrace=False)


@pytest.fixture(autouse=True)
async def wedge_detector(request: pytest.FixtureRequest) -> AsyncIterator[None]:
    """Fails the test (at teardown, after its workers stopped) if a workflow it started on the
    session's dev server has a workflow task failure it did not declare."""
    if "temporal_server" not in request.fixturenames:
        yield
        return
    server = request.getfixturevalue("temporal_server")
    async with watching(request.node, server.address, server.namespace, session=True):
        yield


async def last_look(client: Client) -> list[str]:
    """The session's end: executions open when their test ended, and any the listings missed,
    read again; what they show is attributed to the test that was running when they started."""
    targets: dict[tuple[str, str], tuple[Execution, str, list[Expected]]] = dict(_watch.open)
    for execution in await started_since(client, None):
        key = (execution.namespace, execution.run_id)
        if key in _watch.seen or key in targets:
            continue
        owner = _owner(execution)
        if owner is not None:
            targets[key] = (execution, *owner)
    wedges, _ = await find_wedges(client, [t[0] for t in targets.values()])
    problems = []
    for wedge in wedges:
        if wedge in _watch.judged:
            continue
        _, nodeid, declared = targets[(wedge.namespace, wedge.run_id)]
        problems += [f"{nodeid}: {p}" for p in verdict(declared, [wedge], final=False)]
    return problems


def _owner(execution: Execution) -> tuple[str, list[Expected]] | None:
    """The test running when an unseen execution started (None: before any test watched)."""
    owner = None
    for since, nodeid, declared in _watch.windows:
        if since <= execution.started:
            owner = (nodeid, declared)
    return owner
