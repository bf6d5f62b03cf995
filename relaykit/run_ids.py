"""Ids of child runs, within the Temporal server's limit on a workflow id.

A child run is named ``<parent id>/<segment>`` (an agent tool's ``<agent>-<n>``, a subagent's
``task-<n>``), so an id grows with every level and starts with its root run's id, which the
store's folders and ``relaykit gc`` read. The server refuses a workflow id over 1,000 bytes, and
a refused child start fails the parent's workflow task again at every retry: the run wedged.
Past the limit the id becomes ``<root id>/<digest>``; when even that does not fit (a root id of
nearly 1,000 bytes), the call that would start the child gets an error result instead.

Workflow code imports this module: it does no I/O.
"""

from __future__ import annotations

import hashlib

from relaykit.errors import ConfigurationError

MAX_RUN_ID_BYTES = 1000
"""The server's default limit on a workflow id (``limit.maxIDLength``), in UTF-8 bytes."""


def run_id_fits(run_id: str) -> bool:
    return len(run_id.encode("utf-8", "surrogatepass")) <= MAX_RUN_ID_BYTES


def check_run_id(run_id: str, what: str) -> str:
    """``run_id`` if the server takes it; else one :class:`ConfigurationError` before anything
    is sent (the server's own refusal is an ``RPCError`` in its words)."""
    if not run_id_fits(run_id):
        raise ConfigurationError(
            f"{what} is {len(run_id.encode('utf-8', 'surrogatepass'))} bytes long",
            hint=f"at most {MAX_RUN_ID_BYTES} (UTF-8), the Temporal server's limit",
        )
    return run_id


def child_run_id(parent: str, segment: str) -> str:
    """``<parent>/<segment>``, or ``<root>/<digest of it>`` when that is over the limit. The
    result may still not fit (:func:`run_id_fits`) when the root's own id is nearly 1,000 bytes.

    Ids that fit are unchanged from earlier releases, and a longer one never started a child,
    so no recorded run changes its ids."""
    child = f"{parent}/{segment}"
    if run_id_fits(child):
        return child
    root = parent.split("/", 1)[0]
    return f"{root}/{hashlib.sha256(child.encode('utf-8', 'surrogatepass')).hexdigest()[:32]}"


def with_suffix(run_id: str, suffix: str) -> str:
    """``run_id + suffix``, the id cut (at a character) so that the whole fits: a fork of a run
    whose id is nearly 1,000 bytes is still a run of its own."""
    room = MAX_RUN_ID_BYTES - len(suffix.encode("utf-8", "surrogatepass"))
    head = run_id.encode("utf-8", "surrogatepass")[: max(room, 0)]
    return head.decode("utf-8", "ignore") + suffix


def too_long(run_id: str) -> str:
    """Why a child run with ``run_id`` (which does not fit) cannot start, in words a model
    reads: only a root id of nearly 1,000 bytes leaves no room for ``<root>/<digest>``."""
    root = run_id.split("/", 1)[0]
    size = len(root.encode("utf-8", "surrogatepass"))
    return (
        f"this run's root id is {size} bytes long, which leaves no room for a child run's id "
        f"within Temporal's limit of {MAX_RUN_ID_BYTES} bytes"
    )
