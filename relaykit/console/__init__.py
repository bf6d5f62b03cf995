"""The run console (``relaykit console``): which runs wait, for what, since when and at what
cost, and the actions a person takes on them, each recorded with their name.

Built on Temporal's own data, in one process, with no database: the runs list is a page of
:mod:`relaykit.run_list` (:mod:`relaykit.console.listing`), a run's page its queries and its
children's visibility rows (:mod:`relaykit.console.run_view`), actions the client's updates
and signals with the CLI's checks (:mod:`relaykit.console.actions`), people and roles
:mod:`relaykit.console.people`, the HTTP application :mod:`relaykit.console.app` and its pages
:mod:`relaykit.console.pages`. The approvals inbox (:mod:`relaykit.inbox`) is its approvals
view; ``relaykit inbox`` serves the inbox alone. Needs ``relaykit[codec]`` (starlette,
uvicorn) to serve.
"""

from relaykit.console.actions import ActionError, Done, act
from relaykit.console.listing import ConsoleRow, RunFilters, RunsPage, runs_page
from relaykit.console.people import ACTION_ROLES, ROLES, People, Person, Role

__all__ = [
    "ACTION_ROLES",
    "ROLES",
    "ActionError",
    "ConsoleRow",
    "Done",
    "People",
    "Person",
    "Role",
    "RunFilters",
    "RunsPage",
    "act",
    "runs_page",
]
