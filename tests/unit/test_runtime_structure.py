"""The runtime's shape, read from its source: no import circle, no arrow up or across between rooms
(``tests/support/house.py`` says which way each import goes), the CLI apart from the session daemon,
no file over the length bound. Every import counts, at module level, inside a function (a lazy import
still ties two modules together) and under ``if TYPE_CHECKING:`` (a type is a tie too); a package's
``__init__`` is not counted as imported by its own modules."""

from __future__ import annotations

import ast
from pathlib import Path

import calque
from support import house

ROOT = Path(calque.__file__).resolve().parent
MAX_LINES = house.MAX_LINES
# Files over the bound still to split (issue 40): each may only shrink, and none may join them.
STILL_LONG: dict[str, int] = {}
# The one import between sibling rooms: an elastic host asks its own daemon, through the client every
# caller of the daemon uses, whether a session is live (the client is the daemon's public face).
ACROSS_ALLOWED = {("calque.session.fleet.protect", "calque.session.client.connection")}


MODULES = house.modules_of(ROOT)


def imports_of(module: str) -> set[str]:
    """Every calque module ``module`` imports (tests/support/house.py reads them, as the house report does)."""
    return house.imports_of(module, MODULES)


def _graph() -> dict[str, set[str]]:
    return house.graph_of(MODULES)


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import circle, as the modules along it, or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(m: str) -> list[str] | None:
        state[m] = 1
        stack.append(m)
        for n in sorted(graph.get(m, ())):
            if state.get(n) == 1:
                return [*stack[stack.index(n) :], n]
            if n not in state and (found := visit(n)) is not None:
                return found
        stack.pop()
        state[m] = 2
        return None

    for m in sorted(graph):
        if m not in state and (found := visit(m)) is not None:
            return found
    return None


def _reachable(graph: dict[str, set[str]], start: set[str]) -> set[str]:
    seen, todo = set(start), list(start)
    while todo:
        for n in graph.get(todo.pop(), ()):
            if n not in seen:
                seen.add(n)
                todo.append(n)
    return seen


def test_the_walker_sees_lazy_and_package_imports() -> None:
    # cli/session.py imports the client inside functions; the client package from its __init__
    assert "calque.session.client.verbs" in imports_of("calque.cli.session")
    assert "calque.session.daemon.daemon_process" in imports_of("calque.session.daemon.__main__")


def test_no_import_circle_anywhere_in_the_runtime() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]  # the check itself
    cycle = _cycle(_graph())
    assert cycle is None, "import circle: " + " -> ".join(cycle or [])


def test_the_cli_never_imports_the_session_daemon() -> None:
    graph = _graph()
    cli = {m for m in MODULES if m == "calque.cli" or m.startswith("calque.cli.")}
    reached = _reachable(graph, cli)
    daemon = sorted(m for m in reached if m.startswith("calque.session.daemon"))
    assert daemon == [], f"calque.cli reaches the session daemon: {daemon}"
    client = {m for m in MODULES if m.startswith("calque.session.client")}
    assert not any(m.startswith("calque.session.daemon") for m in _reachable(graph, client))


def test_a_type_checking_import_counts() -> None:
    assert "calque.gpu.nvml_calls" in imports_of("calque.gpu.nvml_sampling")
    sample = {"a": {"b"}, "b": {"a"}, "c": set()}
    assert house.circles(sample) == [["a", "b"]]  # the check itself


def test_no_arrow_up_or_across_between_rooms() -> None:
    modules = house.modules_of(ROOT)
    # the check itself: a floor file reaching into a room above it, a lower floor importing a higher one
    assert house.direction("calque.session.remote", "calque.session.client.wire", {**modules, **_fake()}) == "up"
    assert house.direction("calque.gpu.suggest", "calque.session.wire", modules) == "up"
    assert (
        house.direction("calque.pool.worker.claims", "calque.pool.submitter.submit", {**modules, **_fake()}) == "across"
    )
    assert house.direction("calque.session.client.broker", "calque.session.wire", modules) == "down"
    found = house.survey(ROOT)
    assert found.up == [], "arrows up (move the code down, or hand it data): " + ", ".join(
        f"{a} -> {b}" for a, b in found.up
    )
    across = [e for e in found.across if e not in ACROSS_ALLOWED]
    assert across == [], "imports between sibling rooms: " + ", ".join(f"{a} -> {b}" for a, b in across)
    assert found.circles == []


def _fake() -> dict[str, Path]:
    """Modules the check itself names that the runtime no longer has."""
    return {
        "calque.session.remote": ROOT / "session/remote.py",
        "calque.session.client.wire": ROOT / "session/client/wire.py",
        "calque.pool.worker.claims": ROOT / "pool/worker/claims.py",
        "calque.pool.submitter.submit": ROOT / "pool/submitter/submit.py",
    }


def test_no_runtime_file_is_longer_than_the_bound() -> None:
    long = {
        str(p.relative_to(ROOT)): n for p in ROOT.rglob("*.py") if (n := len(p.read_text().splitlines())) > MAX_LINES
    }
    grown = {f: n for f, n in long.items() if n > STILL_LONG.get(f, MAX_LINES)}
    assert grown == {}, f"files over {MAX_LINES} lines (split them by what they do): {grown}"


# -- doors: botocore behind calque.aws, no private name across packages, operations named as modules ------


def _package_of(module: str) -> str:
    return module if module in MODULES and MODULES[module].name == "__init__.py" else module.rpartition(".")[0]


def _third_party_imports(tree: ast.AST) -> set[str]:
    """Every top-level distribution a source imports, ``if TYPE_CHECKING:`` included (a type is a tie too)."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module.split(".")[0])
    return found


def _private_reaches(module: str, tree: ast.AST) -> list[str]:
    """``_names`` that ``module`` takes from a calque module of another package: imported, or read off an alias."""
    package = _package_of(module)
    offences: list[str] = []
    aliases: dict[str, str] = {}  # local name -> the calque module it is
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name in MODULES and a.asname:
                    aliases[a.asname] = a.name
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("calque"):
            base = node.module or ""
            for a in node.names:
                sub = f"{base}.{a.name}"
                if sub in MODULES:
                    aliases[a.asname or a.name] = sub
                elif a.name.startswith("_") and not a.name.startswith("__") and _package_of(base) != package:
                    offences.append(f"{module} imports {base}.{a.name}")
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id in aliases
            and node.attr.startswith("_")
            and not node.attr.startswith("__")
            and _package_of(aliases[node.value.id]) != package
        ):
            offences.append(f"{module} reads {aliases[node.value.id]}.{node.attr}")
    return offences


def _trees() -> dict[str, ast.AST]:
    return {m: ast.parse(p.read_text(), str(p)) for m, p in MODULES.items()}


def test_botocore_is_imported_only_behind_the_aws_door_and_boto3_nowhere() -> None:
    sample = ast.parse("if TYPE_CHECKING:\n    from botocore.client import BaseClient\nimport boto3.session\n")
    assert _third_party_imports(sample) == {"botocore", "boto3"}  # the check itself
    trees = _trees()
    botocore = sorted(m for m, t in trees.items() if "botocore" in _third_party_imports(t))
    outside = [m for m in botocore if not m.startswith("calque.aws.") and m != "calque.aws"]
    assert outside == [], f"botocore imported outside calque/aws/ (use calque.aws.aws_errors / clients): {outside}"
    boto3 = sorted(m for m, t in trees.items() if "boto3" in _third_party_imports(t))
    assert boto3 == [], f"boto3 imported (calque.aws.clients makes botocore clients; boto3 costs start-up): {boto3}"


def test_no_private_name_is_taken_across_packages() -> None:
    sample = ast.parse(
        "from calque.warm import modal_shim\nfrom calque.aws.aws_errors import _shorten\nmodal_shim._X\n"
    )
    assert _private_reaches("calque.run.script", sample) == [
        "calque.run.script imports calque.aws.aws_errors._shorten",
        "calque.run.script reads calque.warm.modal_shim._X",
    ]  # the check itself
    offences = [o for m, t in _trees().items() for o in _private_reaches(m, t)]
    assert offences == [], f"private names used across packages (make them public, or move the code): {offences}"


def test_every_operation_lives_in_the_file_named_as_its_module() -> None:
    from calque.ops import OPERATIONS

    misnamed = {name: target for name, target in OPERATIONS.items() if target.split(":")[0] != f"calque.ops.{name}"}
    assert misnamed == {}, f"calque.gpu.<name> runs calque.ops.<name>: rename these files {misnamed}"
    collection = ROOT.parents[1] / "collections/ansible_collections/calque/gpu/plugins/modules"
    for module in sorted(collection.glob("*.py")):
        calls = [
            n
            for n in ast.walk(ast.parse(module.read_text()))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "run_op"
        ]
        named = [c.args[1].value for c in calls if len(c.args) > 1 and isinstance(c.args[1], ast.Constant)]
        assert named in ([], [module.stem]), f"{module.name} runs operation {named}, not one of its own name"
    assert (collection / "ec2_cohort.py").is_file()  # the walk found the collection
