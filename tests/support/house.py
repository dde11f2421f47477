"""The runtime's house, read from its source: rooms (packages), arrows up, arrows across, import
circles and files over the length bound. Standard library only, so it reads any checkout:

    python3 tests/support/house.py [RUNTIME_CALQUE_DIR]     (``scripts/house`` runs it on this checkout)

Every import counts: at module level, inside a function (a lazy import still ties two modules) and
under ``if TYPE_CHECKING:`` (a type is a tie too). A package's ``__init__`` is not counted as imported
by its own modules. ``tests/unit/test_runtime_structure.py`` holds the runtime to what this prints.

The floors, bottom to top: a module may import its own room, the floor files of the rooms it stands in
(``calque/session/wire.py`` from ``calque/session/client/``), and anything on a lower floor. An arrow
up is an import of a higher floor, or of a room above the importer's own (``session/x.py`` importing
``session/client/``); an arrow across is one between sibling rooms (``pool/worker/`` and ``pool/submitter/``).
"""

from __future__ import annotations

import ast
import sys
from dataclasses import dataclass, field
from pathlib import Path

MAX_LINES = 400

# The top-level rooms, bottom to top: each may import only those below it.
FLOORS = (
    "calque",  # the foundation: errors, durations, quantities, configfile, exposition
    "calque.models",
    "calque.packaging",
    "calque.aws",
    "calque.gpu",
    "calque.warm",
    "calque.ledger",
    "calque.pool",
    "calque.run",
    "calque.session",
    "calque.jupyterhub",  # the hub's spawner: a client of the broker and the hosts, as the CLI is
    "calque.ops",
    "calque.cli",
)


def modules_of(root: Path) -> dict[str, Path]:
    """Every module of the ``calque`` package at ``root`` (its directory), by dotted name."""

    def name(path: Path) -> str:
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)

    return {name(p): p for p in sorted(root.rglob("*.py"))}


def _resolve(name: str, modules: dict[str, Path]) -> str | None:
    """The calque module ``name`` is (or, for ``from pkg import name``, lies in)."""
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str, modules: dict[str, Path]) -> set[str]:
    path = modules[module]
    tree = ast.parse(path.read_text(), str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                pkg = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*pkg, base] if base else pkg)
            # ``from pkg import sub`` ties to the submodule; a parent package is not an edge of its own
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        for n in names:
            if n == "calque" or n.startswith("calque."):
                target = _resolve(n, modules)
                if target is not None and target != module:
                    found.add(target)
    return found


def graph_of(modules: dict[str, Path]) -> dict[str, set[str]]:
    return {m: imports_of(m, modules) for m in modules}


def room_of(module: str, modules: dict[str, Path]) -> str:
    return module if modules[module].name == "__init__.py" else module.rpartition(".")[0]


def _floor(room: str) -> int:
    top = ".".join(room.split(".")[:2])
    return FLOORS.index(top) if top in FLOORS else FLOORS.index("calque")


def direction(importer: str, imported: str, modules: dict[str, Path]) -> str:
    """'up', 'across' or 'down' (fine) for an import of ``imported`` by ``importer``."""
    a, b = room_of(importer, modules), room_of(imported, modules)
    if a == b or a.startswith(b + "."):
        return "down"  # its own room, or the floor of a room it stands in
    fa, fb = _floor(a), _floor(b)
    if fa != fb:
        return "up" if fb > fa else "down"
    if b.startswith(a + "."):
        return "up"  # a floor file reaching into a room above it
    return "across"


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles: each strongly connected set of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                on.discard(w)
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                out.append(sorted(group))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


@dataclass
class House:
    rooms: dict[str, int] = field(default_factory=dict)  # room -> its modules
    up: list[tuple[str, str]] = field(default_factory=list)
    across: list[tuple[str, str]] = field(default_factory=list)
    circles: list[list[str]] = field(default_factory=list)
    long: dict[str, int] = field(default_factory=dict)  # file -> lines, over MAX_LINES


def survey(root: Path) -> House:
    modules = modules_of(root)
    graph = graph_of(modules)
    house = House()
    for m in modules:
        room = room_of(m, modules)
        house.rooms[room] = house.rooms.get(room, 0) + 1
    for m, targets in sorted(graph.items()):
        for t in sorted(targets):
            way = direction(m, t, modules)
            if way == "up":
                house.up.append((m, t))
            elif way == "across":
                house.across.append((m, t))
    house.circles = circles(graph)
    for p in modules.values():
        if (n := len(p.read_text().splitlines())) > MAX_LINES:
            house.long[str(p.relative_to(root))] = n
    return house


def report(house: House) -> str:
    lines = [f"rooms: {len(house.rooms)}"]
    lines += [f"  {room}: {n} files" for room, n in sorted(house.rooms.items())]
    lines.append(f"arrows up: {len(house.up)}")
    lines += [f"  {a} -> {b}" for a, b in house.up]
    lines.append(f"arrows across: {len(house.across)}")
    lines += [f"  {a} -> {b}" for a, b in house.across]
    lines.append(f"circles: {len(house.circles)}")
    lines += ["  " + " <-> ".join(c) for c in house.circles]
    lines.append(f"files over {MAX_LINES} lines: {len(house.long)}")
    lines += [f"  {f}: {n}" for f, n in sorted(house.long.items())]
    return "\n".join(lines)


if __name__ == "__main__":
    here = Path(__file__).resolve().parents[2] / "runtime" / "calque"
    print(report(survey(Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else here)))
