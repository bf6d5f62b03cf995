"""The inbox page, rendered on the server (no JavaScript needed to read or decide).

Hundreds of items stay usable: one compact row per call, oldest first, long arguments folded
into a ``<details>``, a server-side filter (``?q=``) that survives the page's own refresh. The
page refreshes itself every :data:`REFRESH_SECONDS`, but not while a person is typing a reason
or has a field focused (a small script with a CSP nonce; without script, a ``<noscript>`` meta
refresh). Every value is HTML-escaped.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from html import escape

from relaykit.inbox.pending import InboxItem, InboxListing

REFRESH_SECONDS = 10
ARGUMENTS_SHOWN = 160
"""Characters of a call's arguments shown in its row; the rest unfolds on click."""

_STYLE = """
body{font:14px/1.4 system-ui,sans-serif;margin:1.5rem;color:#1b1b1b}
h1{font-size:1.2rem;margin:0 0 .3rem} .meta{color:#555;margin-bottom:.8rem}
table{border-collapse:collapse;width:100%} th,td{text-align:left;padding:.35rem .5rem;
border-bottom:1px solid #ddd;vertical-align:top} th{background:#f4f4f4;position:sticky;top:0}
code{font-size:12px;word-break:break-all} .age{white-space:nowrap;color:#555}
.notice{padding:.5rem .7rem;margin:.5rem 0;border-radius:4px;background:#e8f4ea}
.notice.error{background:#fbe9e9} .warn{color:#8a4b00}
form.decide{display:flex;gap:.3rem;flex-wrap:wrap} form.decide input[name=reason]{width:14rem}
button{cursor:pointer} .path{color:#555;font-size:12px}
"""

# Reload unless someone is typing or choosing: a focused field, a reason typed but not sent
# yet, a call ticked for "approve selected". The header's box ticks every row shown.
_SCRIPT = """
setInterval(function () {
  var active = document.activeElement;
  if (active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA")) return;
  var typed = Array.prototype.some.call(
    document.querySelectorAll("input[name=reason]"), function (i) { return i.value !== ""; });
  if (!typed && !document.querySelector("input[name=pick]:checked")) location.reload();
}, %d);
var all = document.getElementById("pick-all");
if (all) all.addEventListener("change", function () {
  document.querySelectorAll("input[name=pick]").forEach(function (i) { i.checked = all.checked; });
});
"""


def age(requested_at: str | None, now: datetime) -> str:
    if not requested_at:
        return "?"
    at = datetime.fromisoformat(requested_at.replace("Z", "+00:00"))
    seconds = max(int((now - at).total_seconds()), 0)
    for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
        if seconds >= size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def matches(item: InboxItem, needle: str) -> bool:
    if not needle:
        return True
    haystack = " ".join(
        [item.run_id, item.agent, item.tool, "/".join(item.run_path), json.dumps(item.arguments)]
    ).lower()
    return needle.lower() in haystack


def _arguments_cell(item: InboxItem) -> str:
    text = json.dumps(item.arguments, ensure_ascii=False)
    if len(text) <= ARGUMENTS_SHOWN:
        return f"<code>{escape(text)}</code>"
    return (
        f"<details><summary><code>{escape(text[:ARGUMENTS_SHOWN])}…</code></summary>"
        f"<code>{escape(text)}</code></details>"
    )


def _row(item: InboxItem, csrf: str, now: datetime, query: str) -> str:
    path = " / ".join(item.run_path)
    reason = f'<div class="warn">{escape(item.reason)}</div>' if item.reason else ""
    picked = json.dumps([item.run_id, item.call_id])
    return (
        f'<tr data-run="{escape(item.run_id)}" data-call="{escape(item.call_id)}">'
        f'<td><input type="checkbox" name="pick" form="selected" value="{escape(picked)}" '
        f'aria-label="select {escape(item.tool)} ({escape(item.call_id)})"></td>'
        f'<td><a href="{escape(item.ui_url)}" target="_blank" rel="noopener noreferrer">'
        f"{escape(item.run_id)}</a>"
        f'<div class="path">{escape(path)}</div></td>'
        f"<td>{escape(item.agent)}</td>"
        f"<td><strong>{escape(item.tool)}</strong>{reason}"
        f'<div class="path">{escape(item.call_id)}</div></td>'
        f"<td>{_arguments_cell(item)}</td>"
        f'<td class="age"><time datetime="{escape(item.requested_at or "")}">'
        f"{age(item.requested_at, now)}</time></td>"
        '<td><form class="decide" method="post" action="decide">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<input type="hidden" name="run_id" value="{escape(item.run_id)}">'
        f'<input type="hidden" name="call_id" value="{escape(item.call_id)}">'
        f'<input type="hidden" name="q" value="{escape(query)}">'
        '<button type="submit" name="decision" value="approve">Approve</button>'
        '<input type="text" name="reason" placeholder="reason (read by the model)" '
        'aria-label="reason">'
        '<button type="submit" name="decision" value="reject">Reject</button>'
        "</form></td></tr>"
    )


def _selected_form(csrf: str, query: str) -> str:
    """ "Approve selected": the rows' checkboxes belong to this form (their ``form=``), so it
    works without script; one decision and reason for every ticked call."""
    return (
        '<form id="selected" class="decide" method="post" action="decide-selected">'
        f'<input type="hidden" name="csrf" value="{escape(csrf)}">'
        f'<input type="hidden" name="q" value="{escape(query)}">'
        '<button type="submit" name="decision" value="approve">Approve selected</button>'
        '<input type="text" name="reason" placeholder="reason for the selected (read by the '
        'model)" aria-label="reason for the selected">'
        '<button type="submit" name="decision" value="reject">Reject selected</button>'
        "</form>"
    )


def render_inbox(
    listing: InboxListing,
    *,
    namespace: str,
    csrf: str,
    nonce: str,
    query: str = "",
    notice: str = "",
    notice_error: bool = False,
    now: datetime | None = None,
) -> str:
    now = now or datetime.now(UTC)
    shown = [item for item in listing.items if matches(item, query)]
    count = len(listing.items)
    heading = f"{count} approval{'s' if count != 1 else ''} waiting"
    if query:
        heading += f" ({len(shown)} match “{escape(query)}”)"
    notice_html = (
        f'<div class="notice{" error" if notice_error else ""}" role="status">'
        f"{escape(notice)}</div>"
        if notice
        else ""
    )
    unreadable = "".join(
        f"<li>{escape(run.run_id)}: {escape(run.why)}</li>" for run in listing.unreadable
    )
    unreadable_html = (
        '<div class="warn">Runs waiting whose approvals could not be read:'
        f"<ul>{unreadable}</ul></div>"
        if unreadable
        else ""
    )
    budgets = "".join(
        f'<li><a href="{escape(wait.ui_url)}">{escape(wait.run_id)}</a>: spent '
        f"{'?' if wait.spent is None else f'${wait.spent:.4f}'} of "
        f"{'?' if wait.limit is None else f'${wait.limit:.4f}'} · "
        f"<code>relaykit budget {escape(wait.run_id)} --raise AMOUNT</code> "
        "(or <code>--finish</code>, <code>--cancel</code>)</li>"
        for wait in listing.budgets
    )
    budgets_html = (
        f'<div class="warn">Runs at their budget:<ul>{budgets}</ul></div>' if budgets else ""
    )
    rows = "".join(_row(item, csrf, now, query) for item in shown)
    table = (
        _selected_form(csrf, query) + "<table><thead><tr>"
        '<th><input type="checkbox" id="pick-all" aria-label="select every call shown"></th>'
        "<th>Run</th><th>Agent</th><th>Tool</th><th>Arguments</th>"
        f"<th>Age</th><th>Decision</th></tr></thead><tbody>{rows}</tbody></table>"
        if shown
        else "<p>Nothing waits for a person.</p>"
    )
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        '<meta name="viewport" content="width=device-width,initial-scale=1">'
        f"<title>relaykit inbox ({count})</title><style>{_STYLE}</style>"
        f'<noscript><meta http-equiv="refresh" content="{REFRESH_SECONDS * 3}"></noscript>'
        "</head><body>"
        f"<h1>{heading}</h1>"
        f'<div class="meta">namespace {escape(namespace)} · {listing.runs} run'
        f"{'s' if listing.runs != 1 else ''} waiting · refreshed "
        f"{now.strftime('%H:%M:%S')} UTC</div>"
        f"{notice_html}{unreadable_html}{budgets_html}"
        '<form method="get" action="./"><input type="search" name="q" '
        f'value="{escape(query)}" placeholder="filter: run, agent, tool, arguments" '
        'aria-label="filter"> <button type="submit">Filter</button></form>'
        f"{table}"
        f'<script nonce="{escape(nonce)}">{_SCRIPT % (REFRESH_SECONDS * 1000)}</script>'
        "</body></html>"
    )


def render_sign_in(*, error: str = "") -> str:
    message = f'<div class="notice error">{escape(error)}</div>' if error else ""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f"<title>relaykit inbox: sign in</title><style>{_STYLE}</style></head><body>"
        "<h1>relaykit inbox</h1>"
        "<p>Sign in with the token in <code>RELAYKIT_INBOX_AUTH</code> (or open the link "
        "<code>relaykit inbox</code> printed).</p>"
        f"{message}"
        '<form method="post" action="signin"><input type="password" name="token" '
        'aria-label="token" placeholder="token" autocomplete="current-password" required> '
        '<button type="submit">Sign in</button></form></body></html>'
    )


UNREACHABLE_RETRY_SECONDS = 5
"""How soon the page Temporal could not fill asks again by itself."""


def render_unreachable(problem: str, *, name: str = "relaykit inbox") -> str:
    """The page while Temporal cannot be asked: what is wrong and that it retries by itself."""
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8>"
        f'<meta http-equiv="refresh" content="{UNREACHABLE_RETRY_SECONDS}">'
        f"<title>{escape(name)}: Temporal unreachable</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escape(name)}</h1>"
        f'<div class="notice error">{escape(problem)}</div>'
        f"<p>This page retries by itself every {UNREACHABLE_RETRY_SECONDS} s; no decision is "
        "lost while it waits (the runs keep waiting in Temporal).</p></body></html>"
    )
