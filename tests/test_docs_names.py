"""Every dotted name the documentation writes in code -- ``relay.x.Name``, ``statecore.x.Name``,
``stores.x.Name`` in inline code and code blocks, and the names of ``from X import A, B`` lines
in code blocks -- resolves: its module imports and the name is found there (a name taken from a
module that declares ``__all__`` is one of its public names)."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
from pathlib import Path
from types import ModuleType

import pytest

from statecore.cli.lifecycles import ENTRY_POINT_GROUP as LIFECYCLES_ENTRY_POINT_GROUP
from statecore.cli.plugin import COMMANDS_GROUP, DOCTOR_GROUP, STORES_GROUP

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
ROOTS = ("relay", "statecore", "stores")

_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})[^\n]*\n(.*?)^[ \t]*\1[ \t]*$", re.MULTILINE | re.DOTALL)
_INLINE = re.compile(r"(`+)(?!`)(.+?)(?<!`)\1(?!`)", re.DOTALL)
# A dotted name starts at a word boundary that is not part of a path, URL or longer name, and
# is never followed by a path separator (relay/web/chat.py is a file, not a name).
# An entry point's ``module:attribute`` is read as ``module.attribute``.
_DOTTED = re.compile(
    r"(?<![\w./\\:-])(?:" + "|".join(ROOTS) + r")(?:\.[A-Za-z_]\w*)+(?::[A-Za-z_]\w*)?"
    r"(?![\w/\\-])"
)
# ``from X import ...`` starting a line (after a ``>>>`` prompt, say) or a quoted command.
_FROM = re.compile(
    r"(?:^[ \t]*(?:(?:>>>|\.\.\.)[ \t]+)?|['\"])from[ \t]+((?:" + "|".join(ROOTS) + r")"
    r"(?:\.\w+)*)[ \t]+import[ \t]+(\([^)]*\)|[^\n#;'\"]+)",
    re.MULTILINE,
)
# A file's name (``relay.py``), not a Python name.
_FILE_SUFFIXES = frozenset({"cfg", "css", "db", "html", "ini", "js", "json", "md", "py", "toml"})
# The entry point groups the packages read: names of groups, not of modules.
ENTRY_POINT_GROUPS = frozenset(
    {STORES_GROUP, DOCTOR_GROUP, COMMANDS_GROUP, LIFECYCLES_ENTRY_POINT_GROUP}
)


def _code(text: str) -> tuple[list[str], list[str]]:
    """A Markdown text's fenced code blocks and its inline code spans (outside the blocks)."""
    blocks = [body for _, body in _FENCE.findall(text)]
    prose = _FENCE.sub("", text)
    spans = [body for _, body in _INLINE.findall(prose)]
    return blocks, spans


def _from_imports(block: str) -> list[str]:
    """The dotted names ``from X import A, B`` lines bring in (``X.A``, ``X.B``): read by the
    parser when the block is Python, line by line otherwise (a shell session, a fragment)."""
    try:
        tree = ast.parse(block)
    except SyntaxError:
        names: list[str] = []
        for module, imported in _FROM.findall(block):
            for item in imported.strip("() \t\n").split(","):
                name = item.split(" as ")[0].strip()
                if name and name != "*":
                    names.append(f"{module}.{name}")
        return names
    return [
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None
        if node.module.split(".")[0] in ROOTS
        for alias in node.names
        if alias.name != "*"
    ]


def _written(page: Path) -> list[str]:
    """Every dotted name of the project that ``page`` writes in code, once, in order."""
    blocks, spans = _code(page.read_text(encoding="utf-8"))
    found: list[str] = []
    for code in (*blocks, *spans):
        found.extend(name.replace(":", ".") for name in _DOTTED.findall(code))
    for block in blocks:
        found.extend(_from_imports(block))
    return [name for name in dict.fromkeys(found) if name.rpartition(".")[2] not in _FILE_SUFFIXES]


def _resolve(dotted: str) -> str | None:
    """None when ``dotted`` names a module or an object in one, or else an entry point group
    the packages read (``statecore.stores``); otherwise why it does not."""
    why = _lookup(dotted)
    return None if why is not None and dotted in ENTRY_POINT_GROUPS else why


def _lookup(dotted: str) -> str | None:
    """None when ``dotted`` names a module or an object in one, else why it does not."""
    parts = dotted.split(".")
    obj: object = importlib.import_module(parts[0])
    for depth, part in enumerate(parts[1:], start=2):
        if isinstance(obj, ModuleType):
            path = ".".join(parts[:depth])
            public = getattr(obj, "__all__", None)
            if isinstance(getattr(obj, part, None), ModuleType) or (
                not hasattr(obj, part) and importlib.util.find_spec(path) is not None
            ):
                obj = importlib.import_module(path)
                continue
            if not hasattr(obj, part):
                return f"{obj.__name__} has no {part!r}"
            dunder = part.startswith("__") and part.endswith("__")  # __version__, __file__
            if public is not None and part not in public and not dunder:
                return f"{part!r} is not in {obj.__name__}.__all__"
        elif not hasattr(obj, part):
            return f"{'.'.join(parts[: depth - 1])} has no attribute {part!r}"
        obj = getattr(obj, part)
    return None


def test_the_scanner_finds_names_and_skips_paths(tmp_path: Path) -> None:
    """The scanner reads names from inline code, code blocks and import lines, and leaves file
    paths, URLs and longer words alone."""
    text = (
        "Use `relay.web.WebServer(apps)` and `relay/web/chat.py`, `tests/relay.x`, `relay.py`,\n"
        "`https://statecore.example/a`, `mystores.x`, `statecore.stores` (a group),\n"
        "`relay.lifecycles:RELAY_LIFECYCLES` and `relay.web.chat`; not in code: relay.nowhere.\n\n"
        "```python\nfrom statecore.gateway import Turn, Gateway as G\n```\n\n"
        "```console\n$ python -c 'from stores import (SQLiteStore, open_store)'\n"
        ">>> from relay import Connector\n```\n"
    )
    page = tmp_path / "page.md"
    page.write_text(text, encoding="utf-8")
    assert sorted(_written(page)) == [
        "relay.Connector",
        "relay.lifecycles.RELAY_LIFECYCLES",
        "relay.web.WebServer",
        "relay.web.chat",
        "statecore.gateway",
        "statecore.gateway.Gateway",
        "statecore.gateway.Turn",
        "statecore.stores",
        "stores.SQLiteStore",
        "stores.open_store",
    ]


def test_the_resolver_refuses_what_does_not_exist() -> None:
    """A missing module, a missing name, a name outside a module's __all__ and a missing
    attribute are each reported; modules, public names and their attributes resolve."""
    assert _resolve("relay.web.chat") is None
    assert _resolve("statecore.doctor") is None  # an entry point group
    assert _resolve("statecore.Ledger") is None
    assert _resolve("statecore.gateway.Turn") is None
    assert _resolve("relay.web.chat.WebChatPlatform.perform") is None
    assert _resolve("relay.nowhere") == "relay has no 'nowhere'"
    assert _resolve("statecore.NoSuchName") == "statecore has no 'NoSuchName'"
    assert _resolve("relay.web.chat.log") == "'log' is not in relay.web.chat.__all__"
    assert _resolve("statecore.Ledger.nothing") == "statecore.Ledger has no attribute 'nothing'"


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_documented_name_resolves(page: Path) -> None:
    """Every relay., statecore. and stores. name the page writes in code imports and resolves."""
    names = _written(page)
    unresolved = {name: why for name in names if (why := _resolve(name)) is not None}
    assert unresolved == {}, f"{page.relative_to(ROOT)}: names that do not resolve"


def test_the_documentation_writes_names_to_check() -> None:
    """The pages do write dotted names in code (a scanner that finds none checks nothing)."""
    written = {name for page in PAGES for name in _written(page)}
    assert "relay.web.WebChatPlatform" in written
    assert len(written) > 20
