"""The approvals inbox: every tool call of a namespace that waits for a person, on one page and
one JSON API (``relaykit inbox``).

- :mod:`relaykit.inbox.pending` finds and decides the waiting calls. It needs only a Temporal
  client: runs waiting for a person are found through relaykit's search attributes
  (``RelayStatus = 'waiting_approval'`` on root runs), and only those runs are queried. A call
  waiting inside an agent-as-tool child already surfaces in its root run's pending approvals,
  so listing root runs lists it once, with its run path.
- :mod:`relaykit.inbox.app` is the Starlette application (HTML page, JSON API, sign-in, CSRF);
  :mod:`relaykit.inbox.page` renders the page. Both need ``relaykit[codec]`` (starlette,
  uvicorn); the finding and deciding do not.
"""

from relaykit.inbox.pending import (
    DecideError,
    InboxItem,
    InboxListing,
    decide,
    list_pending,
    waiting_runs_query,
)

__all__ = [
    "DecideError",
    "InboxItem",
    "InboxListing",
    "decide",
    "list_pending",
    "waiting_runs_query",
]
