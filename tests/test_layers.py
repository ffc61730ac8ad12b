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
