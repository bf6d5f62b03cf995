"""The inbox's HTTP application: the page, the JSON API, sign-in.

Routes:

- ``GET /``: the page (:mod:`relaykit.inbox.page`); ``POST /decide``: its forms;
- ``GET /api/pending``: the waiting calls as JSON; ``GET /api/budgets``: the root runs waiting
  at their dollar limit, with what they spent of it; ``POST /api/decide``
  ``{run_id, call_id, approve, reason?}``: 200 with what was decided, 400 for a malformed body,
  404 for an unknown run or call, 409 for a call answered already or a closed run, 503 when no
  worker serves the run;
- ``GET /api/budgets``: root runs waiting at their dollar limit (``budget_reached``) as JSON,
  each with what it spent and its limit (``relaykit budget RUN --raise …`` goes on with it);
- ``POST /decide-selected`` (the page's "approve selected") and ``POST /api/decide-selected``
  ``{calls: [{run_id, call_id}], approve, reason?, by?}``: many calls at once on the bulk path
  (:func:`relaykit.inbox.pending.decide_selected`), 200 with one outcome per call;
- ``GET /signin?token=…`` (the link ``relaykit inbox`` prints) and ``POST /signin`` (the form).

While Temporal is unreachable, every route that asks it answers 503 (with ``Retry-After``): the
page says so and reloads by itself, the API answers ``{"error", "retry_after"}``; the log gets
one line per request, not a traceback.

Security, with ``authorization`` set (``RELAYKIT_INBOX_AUTH="Bearer …"``):

- every route answers 401 unless the request carries exactly that ``Authorization`` header or
  the session cookie; the page's 401 is the sign-in form;
- signing in sets the cookie ``relaykit_inbox`` (HttpOnly, SameSite=Strict, Secure over https),
  whose value is an HMAC of the token, never the token itself;
- a form post must carry the page's CSRF token, and a cookie-authenticated API post the
  ``X-CSRF-Token`` header; API posts must be ``application/json``, which a cross-site page
  cannot send without a CORS preflight this app never grants.

Without ``authorization`` the inbox only listens on loopback (the CLI refuses other addresses),
answers only requests whose ``Host`` is a loopback name (so a DNS-rebinding page cannot read it),
and keeps the CSRF checks, with a secret made at start. Every response forbids framing (no
clickjacking of the Approve button), caching and referrers (a sign-in link's token never leaks).
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import secrets
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import quote, urlencode

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from relaykit.authors import InvalidAuthor, author
from relaykit.bulk_approvals import ANSWERED, BulkAnswer
from relaykit.inbox.page import (
    UNREACHABLE_RETRY_SECONDS,
    render_inbox,
    render_sign_in,
    render_unreachable,
)
from relaykit.inbox.pending import (
    MAX_SELECTED,
    DecideError,
    InboxListing,
    RecentlyDecided,
    decide,
    decide_selected,
    list_pending,
)

COOKIE = "relaykit_inbox"
CSRF_HEADER = "x-csrf-token"
LISTING_CACHE_SECONDS = 2.0
"""How long one listing serves all viewers (each listing queries every waiting run)."""

LOOPBACK_NAMES = frozenset({"localhost", "127.0.0.1", "::1"})

_STATUS = {"not_found": 404, "conflict": 409, "unavailable": 503}

logger = logging.getLogger(__name__)


def temporal_problem(client: Client, exc: RPCError) -> str:
    """One line on why Temporal did not answer (the client's own retries are already spent)."""
    if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
        target = client.service_client.config.target_host
        return f"Temporal is unreachable at {target}: {exc.message}"
    return f"Temporal: {exc.message}"


def is_loopback(host: str) -> bool:
    import ipaddress

    name = host.strip("[]")
    if name in LOOPBACK_NAMES:
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _host_name(header: str) -> str:
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.split(":", 1)[0]


class InboxAuth:
    """Who may use the inbox: the ``Authorization`` value, the session cookie derived from it,
    and the CSRF token of the page's forms."""

    def __init__(self, authorization: str | None) -> None:
        self.authorization = authorization or None
        secret = self.authorization.encode() if self.authorization else secrets.token_bytes(32)
        self.session = hmac.new(secret, b"relaykit-inbox-session", hashlib.sha256).hexdigest()
        self.csrf = hmac.new(secret, b"relaykit-inbox-csrf", hashlib.sha256).hexdigest()

    @property
    def token(self) -> str | None:
        """The token without its scheme (``Bearer``): what a person types or a link carries."""
        if self.authorization is None:
            return None
        scheme, _, token = self.authorization.partition(" ")
        return token if token else scheme

    def token_ok(self, given: str) -> bool:
        if self.authorization is None or not given:
            return False
        given = given.strip()
        candidates = [self.authorization, self.token or ""]
        return any(hmac.compare_digest(given.encode(), c.encode()) for c in candidates if c)

    def by_header(self, headers: Any) -> bool:
        if self.authorization is None:
            return True
        given = headers.get("authorization", "")
        return hmac.compare_digest(given.encode(), self.authorization.encode())

    def by_cookie(self, cookies: Any) -> bool:
        if self.authorization is None:
            return True
        return hmac.compare_digest(cookies.get(COOKIE, "").encode(), self.session.encode())

    def csrf_ok(self, given: str | None) -> bool:
        return hmac.compare_digest((given or "").encode(), self.csrf.encode())

    def sign_in_link(self, base_url: str) -> str | None:
        token = self.token
        if token is None:
            return None
        return f"{base_url.rstrip('/')}/signin?{urlencode({'token': token})}"


class DecideBody(BaseModel):
    """``POST /api/decide``'s body."""

    model_config = ConfigDict(strict=True)

    run_id: str
    call_id: str
    approve: bool
    reason: str | None = None


class PickedCall(BaseModel):
    model_config = ConfigDict(strict=True)

    run_id: str = Field(min_length=1)
    call_id: str = Field(min_length=1)


class DecideSelectedBody(BaseModel):
    """``POST /api/decide-selected``'s body: the calls, one decision for all, who decided
    (default: the inbox's user, as for the page's decisions)."""

    model_config = ConfigDict(strict=True)

    calls: list[PickedCall] = Field(min_length=1, max_length=MAX_SELECTED)
    approve: bool
    reason: str | None = None
    by: str | None = None


def body_problems(exc: ValidationError) -> str:
    """A JSON body's validation errors on one line: ``where: what`` each."""
    return "; ".join(
        f"{'.'.join(str(p) for p in error['loc']) or 'body'}: {error['msg']}"
        for error in exc.errors()
    )


def picked_value(run_id: str, call_id: str) -> str:
    """A page checkbox's value: the pair, as JSON (ids may hold any character)."""
    return json.dumps([run_id, call_id])


def _picked(values: list[Any]) -> list[tuple[str, str]] | None:
    """The pairs of the ticked checkboxes, or ``None`` when one is not a pair of ids."""
    picks = []
    for value in values:
        try:
            pair = json.loads(value) if isinstance(value, str) else None
        except ValueError:
            return None
        if not (
            isinstance(pair, list)
            and len(pair) == 2
            and all(isinstance(part, str) and part for part in pair)
        ):
            return None
        picks.append((pair[0], pair[1]))
    return picks


def selected_notice(answers: list[BulkAnswer], approve: bool) -> tuple[str, bool]:
    """One line for the page: how many were answered, and each call that was not, with why."""
    verb = "approved" if approve else "rejected"
    done = [answer for answer in answers if answer.status == ANSWERED]
    notice = f"{verb} {len(done)} of {len(answers)} selected call{'s' if len(answers) != 1 else ''}"
    missed = [
        f"{answer.call_id} in {answer.run_id} ({answer.detail or answer.status})"
        for answer in answers
        if answer.status != ANSWERED
    ]
    if missed:
        notice += "; not answered: " + "; ".join(missed)
    return notice, bool(missed)


def inbox_app(client: Client, *, authorization: str | None = None) -> Any:
    """The Starlette application of ``relaykit inbox`` over ``client``'s namespace."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
    from starlette.routing import Route

    auth = InboxAuth(authorization)
    recent = RecentlyDecided()
    cache: dict[str, Any] = {"at": 0.0, "listing": None}
    gate = asyncio.Lock()  # viewers arriving during a listing share it instead of starting theirs

    def fresh() -> bool:
        return (
            cache["listing"] is not None and time.monotonic() - cache["at"] <= LISTING_CACHE_SECONDS
        )

    async def listing() -> InboxListing:
        if not fresh():
            async with gate:
                if not fresh():
                    cache["listing"] = await list_pending(client, hidden=recent.current())
                    cache["at"] = time.monotonic()
        cached: InboxListing = cache["listing"]
        return cached

    def forget_listing() -> None:
        cache["listing"] = None

    def secured(response: Response, nonce: str = "") -> Response:
        script = f"'nonce-{nonce}'" if nonce else "'none'"
        response.headers["content-security-policy"] = (
            f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; "
            "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
        )
        response.headers["x-frame-options"] = "DENY"
        response.headers["referrer-policy"] = "no-referrer"
        response.headers["cache-control"] = "no-store"
        response.headers["x-content-type-options"] = "nosniff"
        return response

    def host_refused(request: Request) -> Response | None:
        if auth.authorization is not None or is_loopback(
            _host_name(request.headers.get("host", ""))
        ):
            return None
        return secured(JSONResponse({"error": "this inbox answers loopback hosts only"}, 421))

    def page_refused(request: Request) -> Response | None:
        refused = host_refused(request)
        if refused is not None:
            return refused
        if auth.by_header(request.headers) or auth.by_cookie(request.cookies):
            return None
        return secured(HTMLResponse(render_sign_in(), status_code=401))

    def api_refused(request: Request) -> Response | None:
        refused = host_refused(request)
        if refused is not None:
            return refused
        if auth.by_header(request.headers) or auth.by_cookie(request.cookies):
            return None
        return secured(
            JSONResponse(
                {"error": "unauthorized: send the Authorization header RELAYKIT_INBOX_AUTH holds"},
                status_code=401,
                headers={"www-authenticate": "Bearer"},
            )
        )

    async def page(request: Request) -> Response:
        refused = page_refused(request)
        if refused is not None:
            return refused
        nonce = secrets.token_urlsafe(16)
        html = render_inbox(
            await listing(),
            namespace=client.namespace,
            csrf=auth.csrf,
            nonce=nonce,
            query=request.query_params.get("q", "")[:200],
            notice=request.query_params.get("notice", "")[:500],
            notice_error=request.query_params.get("error") == "1",
        )
        return secured(HTMLResponse(html), nonce)

    def signed_in() -> Response:
        response = RedirectResponse("./", status_code=303)
        return secured(response)

    def with_cookie(request: Request, response: Response) -> Response:
        response.set_cookie(
            COOKIE,
            auth.session,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def sign_in_link(request: Request) -> Response:
        refused = host_refused(request)
        if refused is not None:
            return refused
        if auth.authorization is None:
            return signed_in()
        if auth.token_ok(request.query_params.get("token", "")):
            return with_cookie(request, signed_in())
        error = "wrong token" if request.query_params.get("token") else ""
        return secured(HTMLResponse(render_sign_in(error=error), status_code=401))

    async def sign_in_form(request: Request) -> Response:
        refused = host_refused(request)
        if refused is not None:
            return refused
        if auth.authorization is None:
            return signed_in()
        form = await request.form()
        token = form.get("token")
        if isinstance(token, str) and auth.token_ok(token):
            return with_cookie(request, signed_in())
        return secured(HTMLResponse(render_sign_in(error="wrong token"), status_code=401))

    async def decide_form(request: Request) -> Response:
        refused = page_refused(request)
        if refused is not None:
            return refused
        form = await request.form()
        fields = {
            key: form.get(key) for key in ("csrf", "run_id", "call_id", "decision", "reason", "q")
        }
        if not auth.csrf_ok(fields["csrf"] if isinstance(fields["csrf"], str) else None):
            return secured(
                HTMLResponse("the form's CSRF token is missing or wrong; reload the page", 403)
            )
        run_id, call_id, decision = fields["run_id"], fields["call_id"], fields["decision"]
        if not (
            isinstance(run_id, str)
            and isinstance(call_id, str)
            and decision in ("approve", "reject")
        ):
            return secured(
                HTMLResponse("a decision needs run_id, call_id and approve or reject", 400)
            )
        reason = (
            fields["reason"]
            if isinstance(fields["reason"], str) and fields["reason"].strip()
            else None
        )
        back: dict[str, str] = {}
        if isinstance(fields["q"], str) and fields["q"]:
            back["q"] = fields["q"]
        try:
            done = await decide(
                client, run_id, call_id, approve=decision == "approve", reason=reason
            )
        except DecideError as exc:
            back.update(notice=exc.message, error="1")
        else:
            recent.add(run_id, call_id)
            forget_listing()
            verb = "approved" if done.approved else "rejected"
            because = f": {done.reason}" if done.reason else ""
            back["notice"] = f"{verb} {done.tool} ({done.call_id}) in {done.run_id}{because}"
        return secured(RedirectResponse("./?" + urlencode(back, quote_via=quote), status_code=303))

    async def decide_selected_form(request: Request) -> Response:
        refused = page_refused(request)
        if refused is not None:
            return refused
        form = await request.form()
        csrf = form.get("csrf")
        if not auth.csrf_ok(csrf if isinstance(csrf, str) else None):
            return secured(
                HTMLResponse("the form's CSRF token is missing or wrong; reload the page", 403)
            )
        back: dict[str, str] = {}
        query = form.get("q")
        if isinstance(query, str) and query:
            back["q"] = query
        decision = form.get("decision")
        picks = _picked(form.getlist("pick"))
        if decision not in ("approve", "reject") or picks is None or len(picks) > MAX_SELECTED:
            return secured(
                HTMLResponse("a decision needs approve or reject and the selected calls", 400)
            )
        if not picks:
            back.update(notice="no call selected", error="1")
            return secured(
                RedirectResponse("./?" + urlencode(back, quote_via=quote), status_code=303)
            )
        reason = form.get("reason")
        answers = await decide_selected(
            client,
            picks,
            approve=decision == "approve",
            reason=reason if isinstance(reason, str) and reason.strip() else None,
        )
        answered(answers)
        notice, missed = selected_notice(answers, decision == "approve")
        back["notice"] = notice[:500]
        if missed:
            back["error"] = "1"
        return secured(RedirectResponse("./?" + urlencode(back, quote_via=quote), status_code=303))

    def answered(answers: list[BulkAnswer]) -> None:
        """Hide the answered calls from the next listings (the runs catch up a moment later)."""
        for answer in answers:
            if answer.status == ANSWERED:
                recent.add(answer.run_id, answer.call_id)
        forget_listing()

    async def api_pending(request: Request) -> Response:
        refused = api_refused(request)
        if refused is not None:
            return refused
        current = await listing()
        fields = {
            "run_id",
            "call_id",
            "agent",
            "run_path",
            "tool",
            "arguments",
            "reason",
            "requested_at",
            "turn",
            "owner_run_id",
            "ui_url",
        }
        return secured(JSONResponse([item.model_dump(include=fields) for item in current.items]))

    async def api_budgets(request: Request) -> Response:
        refused = api_refused(request)
        if refused is not None:
            return refused
        current = await listing()
        return secured(JSONResponse([wait.model_dump() for wait in current.budgets]))

    async def api_decide(request: Request) -> Response:
        refused = api_post_refused(request)
        if refused is not None:
            return refused
        try:
            body = DecideBody.model_validate_json(await request.body())
        except ValidationError as exc:
            problems = body_problems(exc)
            return secured(
                JSONResponse(
                    {"error": f"expected {{run_id, call_id, approve, reason?}}: {problems}"}, 400
                )
            )
        try:
            done = await decide(
                client, body.run_id, body.call_id, approve=body.approve, reason=body.reason
            )
        except DecideError as exc:
            return secured(JSONResponse({"error": exc.message}, _STATUS[exc.problem]))
        recent.add(body.run_id, body.call_id)
        forget_listing()
        return secured(JSONResponse(done.model_dump()))

    async def api_decide_selected(request: Request) -> Response:
        refused = api_post_refused(request)
        if refused is not None:
            return refused
        try:
            body = DecideSelectedBody.model_validate_json(await request.body())
        except ValidationError as exc:
            problems = body_problems(exc)
            expected = "{calls: [{run_id, call_id}], approve, reason?, by?}"
            return secured(JSONResponse({"error": f"expected {expected}: {problems}"}, 400))
        try:
            by = author(body.by)
        except InvalidAuthor as exc:
            return secured(JSONResponse({"error": str(exc)}, 400))
        answers = await decide_selected(
            client,
            [(call.run_id, call.call_id) for call in body.calls],
            approve=body.approve,
            reason=body.reason,
            by=by,
        )
        answered(answers)
        return secured(JSONResponse([answer.model_dump() for answer in answers]))

    def api_post_refused(request: Request) -> Response | None:
        """A JSON post's checks: who asks, the CSRF header with a cookie, the content type."""
        refused = api_refused(request)
        if refused is not None:
            return refused
        if (
            auth.authorization is not None
            and not auth.by_header(request.headers)
            and not auth.csrf_ok(request.headers.get(CSRF_HEADER))
        ):
            return secured(JSONResponse({"error": f"a cookie needs the {CSRF_HEADER} header"}, 403))
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return secured(JSONResponse({"error": "send the body as application/json"}, 400))
        return None

    async def temporal_failed(request: Request, exc: Exception) -> Response:
        """Temporal down or refusing: a 503 saying so (a page that retries by itself, or JSON
        for the API), and one log line instead of a traceback per request."""
        assert isinstance(exc, RPCError)
        problem = temporal_problem(client, exc)
        logger.warning("%s %s: %s; answered 503", request.method, request.url.path, problem)
        retry = {"retry-after": str(UNREACHABLE_RETRY_SECONDS)}
        if request.url.path.startswith("/api/"):
            refused = api_refused(request)
            if refused is not None:
                return refused
            body = {"error": f"{problem}; retry later", "retry_after": UNREACHABLE_RETRY_SECONDS}
            return secured(JSONResponse(body, 503, headers=retry))
        refused = page_refused(request)
        if refused is not None:
            return refused
        return secured(HTMLResponse(render_unreachable(problem), 503, headers=retry))

    async def not_found(request: Request, exc: Exception) -> Response:
        refused = api_refused(request)
        if refused is not None:
            return refused
        return secured(JSONResponse({"error": "not found"}, 404))

    async def not_allowed(request: Request, exc: Exception) -> Response:
        refused = api_refused(request)
        if refused is not None:
            return refused
        return secured(JSONResponse({"error": "method not allowed"}, 405))

    routes: list[Route] = [
        Route("/", page, methods=["GET"]),
        Route("/decide", decide_form, methods=["POST"]),
        Route("/decide-selected", decide_selected_form, methods=["POST"]),
        Route("/signin", sign_in_link, methods=["GET"]),
        Route("/signin", sign_in_form, methods=["POST"]),
        Route("/api/pending", api_pending, methods=["GET"]),
        Route("/api/budgets", api_budgets, methods=["GET"]),
        Route("/api/decide", api_decide, methods=["POST"]),
        Route("/api/decide-selected", api_decide_selected, methods=["POST"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        404: not_found,
        405: not_allowed,
        RPCError: temporal_failed,
    }
    return Starlette(routes=routes, exception_handlers=handlers)
