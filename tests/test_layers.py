"""The house's floors: every import of orchestrator/ runs down (or stays in its room), no two
rooms import each other, and workers/provider/ has no import circle. Read from the source
(ast), so a new import that runs back up fails here, with the line that does it."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# orchestrator's rooms, lowest floor first; rooms in one tuple share a floor. A room may
# import its own floor's rooms and those below, never one above.
FLOORS: list[tuple[str, ...]] = [
    ("errors", "exit_codes", "process"),
    ("run",),
    ("coordination",),
    ("config",),
    ("intake",),
    ("broker",),
    ("steps",),
    ("plan",),
    ("people",),
    ("submission",),
    ("web", "evaluation"),
    ("cli",),
    ("celery",),
]
# Folders of orchestrator/ that are a workspace's files (tools a team writes), not rooms.
NOT_ROOMS = {"demo", "minimal"}

# (importer, imported module) -> why the import runs up. Each is a lazy import (inside a
# function) with a comment at the import that says why.
UPWARD: dict[tuple[str, str], str] = {
    ("orchestrator.broker.worker_processes", "orchestrator.plan.tasks"): (
        "the fleet registers the graph's tasks on the app before it forks; the tasks are "
        "built on the steps, which sit above the broker"
    ),
}
# workers/provider/ module -> module imports that close a circle, and why.
PROVIDER_CIRCLES: dict[tuple[str, str], str] = {
    ("workers.provider.options", "workers.provider.server"): (
        "the command's callback starts the server it declares the options of; lazy, so "
        "`ticketgraph --help` does not import the server"
    ),
    ("workers.provider.options", "workers.provider.recorder"): (
        "`provider --record` starts the recording proxy it declares the options of; lazy, "
        "so `ticketgraph --help` does not import it"
    ),
}


def _module(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _type_checking_only(tree: ast.AST) -> set[int]:
    """Line numbers of imports under `if TYPE_CHECKING:` (types only: nothing runs)."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for inner in node.body:
                for sub in ast.walk(inner):
                    if isinstance(sub, ast.Import | ast.ImportFrom):
                        lines.add(sub.lineno)
    return lines


def _lazy(tree: ast.AST) -> set[int]:
    """Line numbers of imports inside a function."""
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for sub in ast.walk(node):
                if isinstance(sub, ast.Import | ast.ImportFrom):
                    lines.add(sub.lineno)
    return lines


def imports(package: str) -> Iterator[tuple[str, str, int, bool]]:
    """(importer, imported module, line, lazy) for every import of `package` by its own
    modules, at run time (not under TYPE_CHECKING). `from a import b` names a.b when b is
    a module, else a."""
    for path in sorted((REPO / package).rglob("*.py")):
        tree = ast.parse(path.read_text(), str(path))
        typing_only, lazy = _type_checking_only(tree), _lazy(tree)
        for node in ast.walk(tree):
            if node.lineno in typing_only if hasattr(node, "lineno") else True:
                continue
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets = [_submodule(node.module, a.name) for a in node.names]
            else:
                continue
            for target in targets:
                yield _module(path), target, node.lineno, node.lineno in lazy


def _submodule(module: str, name: str) -> str:
    base = REPO / Path(*module.split("."))
    if (base / f"{name}.py").exists() or (base / name / "__init__.py").exists():
        return f"{module}.{name}"
    return module


def room(module: str) -> str | None:
    """The orchestrator room a module lives in (None: not a room of orchestrator)."""
    parts = module.split(".")
    if parts[0] != "orchestrator" or len(parts) < 2 or parts[1] in NOT_ROOMS:
        return None
    return parts[1]


def floor(name: str) -> int:
    return next(i for i, rooms in enumerate(FLOORS) if name in rooms)


def upward(package: str = "orchestrator") -> dict[tuple[str, str], int]:
    """(importer, imported) -> line, for every import that runs up the floors."""
    found = {}
    for importer, imported, line, _ in imports(package):
        a, b = room(importer), room(imported)
        if a and b and a != b and floor(b) > floor(a):
            found[(importer, imported)] = line
    return found


def test_every_room_of_orchestrator_has_a_floor() -> None:
    rooms = {p.parent.name for p in (REPO / "orchestrator").glob("*/__init__.py")}
    rooms |= {p.stem for p in (REPO / "orchestrator").glob("*.py") if p.stem != "__init__"}
    placed = {name for names in FLOORS for name in names}
    assert rooms - NOT_ROOMS - {"__main__"} == placed


def test_no_import_runs_back_up_the_floors() -> None:
    found = upward()
    unexplained = {pair: line for pair, line in found.items() if pair not in UPWARD}
    assert not unexplained, f"imports that run up the floors (importer, imported): {unexplained}"
    assert set(UPWARD) <= set(found), "an exception no longer needed: remove it from UPWARD"


def test_each_upward_import_is_lazy_and_says_why_at_the_import() -> None:
    lazy = {(a, b): (line, is_lazy) for a, b, line, is_lazy in imports("orchestrator")}
    for (importer, imported), why in UPWARD.items():
        line, is_lazy = lazy[(importer, imported)]
        assert is_lazy, f"{importer} imports {imported} at load time ({why})"
        source = (REPO / Path(*importer.split("."))).with_suffix(".py").read_text()
        at = source.splitlines()[line - 2 : line]
        assert any("#" in text for text in at), f"{importer}:{line} says not why it runs up"


def test_no_two_rooms_import_each_other() -> None:
    pairs = set()
    for importer, imported, _, _ in imports("orchestrator"):
        a, b = room(importer), room(imported)
        if a and b and a != b and (importer, imported) not in UPWARD:
            pairs.add((a, b))
    assert not {(a, b) for a, b in pairs if (b, a) in pairs}


def test_the_harness_never_imports_the_graph() -> None:
    assert not [(a, b) for a, b, _, _ in imports("workers") if b.startswith("orchestrator")]


def _circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every import circle among `edges` (module -> modules), each once."""
    circles: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == path[0]:
                if path[0] == min(path):
                    circles.append([*path, nxt])
            elif nxt not in path:
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return circles


def test_workers_provider_has_no_import_circle() -> None:
    edges: dict[str, set[str]] = {}
    for importer, imported, _, _ in imports("workers/provider"):
        inside = imported.startswith("workers.provider.") and importer != imported
        if inside and (importer, imported) not in PROVIDER_CIRCLES:
            edges.setdefault(importer, set()).add(imported)
    assert _circles(edges) == []


def test_the_checks_see_an_import_that_runs_up_and_a_circle() -> None:
    """The detectors themselves: a circle is found, and a room's import of a room above is
    an upward one (so the tests above can fail)."""
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == [["a", "b", "c", "a"]]
    assert floor("run") < floor("plan")
    assert room("orchestrator.run.store") == "run" and room("orchestrator.demo.x") is None
    assert any(b.startswith("orchestrator.run") for a, b, _, _ in imports("orchestrator/plan"))
