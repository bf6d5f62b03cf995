"""The console's pages, rendered on the server: every value HTML-escaped, every form carries
the person's CSRF token, and a button is drawn only for a person whose role may press it (the
route checks again). Script is small and optional (a CSP nonce): the runs list reloads itself,
a run's page appends its live events; without script both still read and act.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote, urlencode

from relaykit.console.listing import ConsoleRow, RunFilters, RunsPage
from relaykit.console.people import ACTION_ROLES, Person, may
from relaykit.console.run_view import CONVERSATION_KINDS, ChildNode, RunView, arguments_text
from relaykit.inbox.pending import ui_url
from relaykit.pricing import format_usd
from relaykit.run_list import COUNTED_REASONS, REASONS, STATUS_FILTERS
from relaykit.runs import PendingApproval, RunEvent
from relaykit.watch import age

REFRESH_SECONDS = 10
LIVE_POLL_SECONDS = 2

STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:0;color:#1b1b1b}
main{padding:1rem 1.5rem} nav{background:#1f2937;color:#eee;padding:.5rem 1.5rem;display:flex;
gap:1.2rem;align-items:center} nav a{color:#fff;text-decoration:none} nav .who{margin-left:auto}
nav form{display:inline} h1{font-size:1.2rem;margin:.2rem 0 .6rem}
h2{font-size:1rem;margin:1.2rem 0 .4rem}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:.3rem .5rem;
border-bottom:1px solid #ddd;vertical-align:top} th{background:#f4f4f4}
code,pre{font-size:12px} pre{white-space:pre-wrap;word-break:break-all;margin:.2rem 0}
.muted{color:#666;font-size:12px} .notice{padding:.5rem .7rem;margin:.5rem 0;border-radius:4px;
background:#e8f4ea} .notice.error{background:#fbe9e9} .warn{color:#8a4b00}
.counts a{display:inline-block;margin-right:.6rem;padding:.2rem .6rem;border-radius:10px;
background:#eef;text-decoration:none;color:#224} .counts a.on{background:#335;color:#fff}
form.inline{display:inline-flex;gap:.3rem;flex-wrap:wrap;margin:.15rem 0}
.filters{display:flex;gap:.4rem;flex-wrap:wrap;margin:.6rem 0} .filters input{width:9rem}
.conv li{margin:.25rem 0;list-style:none} .conv{padding-left:0}
.k{display:inline-block;min-width:6.5rem;font-weight:600;color:#335}
.actions{display:grid;grid-template-columns:repeat(auto-fill,minmax(20rem,1fr));gap:.5rem}
.actions form{border:1px solid #ddd;border-radius:4px;padding:.4rem}
ul.tree{margin:.2rem 0 .2rem 1rem;padding-left:.6rem}
"""

_RELOAD = """
setInterval(function () {
  var a = document.activeElement;
  if (a && (a.tagName === "INPUT" || a.tagName === "TEXTAREA" || a.tagName === "SELECT")) return;
  var typed = Array.prototype.some.call(document.querySelectorAll("form.act input[type=text]"),
    function (i) { return i.value !== ""; });
  if (!typed) location.reload();
}, %d);
"""

_LIVE = """
(function () {
  var list = document.getElementById("live"), next = %d, url = %s;
  function poll() {
    fetch(url + "?from=" + next, {credentials: "same-origin"}).then(function (r) {
      return r.ok ? r.json() : null;
    }).then(function (body) {
      if (!body) return;
      body.events.forEach(function (e) {
        var li = document.createElement("li");
        li.textContent = e.line;
        list.appendChild(li);
        next = e.seq + 1;
      });
      if (body.open) setTimeout(poll, %d);
    }).catch(function () { setTimeout(poll, %d); });
  }
  setTimeout(poll, %d);
})();
"""


def run_href(run_id: str) -> str:
    """A run's page: ``/runs/<workflow id>`` (child ids keep their slashes)."""
    return escape("/runs/" + quote(run_id, safe="/"))


def _when(at: datetime | None, now: datetime) -> str:
    if at is None:
        return "?"
    return f'<time datetime="{at.isoformat()}">{age(at, now)} ago</time>'


def layout(
    title: str,
    body: str,
    *,
    person: Person | None,
    csrf: str = "",
    nonce: str = "",
    script: str = "",
) -> str:
    who = ""
    if person is not None:
        out = (
            '<form method="post" action="/signout">'
            f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
            '<button type="submit">Sign out</button></form>'
            if csrf
            else ""
        )
        who = f'<span class="who">{escape(person.name)} ({person.role}) {out}</span>'
    tail = f'<script nonce="{escape(nonce)}">{script}</script>' if script and nonce else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>{escape(title)}</title><style>{STYLE}</style></head><body>"
        '<nav><strong>relaykit console</strong><a href="/">Runs</a>'
        f'<a href="/approvals">Approvals</a>{who}</nav><main>{body}</main>{tail}</body></html>'
    )


def notice_html(notice: str, error: bool) -> str:
    if not notice:
        return ""
    return f'<div class="notice{" error" if error else ""}" role="status">{escape(notice)}</div>'


def action_form(
    run_id: str,
    action: str,
    label: str,
    csrf: str,
    *,
    fields: dict[str, str] | None = None,
    inputs: str = "",
    back: str = "",
) -> str:
    hidden = {"csrf": csrf, "action": action, "back": back, **(fields or {})}
    return (
        f'<form class="inline act" method="post" action="{run_href(run_id)}/act" '
        f'data-action="{action}">'
        + "".join(
            f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
            for k, v in hidden.items()
        )
        + f'{inputs}<button type="submit">{escape(label)}</button></form>'
    )


def approval_forms(run_id: str, item: PendingApproval, person: Person, csrf: str, back: str) -> str:
    call = f"<strong>{escape(item.tool)}</strong> <code>{escape(item.arguments[:300])}</code>"
    why = f' <span class="warn">{escape(item.reason)}</span>' if item.reason else ""
    path = " / ".join(item.run_path)
    head = f'<div data-call="{escape(item.call_id)}">{call}{why}<div class="muted">{escape(path)}'
    head += f" · call {escape(item.call_id)}</div>"
    if not may(person.role, ACTION_ROLES["approve"]):
        return head + "</div>"
    fields = {"call_id": item.call_id}
    approve = action_form(run_id, "approve", "Approve", csrf, fields=fields, back=back)
    reject = action_form(
        run_id,
        "reject",
        "Reject",
        csrf,
        fields=fields,
        back=back,
        inputs='<input type="text" name="reason" placeholder="reason (read by the model)" '
        'aria-label="reason">',
    )
    return head + approve + reject + "</div>"


def _row(row: ConsoleRow, person: Person, csrf: str, now: datetime, back: str) -> str:
    wait = ""
    if row.reason:
        wait = f"<strong>{escape(row.reason.replace('_', ' '))}</strong>"
        wait += f'<div class="muted">{escape(row.detail)}</div>' if row.detail else ""
        wait += "".join(approval_forms(row.run_id, a, person, csrf, back) for a in row.approvals)
    cost = "" if row.cost is None else format_usd(row.cost)
    return (
        f'<tr data-run="{escape(row.run_id)}"><td><a href="{run_href(row.run_id)}">'
        f"{escape(row.run_id)}</a></td><td>{escape(row.agent)}</td><td>{escape(row.status)}</td>"
        f"<td>{wait}</td><td>{escape(row.tenant or '')}</td><td>{cost}</td>"
        f"<td>{_when(row.started, now)}</td><td>{_when(row.last_activity, now)}</td></tr>"
    )


def _select(name: str, chosen: str, options: tuple[str, ...] | list[str]) -> str:
    opts = "".join(
        f'<option value="{escape(o)}"{" selected" if o == chosen else ""}>{escape(o or "any")}'
        "</option>"
        for o in ("", *options)
    )
    return f'<label>{name} <select name="{name}">{opts}</select></label>'


def render_runs(
    page: RunsPage,
    filters: RunFilters,
    *,
    person: Person,
    csrf: str,
    nonce: str,
    notice: str = "",
    notice_error: bool = False,
    now: datetime | None = None,
) -> str:
    now = now or datetime.now(UTC)
    kept = {k: v for k, v in filters.__dict__.items() if v and k != "roots"}
    back = "/?" + urlencode(kept)
    chips = "".join(
        f'<a class="{"on" if key == filters.reason else ""}" '
        f'href="/?{urlencode({"reason": key})}" data-reason="{key}">'
        f"{key.replace('_', ' ')}: <strong>{page.counts.get(key, 0)}</strong></a>"
        for key in COUNTED_REASONS
    )
    form = (
        '<form class="filters" method="get" action="/">'
        f'<input name="agent" placeholder="agent" value="{escape(filters.agent)}" '
        'aria-label="agent">'
        + _select("status", filters.status, list(STATUS_FILTERS))
        + _select("reason", filters.reason, REASONS)
        + f'<input name="tenant" placeholder="tenant" value="{escape(filters.tenant)}" '
        'aria-label="tenant">'
        f'<input name="text" placeholder="run id starts with" '
        f'value="{escape(filters.text)}" aria-label="text">'
        '<button type="submit">Filter</button> <a href="/">clear</a></form>'
    )
    rows = "".join(_row(row, person, csrf, now, back) for row in page.rows)
    table = (
        "<table><thead><tr><th>Run</th><th>Agent</th><th>Status</th><th>Waiting for</th>"
        "<th>Tenant</th><th>Cost</th><th>Age</th><th>Last activity</th></tr></thead>"
        f"<tbody>{rows}</tbody></table>"
        if page.rows
        else "<p>No runs match.</p>"
    )
    more = (
        f'<p><a rel="next" href="/?{escape(urlencode({**kept, "page": page.next_token}))}">'
        "Next page</a></p>"
        if page.next_token
        else ""
    )
    body = (
        f"<h1>Runs</h1><div class=counts>{chips}</div>{notice_html(notice, notice_error)}{form}"
        f'{table}{more}<p class="muted">refreshed {now.strftime("%H:%M:%S")} UTC</p>'
    )
    return layout(
        "relaykit console: runs",
        body,
        person=person,
        csrf=csrf,
        nonce=nonce,
        script=_RELOAD % (REFRESH_SECONDS * 1000),
    )


def event_line(event: RunEvent) -> str:
    from relaykit.streaming import StreamEvent
    from relaykit.watch import describe

    return describe(StreamEvent(**event.model_dump(), workflow_id=""))


def _conversation(events: list[RunEvent]) -> str:
    items = []
    for event in events:
        if event.kind not in CONVERSATION_KINDS:
            continue
        data = event.data
        label = {
            "run_started": "user",
            "message": event.agent,
            "message_injected": "user",
            "final": "answer",
        }.get(event.kind, event.kind.replace("_", " "))
        if event.kind == "run_started":
            body = escape(str(data.get("input", "")))
        elif event.kind == "message":
            body = escape(str(data.get("text", "")))
        elif event.kind == "tool_call":
            body = (
                f"<strong>{escape(str(data.get('name')))}</strong>"
                f"<pre>{escape(arguments_text(data.get('arguments', '')))}</pre>"
            )
        elif event.kind == "tool_result":
            body = (
                f"<strong>{escape(str(data.get('name')))}</strong>"
                f"<pre>{escape(str(data.get('content', '')))}</pre>"
            )
        else:
            body = escape(event_line(event))
        items.append(
            f'<li data-kind="{event.kind}"><span class="k">{escape(label)}</span> '
            f'<span class="muted">t{event.turn} · {escape("/".join(event.run_path))}</span>'
            f"<div>{body}</div></li>"
        )
    return f'<ul class="conv">{"".join(items)}</ul>' if items else "<p>No conversation yet.</p>"


def _tree(nodes: list[ChildNode]) -> str:
    if not nodes:
        return ""
    items = "".join(
        f'<li data-child="{escape(n.row.run_id)}"><a href="{run_href(n.row.run_id)}">'
        f"{escape(n.row.run_id)}</a> {escape(n.row.agent)} · <strong>{escape(n.row.status)}"
        f"</strong>{'' if n.row.cost is None else ' · ' + format_usd(n.row.cost)}"
        f"{_tree(n.children)}</li>"
        for n in nodes
    )
    return f'<ul class="tree">{items}</ul>'


def _actions(view: RunView, person: Person, csrf: str) -> str:
    run_id, back = view.run_id, "/runs/" + quote(view.run_id, safe="/")
    parts = []
    if view.snapshot is not None:
        for item in view.snapshot.pending_approvals:
            parts.append(f"<div>{approval_forms(run_id, item, person, csrf, back)}</div>")
    if may(person.role, "operator"):
        text = '<input type="text" name="text" placeholder="{}" aria-label="{}">'
        if view.open:
            parts += [
                action_form(
                    run_id,
                    "steer",
                    "Steer",
                    csrf,
                    inputs=text.format("message now", "steer text"),
                    back=back,
                ),
                action_form(
                    run_id,
                    "send",
                    "Send",
                    csrf,
                    inputs=text.format("message at next turn", "send text"),
                    back=back,
                ),
                action_form(run_id, "pause", "Pause", csrf, back=back),
                action_form(
                    run_id,
                    "resume",
                    "Resume",
                    csrf,
                    inputs=text.format("optional message", "resume text"),
                    back=back,
                ),
                action_form(run_id, "cancel", "Cancel run", csrf, back=back),
            ]
            if view.snapshot is not None and view.snapshot.budget is not None:
                amount = (
                    '<input type="text" name="amount" placeholder="dollars" aria-label="amount">'
                )
                parts.append(
                    action_form(run_id, "budget", "Raise budget", csrf, inputs=amount, back=back)
                )
        turn = (
            f'<input type="number" name="turn" min="1" value="{max(view.last_turn, 1)}" '
            'aria-label="turn" style="width:4rem">'
            '<input type="text" name="text" placeholder="new input (optional)" '
            'aria-label="fork input">'
        )
        parts.append(action_form(run_id, "fork", "Fork at turn", csrf, inputs=turn, back=back))
    if not parts:
        return ""
    return f'<h2>Actions</h2><div class="actions">{"".join(parts)}</div>'


def render_run(
    view: RunView,
    *,
    person: Person,
    csrf: str,
    nonce: str,
    namespace: str,
    notice: str = "",
    notice_error: bool = False,
) -> str:
    snap = view.snapshot
    cost = snap.usage.cost_usd if snap is not None else view.row.cost
    budget = ""
    if snap is not None and snap.budget is not None:
        budget = f" · budget {format_usd(snap.budget.spent)} of {format_usd(snap.budget.limit)}"
    facts = [
        f"status <strong data-status>{escape(snap.status if snap else view.status)}</strong>",
        f"agent {escape(snap.agent if snap else view.row.agent)}",
        f"tenant {escape(view.row.tenant or '-')}",
        f"cost {'?' if cost is None else format_usd(cost)}{budget}",
        f"turn {snap.turn if snap else view.last_turn}",
    ]
    if view.row.parent:
        facts.append(f'parent <a href="{run_href(view.row.parent)}">{escape(view.row.parent)}</a>')
    link = escape(ui_url(view.run_id, namespace))
    unreadable = (
        '<div class="notice error">Its conversation could not be read: '
        f"{escape(view.unreadable)}</div>"
        if view.unreadable
        else ""
    )
    costs = "".join(
        f"<tr><td>{escape(agent)}</td><td>{format_usd(usd)}</td></tr>"
        for agent, usd in view.cost_by_agent.items()
    )
    live_start = (max((e.seq for e in view.events), default=-1) + 1) if view.events else 0
    body = (
        f"<h1>Run <code>{escape(view.run_id)}</code></h1>"
        f'<div>{" · ".join(facts)} · <a id="temporal-ui" href="{link}" target="_blank" '
        'rel="noopener noreferrer">open in the Temporal UI</a></div>'
        f"{notice_html(notice, notice_error)}{unreadable}{_actions(view, person, csrf)}"
        f"<h2>Conversation</h2>{_conversation(view.events)}"
        f"<h2>Children and subagents</h2>{_tree(view.children) or '<p>None.</p>'}"
        "<h2>Cost by agent</h2>"
        + (f"<table><tbody>{costs}</tbody></table>" if costs else "<p>No priced calls.</p>")
        + ('<h2>Live events</h2><ul id="live" class="conv"></ul>' if view.open else "")
    )
    script = ""
    if view.open:
        url = json.dumps("/api/runs/" + quote(view.run_id, safe="/") + "/events")
        poll = LIVE_POLL_SECONDS * 1000
        script = _LIVE % (live_start, url, poll, poll * 3, poll)
    return layout(
        f"relaykit console: {view.run_id}",
        body,
        person=person,
        csrf=csrf,
        nonce=nonce,
        script=script,
    )


def render_confirm(
    run_id: str, action: str, fields: dict[str, str], *, person: Person, csrf: str
) -> str:
    said = {
        "approve": f"Approve call {fields.get('call_id', '')} in run {run_id}?",
        "reject": f"Reject call {fields.get('call_id', '')} in run {run_id}"
        + (f" with the reason “{fields['reason']}”?" if fields.get("reason") else "?"),
        "steer": f"Steer run {run_id} now with “{fields.get('text', '')}”? A model call in "
        "flight is cancelled.",
        "send": f"Send “{fields.get('text', '')}” to run {run_id} at its next turn?",
        "pause": f"Pause run {run_id} at its next turn boundary?",
        "resume": f"Resume run {run_id}"
        + (f" with “{fields['text']}”?" if fields.get("text") else "?"),
        "fork": f"Start a new run from turn {fields.get('turn', '')} of {run_id}"
        + (f" with the input “{fields['text']}”?" if fields.get("text") else "?"),
        "cancel": f"Cancel run {run_id} (and its child runs)?",
        "budget": f"Raise the dollar budget of run {run_id} by {fields.get('amount', '')}?",
    }.get(action, f"{action} run {run_id}?")
    hidden = "".join(
        f'<input type="hidden" name="{escape(k)}" value="{escape(v)}">'
        for k, v in {**fields, "action": action, "csrf": csrf, "confirmed": "1"}.items()
    )
    back = fields.get("back") or "/runs/" + quote(run_id, safe="/")
    body = (
        f"<h1>Confirm</h1><p>{escape(said)}</p><p class=muted>as {escape(person.name)}</p>"
        f'<form method="post" action="{run_href(run_id)}/act">{hidden}'
        f'<button type="submit" id="confirm">Yes, {escape(action)}</button> '
        f'<a href="{escape(back)}">No, go back</a></form>'
    )
    return layout("relaykit console: confirm", body, person=person, csrf=csrf)


def render_message(title: str, message: str, *, person: Person | None = None) -> str:
    return layout(title, f"<h1>{escape(title)}</h1><p>{escape(message)}</p>", person=person)


def render_sign_in(*, error: str = "") -> str:
    body = (
        "<h1>Sign in</h1><p>Sign in with your own token (from the console's users file or "
        "<code>RELAYKIT_CONSOLE_USERS</code>).</p>"
        + notice_html(error, True)
        + '<form method="post" action="/signin"><input type="password" name="token" '
        'aria-label="token" placeholder="token" autocomplete="current-password" required> '
        '<button type="submit">Sign in</button></form>'
    )
    return layout("relaykit console: sign in", body, person=None)
