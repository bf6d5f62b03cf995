"""Who took an operator action: the name every approval, steer, message, pause, resume, budget
change, fork and cancel carries into a run's history and events.

A name is what the caller says it is (``by=``, the CLI's ``--as``), or this machine's user when
nothing is said: relaykit does not authenticate people, it records the name the client gives, so
whoever may signal a run may also name themselves. A service in front of relaykit (the console)
passes the signed-in person's name.

Signals and updates carry the name as an extra, optional argument after their old ones (the
``steer``, ``send_message`` and ``send_message_signal`` text, ``resume``'s text, nothing for
``pause``), or as a field of their payload model (``ApprovalDecision.by``, ``BudgetChange.by``),
so old clients' calls still work (no name) and a new client's call to an old worker still acts
(the extra argument is dropped, the extra field ignored). A cancel has no payload: the name goes
in the cancel request's reason (``cancelled by NAME``), which Temporal keeps in the history's
``WorkflowExecutionCancelRequested`` event and hands to the workflow.

Core data: imports nothing of relaykit, and nothing that workflow code may not import.
"""

from __future__ import annotations

from relaykit.errors import RelaykitError

MAX_AUTHOR_LENGTH = 200
"""The longest name kept; longer ones are cut (signals) or refused (updates, the CLI)."""

CANCEL_REASON_PREFIX = "cancelled by "
"""How :func:`cancel_reason` words a cancel request's reason, and what :func:`cancel_author`
reads back."""


class InvalidAuthor(RelaykitError, ValueError):
    """A name that cannot be recorded (longer than :data:`MAX_AUTHOR_LENGTH`)."""


def current_user() -> str:
    """This machine's user name (``getpass``: ``LOGNAME``, ``USER``, … then the password
    database), or ``"unknown"`` where there is none (a container without a user entry)."""
    import getpass

    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user name in this environment
        return "unknown"


def author(by: str | None) -> str:
    """The name to record: ``by`` stripped, or this machine's user when it is ``None`` or
    blank. Raises :class:`InvalidAuthor` for a name longer than :data:`MAX_AUTHOR_LENGTH`."""
    name = (by or "").strip()
    if not name:
        return current_user()
    if len(name) > MAX_AUTHOR_LENGTH:
        raise InvalidAuthor(
            f"a name is at most {MAX_AUTHOR_LENGTH} characters, not {len(name)}",
            hint="give a shorter name with --as / by=",
        )
    return name


def received_author(by: object) -> str:
    """What a workflow records for the name a signal or update brought: a string, cut to
    :data:`MAX_AUTHOR_LENGTH`, else ``""`` (an old client sent none, or sent something else)."""
    return by.strip()[:MAX_AUTHOR_LENGTH] if isinstance(by, str) else ""


def named(by: str) -> dict[str, str]:
    """An operator action's event data: ``{"by": NAME}`` when the action came with a name, else
    nothing (an old client's call, an action of relaykit's own)."""
    return {"by": by} if by else {}


def cancel_reason(by: str) -> str:
    """The reason a cancel request carries so the run's history names who cancelled."""
    return f"{CANCEL_REASON_PREFIX}{by}"


def cancel_author(reason: str | None) -> dict[str, str]:
    """The ``cancelled`` event's data for a cancel request's reason: ``by`` when relaykit worded
    it (:func:`cancel_reason`), else the reason as given (``temporal workflow cancel
    --reason``, a parent run cancelling its child); empty when there was none."""
    if not reason:
        return {}
    if reason.startswith(CANCEL_REASON_PREFIX):
        return {"by": received_author(reason[len(CANCEL_REASON_PREFIX) :])}
    return {"reason": reason[:1_000]}
