"""Each part of a run's state has one writer: the module ``STATE_WRITERS`` names for it.

Read from the code of ``relaykit/workflows/``: every assignment, augmented assignment, deletion
and mutating call (``append``, ``pop``, ``clear``, …) whose target is a part of the run state, also
through a local name bound to that part (``guard = state.repeats``; ``for task in
state.tasks.values()``), is attributed to its module. A module that writes a part it does not own
fails this test; so does a part nobody writes, which would mean the table is stale.
"""

from __future__ import annotations

import ast
from pathlib import Path

from relaykit.runs import RunState
from relaykit.workflows.run_state import STATE_WRITERS

WORKFLOWS = Path(__file__).resolve().parent.parent / "relaykit" / "workflows"
MUTATORS = {
    "append",
    "extend",
    "insert",
    "pop",
    "popitem",
    "remove",
    "clear",
    "update",
    "setdefault",
}
STATE = "<state>"


class Writes(ast.NodeVisitor):
    """The parts of the run state one module writes."""

    def __init__(self) -> None:
        self.parts: set[str] = set()
        self.aliases: list[dict[str, str]] = [{}]

    # --- what an expression refers to -----------------------------------------------------------

    def resolve(self, node: ast.expr) -> str | None:
        """``<state>`` for the run state itself, a part's name for (something inside) a part."""
        if isinstance(node, ast.Name):
            return self.aliases[-1].get(node.id)
        if isinstance(node, ast.Attribute):
            if node.attr == "state" and not isinstance(node.value, ast.Name | ast.Attribute):
                return None
            if node.attr == "state":
                base = self.resolve(node.value)
                return STATE if base is None or base == STATE else base
            base = self.resolve(node.value)
            if base == STATE:
                return node.attr if node.attr in RunState.model_fields else None
            return base
        if isinstance(node, ast.Subscript):
            return self.resolve(node.value)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("get", "values", "setdefault"):  # an element of a part
                base = self.resolve(node.func.value)
                return base if base != STATE else None
        return None

    def written(self, target: ast.expr) -> None:
        part = self.resolve(target)
        if part is not None and part != STATE:
            self.parts.add(part)

    # --- functions, bindings, writes ------------------------------------------------------------

    def visit_FunctionDef(self, node: ast.FunctionDef | ast.AsyncFunctionDef) -> None:
        scope = {a.arg: STATE for a in node.args.args if a.arg == "state"}
        self.aliases.append(scope)
        self.generic_visit(node)
        self.aliases.pop()

    visit_AsyncFunctionDef = visit_FunctionDef  # type: ignore[assignment]

    def bind(self, target: ast.expr, value: ast.expr | None) -> None:
        if isinstance(target, ast.Name):
            bound = self.resolve(value) if value is not None else None
            if bound is None:
                self.aliases[-1].pop(target.id, None)
            else:
                self.aliases[-1][target.id] = bound
        elif isinstance(target, ast.Tuple) and isinstance(value, ast.Tuple):
            for one, other in zip(target.elts, value.elts, strict=False):
                self.bind(one, other)
        else:
            self.written(target)

    def visit_Assign(self, node: ast.Assign) -> None:
        self.generic_visit(node)
        for target in node.targets:
            self.bind(target, node.value)

    def visit_AnnAssign(self, node: ast.AnnAssign) -> None:
        self.generic_visit(node)
        self.bind(node.target, node.value)

    def visit_AugAssign(self, node: ast.AugAssign) -> None:
        self.generic_visit(node)
        self.written(node.target)

    def visit_Delete(self, node: ast.Delete) -> None:
        for target in node.targets:
            self.written(target)

    def visit_For(self, node: ast.For) -> None:
        self.bind(node.target, node.iter)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        self.generic_visit(node)
        if isinstance(node.func, ast.Attribute) and node.func.attr in MUTATORS:
            self.written(node.func.value)


def writers() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in sorted(WORKFLOWS.glob("*.py")):
        visitor = Writes()
        visitor.visit(ast.parse(path.read_text()))
        for part in visitor.parts:
            found.setdefault(part, set()).add(path.stem)
    return found


def test_every_part_of_the_run_state_has_one_writer_and_the_table_names_it() -> None:
    assert set(STATE_WRITERS) == set(RunState.model_fields)
    found = writers()
    wrong = {
        part: sorted(modules - {STATE_WRITERS[part]})
        for part, modules in found.items()
        if modules - {STATE_WRITERS[part]}
    }
    assert wrong == {}, f"parts written outside their writer: {wrong}"
    # no stale entry: each part is written where the table says, but for what long_runs writes
    # on the copy a continue-as-new carries (never the running state)
    unwritten = {part for part in STATE_WRITERS if part not in found}
    assert unwritten == {p for p, w in STATE_WRITERS.items() if w == "long_runs"}


def test_the_reader_of_the_code_sees_writes_through_aliases_and_elements() -> None:
    # the scan itself: a write through each form it must see is found (it cannot pass blind)
    code = """
def f(run, state):
    run.state.turn += 1
    guard = state.repeats
    guard.calls["k"] = 1
    for task in self.run.state.tasks.values():
        task.status = "x"
    self.state.mailbox.append("m")
    copy = run.state.model_copy()
    copy.runs += 1
"""
    visitor = Writes()
    visitor.visit(ast.parse(code))
    assert visitor.parts == {"turn", "repeats", "tasks", "mailbox"}
