"""The import arrows between the packages point one way, and a test says so: the kernel imports
no chat runtime, no store, no wire and no I/O library; the wire imports neither side of the
relay nor a socket library; the relay's client and connector sides do not import each other."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def imported(module_dir: Path, *, recursive: bool = True) -> dict[str, set[str]]:
    """Every module a package's files import (absolute names, as written), by file; only the
    package's own files (not its subpackages') unless ``recursive``."""
    found: dict[str, set[str]] = {}
    paths = module_dir.rglob("*.py") if recursive else module_dir.glob("*.py")
    for path in sorted(paths):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                names.add(node.module)
        found[str(path.relative_to(ROOT))] = names
    return found


DRIVERS = ("matrix", "slack", "discord", "telegram")
"""The platform drivers' packages (relay/<name>): none imports another."""

RULES: list[tuple[str, tuple[str, ...]]] = [
    ("statecore", ("relay", "stores", "sqlite3", "websockets")),
    ("statecore/gateway", ("relay", "stores", "sqlite3", "websockets")),
    ("stores", ("relay", "websockets")),
    (
        "relay/wire",
        ("relay.client", "relay.connector", "statecore.gateway.runtime", "websockets", "stores"),
    ),
    ("relay/client", ("relay.connector", "stores")),
    ("relay/connector", ("relay.client", "statecore.gateway")),
    ("relay/web", ("relay.client",)),
    # A platform driver: the connector's driver protocol and the wire, never the gateway side,
    # another driver, or the connector's server itself.
    *(
        (
            f"relay/{driver}",
            (
                "relay.client",
                "relay.web",
                "relay.connector.server",
                "statecore.gateway",
                "stores",
                "websockets",
                *(f"relay.{other}" for other in DRIVERS if other != driver),
            ),
        )
        for driver in DRIVERS
    ),
]


@pytest.mark.parametrize(("package", "forbidden"), RULES, ids=[r[0] for r in RULES])
def test_no_import_points_back_up_the_layers(package: str, forbidden: tuple[str, ...]) -> None:
    """No module of ``package`` imports a package below it in the layering (or a library it
    must not depend on)."""
    offenders = [
        f"{path} imports {name}"
        for path, names in imported(ROOT / package).items()
        for name in sorted(names)
        if any(name == f or name.startswith(f + ".") for f in forbidden)
    ]
    assert offenders == []


def test_the_kernel_knows_no_chat() -> None:
    """The kernel's own modules never import the chat runtime (statecore.gateway) built on it."""
    offenders = [
        f"{path} imports {name}"
        for path, names in imported(ROOT / "statecore", recursive=False).items()
        for name in sorted(names)
        if name == "statecore.gateway" or name.startswith("statecore.gateway.")
    ]
    assert offenders == []


def test_the_rules_see_every_module() -> None:
    """The checker reads real modules (a typo in a path would make every rule pass vacuously)."""
    for package, _ in RULES:
        assert imported(ROOT / package), package


PACKAGES = ("statecore", "stores", "relay")
MODULE_LINES_MAX = 640
"""Modules stay near 600 lines (with a little slack): past that, a module does too much."""
CLASS_LINES_MAX = 300
CLASS_WHY = "is long because"
"""A class over CLASS_LINES_MAX lines must say why in its docstring, with these words."""


def _project_modules() -> dict[str, Path]:
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            name = ".".join(path.relative_to(ROOT).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


def _internal_imports(modules: dict[str, Path]) -> dict[str, set[str]]:
    """Each project module's imports of other project modules, ``TYPE_CHECKING`` ones
    included (a cycle drawn only for the type checker is still a cycle of concepts)."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            targets: list[str] = []
            if isinstance(node, ast.ImportFrom) and node.module and not node.level:
                targets.append(node.module)
                targets.extend(f"{node.module}.{alias.name}" for alias in node.names)
            elif isinstance(node, ast.Import):
                targets.extend(alias.name for alias in node.names)
            graph[name].update(t for t in targets if t in modules and t != name)
    return graph


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root, edges in graph.items():
        if root in index:
            continue
        work: list[tuple[str, list[str]]] = [(root, sorted(edges))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, pending = work[-1]
            if pending:
                nxt = pending.pop()
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, sorted(graph[nxt])))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component: list[str] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    """The check below can fail: a two-module loop and a three-module loop are found."""
    graph = {"a": {"b"}, "b": {"a"}, "c": {"d"}, "d": {"e"}, "e": {"c"}, "f": set()}
    assert sorted(_cycles(graph)) == [["a", "b"], ["c", "d", "e"]]


def test_no_module_imports_a_module_that_imports_it() -> None:
    """Import arrows between modules point one way, type-checking imports included."""
    assert _cycles(_internal_imports(_project_modules())) == []


def test_modules_stay_near_six_hundred_lines() -> None:
    """No module grows past the bound (split it by concept instead)."""
    too_long = {
        name: n
        for name, path in _project_modules().items()
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MODULE_LINES_MAX
    }
    assert too_long == {}


def test_long_classes_say_why() -> None:
    """A class past the bound says in its docstring why it is long."""
    unexplained: dict[str, int] = {}
    for name, path in _project_modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.ClassDef) or node.end_lineno is None:
                continue
            size = node.end_lineno - node.lineno + 1
            doc = ast.get_docstring(node) or ""
            if size > CLASS_LINES_MAX and CLASS_WHY not in " ".join(doc.split()):
                unexplained[f"{name}.{node.name}"] = size
    assert unexplained == {}


def test_the_tests_mirror_the_packages() -> None:
    """Each folder of tests names a package (tests/relay/client tests relay.client, ...), apart
    from golden files, the relay's conformance suite against original-contract peers, and the
    fault harness of the whole system (tests/chaos: every package at once, as real processes)."""
    outside = {"golden", "conformance", "chaos", "__pycache__"}
    strays = [
        str(folder.relative_to(ROOT))
        for folder in (ROOT / "tests").rglob("*")
        if folder.is_dir()
        and not outside.intersection(folder.relative_to(ROOT / "tests").parts)
        and not (ROOT / folder.relative_to(ROOT / "tests")).is_dir()
    ]
    assert strays == []


def test_test_modules_never_import_each_other() -> None:
    """Shared helpers live in fixture modules and conftest, never in another test module."""
    offenders: dict[str, list[str]] = {}
    for folder in sorted({path.parent for path in (ROOT / "tests").rglob("test_*.py")}):
        for module, names in imported(folder, recursive=False).items():
            tests = sorted(n for n in names if n.startswith("tests.") and "test_" in n)
            if tests:
                offenders[module] = tests
    assert offenders == {}
