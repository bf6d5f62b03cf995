"""Approvals: a support agent whose refunds wait for a person, and a stateless HTTP backend.

Serve the agent with ``relaykit worker examples.approvals`` (or ``relaykit dev
examples.approvals``), then run the backend::

    python -m examples.approvals --port 8000

and talk to it::

    curl -s localhost:8000/conversations/c42/messages -d '{"text": "Refund order A-1001"}'
    # -> {"status": "waiting_approval", "pending_approvals": [{"call_id": "call_…", …}], …}
    curl -s localhost:8000/conversations/c42/approvals/call_… -d '{"approved": true}'
    # -> {"status": "completed", "answer": "…", …}
    curl -s localhost:8000/conversations/c42

The backend keeps nothing in memory between requests: a conversation's run is the Temporal
workflow ``chat-<conversation id>``, found again by that id on every request. A message goes in
with update-with-start: one call that starts the run if none is running (continuing the
transcript of the last finished run of the conversation) or else queues the message in the
running one, where the turn loop picks it up at its next turn boundary. Any number of backend
replicas can serve the same conversation, and a restart of the backend loses nothing.

Only the agent objects live at the top of this module, so ``relaykit worker examples.approvals``
serves exactly them. With no model configured (no ``RELAYKIT_MODEL``, no provider key),
``relaykit dev examples.approvals`` plays the model with :func:`scripted_refunds`, so the
approval round trip works offline and the same way every time::

    relaykit dev examples.approvals
    relaykit run refund_agent "Refund order A-1001, the jacket leaks"
    relaykit pending RUN_ID
    relaykit approve RUN_ID CALL_ID            # or --reject --reason "…"
    relaykit result RUN_ID
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import threading
import time
from collections.abc import Coroutine
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from temporalio.client import (
    Client,
    WithStartWorkflowOperation,
    WorkflowExecutionStatus,
    WorkflowUpdateFailedError,
)
from temporalio.common import WorkflowIDConflictPolicy
from temporalio.service import RPCError, RPCStatusCode

from relaykit import Agent, RunFailed, RunHandle, connect, tool
from relaykit.client import DEFAULT_TASK_QUEUE
from relaykit.messages import Message
from relaykit.runs import RunInput, RunResult
from relaykit.testing.scripted_server import ScriptedRequest, Step, call, text
from relaykit.workflows.loop import AGENT_RUN_WORKFLOW

_ORDERS = {
    "A-1001": {"item": "rain jacket", "paid_eur": 89.0, "status": "delivered"},
    "A-1002": {"item": "hiking boots", "paid_eur": 149.0, "status": "in transit"},
}


@tool(effect="read")
def look_up_order(order_id: str) -> dict[str, Any]:
    """Look up an order by its id.

    Args:
        order_id: The order id, e.g. "A-1001".
    """
    order = _ORDERS.get(order_id.strip().upper())
    return {"order_id": order_id, **order} if order else {"order_id": order_id, "error": "unknown"}


@tool(needs_approval=True, approval_timeout=24 * 3600, effect="write")
def issue_refund(order_id: str, amount_eur: float, reason: str) -> str:
    """Refund money to the customer. A person approves every refund before it happens.

    Args:
        order_id: The order to refund.
        amount_eur: How much to refund, in euros.
        reason: Why, in a few words (the approver reads it).
    """
    return f"refunded {amount_eur:.2f} EUR for {order_id}"


refund_agent = Agent(
    name="refund_agent",
    description="Handles refund requests.",
    instructions=(
        "You handle refund requests. Look the order up first, then issue the refund with a short "
        "reason. If a refund is rejected, tell the customer why in one sentence."
    ),
    tools=[look_up_order, issue_refund],
)


_ORDER_ID = re.compile(r"\b([A-Z]-\d{3,})\b", re.IGNORECASE)


def scripted_refunds(request: ScriptedRequest) -> Step:
    """A scripted stand-in for the refund agent's model, so approvals can be tried without a
    key (``relaykit dev examples.approvals`` uses it when no model is configured): it looks the
    order up, asks to refund what was paid, and reports what the person decided. It reads only
    the conversation since the customer's latest message, so follow-ups start afresh."""
    messages = request.messages
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=-1)
    said = request.last_user_text
    results = [
        str(m.get("content") or "") for m in messages[last_user + 1 :] if m.get("role") == "tool"
    ]
    found = _ORDER_ID.search(said)
    if found is None:
        return text("Which order should I refund? Please give its id, e.g. A-1001.")
    order_id = found.group(1).upper()
    if not results:
        return call("look_up_order", order_id=order_id)
    if len(results) == 1:
        try:
            order = json.loads(results[0])
        except ValueError:
            order = {}
        if not isinstance(order, dict) or "paid_eur" not in order:
            return text(f"I could not find order {order_id}.")
        reason = " ".join(said.split())[:80]
        return call("issue_refund", order_id=order_id, amount_eur=order["paid_eur"], reason=reason)
    outcome = results[-1]
    if outcome.startswith("refunded"):
        return text(f"Done: {outcome}. It reaches your account in 3-5 business days.")
    return text(f"I could not refund order {order_id}: {outcome}")


# --- the stateless backend ----------------------------------------------------------------------

_NEEDS_A_PERSON = ("waiting_approval", "paused")


class ConversationError(Exception):
    """A request the backend cannot serve; ``status`` is the HTTP status to answer with."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def conversation_workflow_id(conversation_id: str) -> str:
    """The run of a conversation is found by this id alone (no handle is kept anywhere)."""
    if not re.fullmatch(r"[A-Za-z0-9_.-]{1,100}", conversation_id):
        raise ConversationError(400, "a conversation id is 1-100 characters of A-Z a-z 0-9 _ . -")
    return f"chat-{conversation_id}"


class ChatBackend:
    """The three operations of the HTTP endpoint, as plain async methods (each one a few
    Temporal calls; nothing is remembered between calls).

    Every method returns once the run has *settled*: it answered, it waits for a person, it is
    paused, it ended, or ``settle_seconds`` passed (then the status says ``running``; ask again
    with :meth:`conversation`).
    """

    def __init__(
        self,
        client: Client,
        *,
        agent: str = refund_agent.name,
        task_queue: str = DEFAULT_TASK_QUEUE,
        settle_seconds: float = 30.0,
    ) -> None:
        self.client = client
        self.agent = agent
        self.task_queue = task_queue
        self.settle_seconds = settle_seconds

    async def send_message(self, conversation_id: str, text: str) -> dict[str, Any]:
        """Start the conversation's run, or continue it, with the user's message."""
        if not isinstance(text, str) or not text.strip():
            raise ConversationError(400, 'send {"text": "..."} with non-empty text')
        workflow_id = conversation_workflow_id(conversation_id)
        start = WithStartWorkflowOperation(
            AGENT_RUN_WORKFLOW,
            # The message itself goes in through the update, so a new run starts from the
            # transcript so far and picks the message up at its first turn boundary.
            RunInput(agent=self.agent, input=await self._transcript_so_far(workflow_id)),
            id=workflow_id,
            task_queue=self.task_queue,
            id_conflict_policy=WorkflowIDConflictPolicy.USE_EXISTING,
            result_type=RunResult,
            static_summary=f"{self.agent}: conversation {conversation_id}",
        )
        try:
            await self.client.execute_update_with_start_workflow(
                "send_message", text, start_workflow_operation=start, result_type=int
            )
        except WorkflowUpdateFailedError as exc:
            raise ConversationError(409, _failure_message(exc)) from None
        handle = RunHandle(await start.workflow_handle())
        return await self._settle(conversation_id, handle)

    async def answer_approval(
        self, conversation_id: str, call_id: str, approved: bool, reason: str | None = None
    ) -> dict[str, Any]:
        """Approve or reject a pending tool call of the conversation's run."""
        handle = await self._running(conversation_id)
        try:
            await handle.approve(call_id, approved=approved, reason=reason)
        except WorkflowUpdateFailedError as exc:
            raise ConversationError(409, _failure_message(exc)) from None
        return await self._settle(conversation_id, handle)

    async def conversation(self, conversation_id: str) -> dict[str, Any]:
        """Where the conversation stands, without waiting."""
        workflow_id = conversation_workflow_id(conversation_id)
        handle = RunHandle(self.client.get_workflow_handle(workflow_id, result_type=RunResult))
        try:
            description = await handle.workflow.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise ConversationError(404, f"no conversation {conversation_id!r}") from None
            raise
        if description.status == WorkflowExecutionStatus.RUNNING:
            return self._view(conversation_id, handle, await handle.state())
        return await self._settle(conversation_id, handle, wait=False)

    # --- helpers --------------------------------------------------------------------------------

    async def _transcript_so_far(self, workflow_id: str) -> list[Message]:
        """The transcript of the conversation's last run if it completed, else nothing (a
        running run keeps its own transcript; the start input is then ignored).

        A run that completes between this read and the update-with-start is not continued: the
        message then starts a run without the earlier transcript. Closing that window needs the
        conversation to outlive its runs (one long-lived workflow per conversation)."""
        handle = self.client.get_workflow_handle(workflow_id, result_type=RunResult)
        try:
            description = await handle.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                return []
            raise
        if description.status != WorkflowExecutionStatus.COMPLETED:
            return []
        result: RunResult = await handle.result()
        return result.transcript

    async def _running(self, conversation_id: str) -> RunHandle:
        workflow_id = conversation_workflow_id(conversation_id)
        handle = RunHandle(self.client.get_workflow_handle(workflow_id, result_type=RunResult))
        try:
            description = await handle.workflow.describe()
        except RPCError as exc:
            if exc.status == RPCStatusCode.NOT_FOUND:
                raise ConversationError(404, f"no conversation {conversation_id!r}") from None
            raise
        if description.status != WorkflowExecutionStatus.RUNNING:
            raise ConversationError(409, f"conversation {conversation_id!r} has no running run")
        return handle

    async def _settle(
        self, conversation_id: str, handle: RunHandle, *, wait: bool = True
    ) -> dict[str, Any]:
        """Wait until the run answered or needs a person (or ``settle_seconds`` passed)."""
        result = asyncio.ensure_future(handle.result())
        deadline = time.monotonic() + (self.settle_seconds if wait else 0)
        try:
            while True:
                done, _ = await asyncio.wait({result}, timeout=0.1 if wait else 2.0)
                if done:
                    try:
                        outcome = result.result()
                    except RunFailed as exc:
                        return {
                            "conversation_id": conversation_id,
                            "run_id": handle.id,
                            "status": "cancelled" if exc.type == "RunCancelled" else "failed",
                            "error": exc.message,
                            "error_type": exc.type,
                        }
                    return {
                        "conversation_id": conversation_id,
                        "run_id": handle.id,
                        "status": "completed",
                        "answer": outcome.output,
                        "agent": outcome.final_agent,
                        "turns": outcome.turns,
                    }
                snapshot = await handle.state()
                # "completed"/"failed" show a moment before the result: keep waiting for it.
                if snapshot.status in _NEEDS_A_PERSON or time.monotonic() >= deadline:
                    return self._view(conversation_id, handle, snapshot)
        finally:
            result.cancel()

    @staticmethod
    def _view(conversation_id: str, handle: RunHandle, snapshot: Any) -> dict[str, Any]:
        return {
            "conversation_id": conversation_id,
            "run_id": handle.id,
            "status": snapshot.status,
            "agent": snapshot.agent,
            "turns": snapshot.turn,
            "pending_approvals": [
                item.model_dump(mode="json", include={"call_id", "tool", "arguments", "agent"})
                for item in snapshot.pending_approvals
            ],
        }


def _failure_message(exc: WorkflowUpdateFailedError) -> str:
    return str(getattr(exc.cause, "message", None) or exc.cause or exc)


# --- HTTP ---------------------------------------------------------------------------------------

_MESSAGES = re.compile(r"^/conversations/([^/]+)/messages$")
_APPROVALS = re.compile(r"^/conversations/([^/]+)/approvals/([^/]+)$")
_CONVERSATION = re.compile(r"^/conversations/([^/]+)$")


async def handle_request(
    backend: ChatBackend, method: str, path: str, body: dict[str, Any]
) -> tuple[int, dict[str, Any]]:
    """Route one request: ``(HTTP status, JSON body)``. The HTTP server below only parses and
    writes; tests call this directly too."""
    path = path.split("?", 1)[0].rstrip("/")
    try:
        if method == "POST" and (match := _MESSAGES.match(path)):
            return 200, await backend.send_message(match.group(1), body.get("text", ""))
        if method == "POST" and (match := _APPROVALS.match(path)):
            approved = body.get("approved")
            if not isinstance(approved, bool):
                raise ConversationError(400, 'send {"approved": true|false, "reason": "..."}')
            return 200, await backend.answer_approval(
                match.group(1), match.group(2), approved, body.get("reason")
            )
        if method == "GET" and (match := _CONVERSATION.match(path)):
            return 200, await backend.conversation(match.group(1))
        return 404, {"error": f"no route {method} {path}"}
    except ConversationError as exc:
        return exc.status, {"error": exc.message}


def make_http_server(
    backend: ChatBackend, loop: asyncio.AbstractEventLoop, host: str = "127.0.0.1", port: int = 0
) -> ThreadingHTTPServer:
    """A stdlib HTTP server whose handler threads run the backend on ``loop`` (the loop that
    owns the Temporal client). Call ``serve_forever`` in a thread; ``port=0`` picks a free one."""

    def run(coro: Coroutine[Any, Any, tuple[int, dict[str, Any]]]) -> tuple[int, dict[str, Any]]:
        return asyncio.run_coroutine_threadsafe(coro, loop).result()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer(*run(handle_request(backend, "GET", self.path, {})))

        def do_POST(self) -> None:
            raw = self.rfile.read(int(self.headers.get("content-length") or 0))
            try:
                body = json.loads(raw or b"{}")
                if not isinstance(body, dict):
                    raise ValueError
            except ValueError:
                self._answer(400, {"error": "the body must be a JSON object"})
                return
            self._answer(*run(handle_request(backend, "POST", self.path, body)))

        def _answer(self, status: int, payload: dict[str, Any]) -> None:
            data = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return ThreadingHTTPServer((host, port), Handler)


async def serve(host: str, port: int, task_queue: str) -> None:
    client = await connect()
    server = make_http_server(
        ChatBackend(client, task_queue=task_queue), asyncio.get_running_loop(), host, port
    )
    thread = threading.Thread(target=server.serve_forever, name="approvals-http", daemon=True)
    thread.start()
    print(f"approvals backend on http://{host}:{server.server_address[1]}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        server.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(description="Stateless HTTP backend for examples.approvals")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--task-queue", default=DEFAULT_TASK_QUEUE)
    args = parser.parse_args()
    try:
        asyncio.run(serve(args.host, args.port, args.task_queue))
    except KeyboardInterrupt:
        pass


if __name__ == "__main__":
    main()
