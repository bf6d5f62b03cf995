"""The console's HTTP application (``relaykit console``): pages, a JSON API, sign-in.

Routes (every one checks its role; see :mod:`relaykit.console.people`):

- ``GET /``: the runs list (filters ``agent``, ``status``, ``reason``, ``tenant``, ``text``;
  ``page`` is visibility's page token); ``GET /approvals``: the same list, runs waiting for a
  person (the inbox as the console's view);
- ``GET /runs/<id>``: a run's page; ``POST /runs/<id>/act``: an action from a form, shown first
  as a confirmation page, taken once confirmed; then back with what happened;
- ``GET /api/runs``, ``GET /api/runs/<id>``, ``GET /api/runs/<id>/events?from=N`` (the live part
  of a run's page), ``POST /api/runs/<id>/<action>`` (JSON body), ``GET /api/pending`` (the
  inbox's listing, with budget waits);
- ``GET|POST /signin``, ``POST /signout``.

A viewer's request for an action answers 403 and their pages draw no action buttons. Forms carry
a CSRF token tied to the person's session; API posts need ``application/json`` and the
``X-CSRF-Token`` header unless they carry the person's own ``Authorization: Bearer`` token.
While Temporal is unreachable every route that asks it answers 503 with the inbox's page that
retries by itself (JSON for the API), and the log gets one line per request.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import quote, urlencode

from temporalio.client import Client
from temporalio.service import RPCError, RPCStatusCode

from relaykit.console.actions import ACTIONS, ActionError, act
from relaykit.console.listing import RunFilters, runs_page
from relaykit.console.pages import (
    event_line,
    render_confirm,
    render_message,
    render_run,
    render_runs,
    render_sign_in,
)
from relaykit.console.people import (
    ACTION_ROLES,
    SESSION_COOKIE,
    SESSION_SECONDS,
    People,
    Person,
    may,
)
from relaykit.console.run_view import RunNotFound, events_since, read_run
from relaykit.errors import RelaykitError
from relaykit.inbox.app import _host_name, is_loopback, temporal_problem
from relaykit.inbox.page import UNREACHABLE_RETRY_SECONDS, render_unreachable

if TYPE_CHECKING:
    from starlette.responses import Response

R = TypeVar("R", bound="Response")
CSRF_HEADER = "x-csrf-token"
FORM_FIELDS = ("call_id", "reason", "text", "turn", "amount", "back")
logger = logging.getLogger(__name__)


def _secured(response: R, nonce: str = "") -> R:
    script = f"'nonce-{nonce}'" if nonce else "'none'"
    response.headers["content-security-policy"] = (
        f"default-src 'none'; style-src 'unsafe-inline'; script-src {script}; "
        "connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'; "
        "base-uri 'none'"
    )
    response.headers["x-frame-options"] = "DENY"
    response.headers["referrer-policy"] = "no-referrer"
    response.headers["cache-control"] = "no-store"
    response.headers["x-content-type-options"] = "nosniff"
    return response


def _filters(params: Any) -> RunFilters:
    return RunFilters(
        **{k: params.get(k, "")[:200] for k in ("agent", "status", "reason", "tenant", "text")}
    )


def _back(value: str, run_id: str) -> str:
    """Where a form returns to: a path of this console only (never another site)."""
    if value.startswith("/") and not value.startswith("//") and "\\" not in value:
        return value
    return f"/runs/{quote(run_id, safe='/')}"


def _with_notice(path: str, notice: str, error: bool) -> str:
    extra = {"notice": notice[:500], **({"error": "1"} if error else {})}
    return path + ("&" if "?" in path else "?") + urlencode(extra, quote_via=quote)


def console_app(client: Client, people: People) -> Any:
    """The Starlette application of ``relaykit console`` over ``client``'s namespace."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse
    from starlette.routing import Route

    def html(body: str, status: int = 200, nonce: str = "") -> Response:
        return _secured(HTMLResponse(body, status), nonce)

    def api(body: Any, status: int = 200, **headers: str) -> Response:
        return _secured(JSONResponse(body, status, headers=headers or None))

    def is_api(request: Request) -> bool:
        return request.url.path.startswith("/api/")

    def who(request: Request) -> Person | Response:
        """The signed-in person, or the answer for a request without one."""
        if not people.guarded and not is_loopback(_host_name(request.headers.get("host", ""))):
            return api({"error": "this console answers loopback hosts only"}, 421)
        person = people.by_bearer(request.headers) or people.person(
            request.headers, request.cookies
        )
        if person is not None:
            return person
        if is_api(request):
            return api({"error": "unauthorized: sign in, or send your own token as Bearer"}, 401)
        if people.trust_header:
            return html(
                render_message("Not signed in", "the proxy named nobody this console knows"), 401
            )
        return html(render_sign_in(), 401)

    def forbidden(request: Request, person: Person, needed: str) -> Response:
        message = f"{person.name} is a {person.role}; this needs the {needed} role"
        if is_api(request):
            return api({"error": message}, 403)
        return html(render_message("Forbidden", message, person=person), 403)

    def csrf_of(request: Request, person: Person) -> str:
        return people.csrf(person, request.cookies)

    async def runs(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        filters = _filters(request.query_params)
        try:
            page = await runs_page(client, filters, request.query_params.get("page", ""))
        except RelaykitError as exc:
            return html(render_message("Not a page of this list", str(exc), person=person), 400)
        nonce = secrets.token_urlsafe(16)
        body = render_runs(
            page,
            filters,
            person=person,
            csrf=csrf_of(request, person),
            nonce=nonce,
            notice=request.query_params.get("notice", "")[:500],
            notice_error=request.query_params.get("error") == "1",
        )
        return html(body, nonce=nonce)

    async def approvals(request: Request) -> Response:
        return _secured(RedirectResponse("/?reason=approval", 303))

    async def run_page(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        run_id = request.path_params["run_id"]
        try:
            view = await read_run(client, run_id)
        except RunNotFound:
            return html(
                render_message("No such run", f"no run with id {run_id!r}", person=person), 404
            )
        nonce = secrets.token_urlsafe(16)
        body = render_run(
            view,
            person=person,
            csrf=csrf_of(request, person),
            nonce=nonce,
            namespace=client.namespace,
            notice=request.query_params.get("notice", "")[:500],
            notice_error=request.query_params.get("error") == "1",
        )
        return html(body, nonce=nonce)

    async def act_form(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        run_id = request.path_params["run_id"]
        form = await request.form()
        given = {
            k: v
            for k in ("csrf", "action", "confirmed", *FORM_FIELDS)
            if isinstance(v := form.get(k), str)
        }
        if not people.csrf_ok(person, request.cookies, given.get("csrf")):
            return html(
                render_message(
                    "Refused",
                    "the form's CSRF token is missing or wrong; reload the page",
                    person=person,
                ),
                403,
            )
        action = given.get("action", "")
        needed = ACTION_ROLES.get(action)
        if needed is None:
            return html(render_message("Refused", f"unknown action {action!r}", person=person), 400)
        if not may(person.role, needed):
            return forbidden(request, person, needed)
        fields = {k: given[k] for k in FORM_FIELDS if k in given}
        if given.get("confirmed") != "1":
            return html(
                render_confirm(run_id, action, fields, person=person, csrf=csrf_of(request, person))
            )
        back = _back(fields.get("back", ""), run_id)
        try:
            done = await act(client, run_id, action, fields, person.name)
        except ActionError as exc:
            return _secured(RedirectResponse(_with_notice(back, exc.message, True), 303))
        logger.info("%s: %s", person.name, done.message)
        if action == "fork":
            back = f"/runs/{quote(done.run_id, safe='/')}"
        return _secured(RedirectResponse(_with_notice(back, done.message, False), 303))

    async def api_runs(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        filters = _filters(request.query_params)
        try:
            page = await runs_page(client, filters, request.query_params.get("page", ""))
        except RelaykitError as exc:
            return api({"error": str(exc)}, 400)
        counts = page.counts
        return api(
            {
                "runs": [row.to_json() for row in page.rows],
                "next_page": page.next_token,
                "counts": counts,
            }
        )

    async def api_run(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        try:
            view = await read_run(client, request.path_params["run_id"])
        except RunNotFound:
            return api({"error": "no such run"}, 404)
        return api(
            {
                **view.row.to_json(),
                "open": view.open,
                "unreadable": view.unreadable,
                "events": [e.model_dump(mode="json") for e in view.events],
                "cost_by_agent": view.cost_by_agent,
                "snapshot": view.snapshot.model_dump(mode="json") if view.snapshot else None,
            }
        )

    async def api_events(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        run_id = request.path_params["run_id"]
        start = request.query_params.get("from", "0")
        try:
            events = await events_since(client, run_id, int(start) if start.isdigit() else 0)
            description = await client.get_workflow_handle(run_id).describe()
        except RPCError as exc:
            if exc.status in (RPCStatusCode.UNAVAILABLE, RPCStatusCode.DEADLINE_EXCEEDED):
                raise
            return api({"error": f"Temporal: {exc.message}"}, 503, **{"retry-after": "2"})
        except Exception as exc:  # noqa: BLE001 - the page polls again
            return api({"error": str(exc) or type(exc).__name__}, 503, **{"retry-after": "2"})
        from temporalio.client import WorkflowExecutionStatus

        lines = [
            {"seq": e.seq, "kind": e.kind, "line": f"t{e.turn} {e.kind}: {event_line(e)}"}
            for e in events
        ]
        return api({"events": lines, "open": description.status == WorkflowExecutionStatus.RUNNING})

    async def api_act(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        action = request.path_params["action"]
        needed = ACTION_ROLES.get(action)
        if needed is None or action not in ACTIONS:
            return api({"error": f"unknown action {action!r}"}, 404)
        if not may(person.role, needed):
            return forbidden(request, person, needed)
        bearer = people.by_bearer(request.headers) is not None
        if not bearer and not people.csrf_ok(
            person, request.cookies, request.headers.get(CSRF_HEADER)
        ):
            return api({"error": f"send the {CSRF_HEADER} header of your page"}, 403)
        if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
            return api({"error": "send the body as application/json"}, 400)
        try:
            body = await request.json()
        except ValueError:
            return api({"error": "the body is not JSON"}, 400)
        if not isinstance(body, dict):
            return api({"error": "the body must be a JSON object"}, 400)
        fields = {k: str(v) for k, v in body.items() if k in FORM_FIELDS and v is not None}
        try:
            done = await act(client, request.path_params["run_id"], action, fields, person.name)
        except ActionError as exc:
            return api({"error": exc.message}, exc.status)
        return api({"done": done.message, "run_id": done.run_id, "by": person.name})

    async def api_pending(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        from relaykit.inbox.pending import list_pending

        listing = await list_pending(client)
        return api(listing.model_dump(mode="json"))

    async def sign_in_page(request: Request) -> Response:
        return html(render_sign_in(), 200 if people.needs_sign_in else 404)

    async def sign_in(request: Request) -> Response:
        if not people.needs_sign_in:
            return _secured(RedirectResponse("/", 303))
        token = (await request.form()).get("token")
        session = people.sign_in(token) if isinstance(token, str) else None
        if session is None:
            return html(render_sign_in(error="wrong token"), 401)
        response = _secured(RedirectResponse("/", 303))
        response.set_cookie(
            SESSION_COOKIE,
            session,
            max_age=SESSION_SECONDS,
            httponly=True,
            samesite="strict",
            secure=request.url.scheme == "https",
            path="/",
        )
        return response

    async def sign_out(request: Request) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        form = await request.form()
        csrf = form.get("csrf")
        if not people.csrf_ok(person, request.cookies, csrf if isinstance(csrf, str) else None):
            return html(
                render_message("Refused", "the form's CSRF token is wrong", person=person), 403
            )
        response = _secured(RedirectResponse("/signin", 303))
        response.delete_cookie(SESSION_COOKIE, path="/")
        return response

    async def temporal_failed(request: Request, exc: Exception) -> Response:
        assert isinstance(exc, RPCError)
        problem = temporal_problem(client, exc)
        logger.warning("%s %s: %s; answered 503", request.method, request.url.path, problem)
        retry = {"retry-after": str(UNREACHABLE_RETRY_SECONDS)}
        if is_api(request):
            return api(
                {"error": f"{problem}; retry later", "retry_after": UNREACHABLE_RETRY_SECONDS},
                503,
                **retry,
            )
        return _secured(
            HTMLResponse(render_unreachable(problem, name="relaykit console"), 503, headers=retry)
        )

    async def not_found(request: Request, exc: Exception) -> Response:
        person = who(request)
        if not isinstance(person, Person):
            return person
        return api({"error": "not found"}, 404)

    routes = [
        Route("/", runs, methods=["GET"]),
        Route("/approvals", approvals, methods=["GET"]),
        Route("/runs/{run_id:path}/act", act_form, methods=["POST"]),
        Route("/runs/{run_id:path}", run_page, methods=["GET"]),
        Route("/api/runs", api_runs, methods=["GET"]),
        Route("/api/runs/{run_id:path}/events", api_events, methods=["GET"]),
        Route("/api/runs/{run_id:path}/{action}", api_act, methods=["POST"]),
        Route("/api/runs/{run_id:path}", api_run, methods=["GET"]),
        Route("/api/pending", api_pending, methods=["GET"]),
        Route("/signin", sign_in_page, methods=["GET"]),
        Route("/signin", sign_in, methods=["POST"]),
        Route("/signout", sign_out, methods=["POST"]),
    ]
    handlers: dict[Any, Callable[[Request, Exception], Awaitable[Response]]] = {
        404: not_found,
        RPCError: temporal_failed,
    }
    return Starlette(routes=routes, exception_handlers=handlers)
