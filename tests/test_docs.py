"""The documentation is checked against the code: every Python block runs, the tutorial program
runs and its page quotes it exactly, the lifecycle page is what the generator makes from the
declarations, the store guide's contract example passes the contract, and the configuration
reference lists every option with its current default."""

from __future__ import annotations

import importlib.util
import inspect
import io
import re
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import attrs
import pytest

if "stores.testing" not in sys.modules:  # detailed assertion messages from the kit's asserts
    pytest.register_assert_rewrite("stores.testing")

from relay.client.adapter import RelayAdapter
from relay.client.teardown import DISCONNECT_TIMEOUT_ENV
from relay.client.transport import WebSocketRelayTransport
from relay.connector.server import Connector
from statecore import Audit, LedgerPolicy
from statecore.cli import main as statecore_cli
from statecore.gateway import Gateway
from stores import SQLiteStore
from stores.testing import TICKET_KIND

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
README = ROOT / "README.md"
TIMEOUT_S = 60.0

_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)


def _blocks(path: Path, language: str = "python") -> list[str]:
    """The fenced code blocks of ``language`` in a Markdown file, in order."""
    text = path.read_text(encoding="utf-8")
    return [body for lang, body in _FENCE.findall(text) if lang == language]


def _load(path: Path) -> ModuleType:
    """Import a file of docs/ as a module (docs/ is not a package)."""
    spec = importlib.util.spec_from_file_location(f"docs_{path.stem}", path)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _run(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        check=False,
    )


# -- the contract example of docs/stores.md runs here, as part of the suite ----------------------

_contract_example = _load(DOCS / "contract_example.py")
TestContractExample = _contract_example.TestCountingStore


def test_stores_doc_quotes_the_contract_example_exactly() -> None:
    """docs/stores.md shows docs/contract_example.py verbatim (the file the suite runs)."""
    source = (DOCS / "contract_example.py").read_text(encoding="utf-8")
    assert source in _blocks(DOCS / "stores.md")


def test_contract_example_counts_guarded_writes() -> None:
    """The example store counts the guarded writes that matched, and only those."""
    store = _contract_example.CountingStore()
    store.register(TICKET_KIND)
    store.insert(TICKET_KIND, "t1", {"title": "t"}, event="file", audit=Audit(1.0))
    store.transition(TICKET_KIND, "t1", "hold", audit=Audit(2.0))
    with pytest.raises(ValueError, match="not allowed"):
        store.transition(TICKET_KIND, "t1", "hold", audit=Audit(3.0))
    assert store.transition_many(TICKET_KIND, ["t1", "t2"], "resume", audit=Audit(4.0))
    assert dict(store.writes) == {"hold": 1, "resume": 1}
    store.close()


# -- README ----------------------------------------------------------------------------------------


def test_readme_starts_with_the_two_commands() -> None:
    """The README's first section is the two commands, make demo and make test, before anything
    else."""
    lines = README.read_text(encoding="utf-8").splitlines()
    assert lines[0] == "# statecore"
    first = next(i for i, line in enumerate(lines) if line.strip())
    body = [line for line in lines[first + 1 :] if line.strip()]
    assert body[0] == "```sh"
    assert body[1].startswith("make demo ")
    assert body[2].startswith("make test ")
    assert body[3] == "```"


def test_readme_names_every_benchmark() -> None:
    """Every benchmark script is described in the README's benchmarks section."""
    readme = README.read_text(encoding="utf-8")
    section = readme[readme.index("## Benchmarks") :]
    for script in sorted((ROOT / "benchmarks").glob("bench_*.py")):
        assert f"`{script.name}`" in section, f"{script.name} is not described in the README"


# -- every Python block runs -----------------------------------------------------------------------

_RUNNABLE = [README, *(DOCS / n for n in ("guarantees.md", "stores.md", "configuration.md"))]
_RUNNABLE.append(DOCS / "lifecycles.md")
_RUNNABLE.append(DOCS / "timers.md")
_RUNNABLE.append(DOCS / "tracing.md")
_BLOCKS = [
    pytest.param(block, id=f"{path.name}-{index}")
    for path in _RUNNABLE
    for index, block in enumerate(_blocks(path))
]


@pytest.mark.parametrize("block", _BLOCKS)
def test_python_block_runs(block: str, tmp_path: Path) -> None:
    """A Python block of the README or of a docs page runs as a script, as printed."""
    script = tmp_path / "block.py"
    script.write_text(block, encoding="utf-8")
    done = _run([str(script)], tmp_path)
    assert done.returncode == 0, f"{done.stdout}\n{done.stderr}"


def test_readme_bot_prints_its_reply(tmp_path: Path) -> None:
    """The README's minimal bot answers the user's message."""
    [bot] = [b for b in _blocks(README) if "Gateway(" in b]
    (tmp_path / "bot.py").write_text(bot, encoding="utf-8")
    done = _run(["bot.py"], tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "['you said: hello']"


# -- the tutorial --------------------------------------------------------------------------------


def test_tutorial_blocks_are_exact_excerpts_of_the_program() -> None:
    """Every Python block of docs/tutorial.md is an exact excerpt of docs/tutorial_bot.py."""
    program = (DOCS / "tutorial_bot.py").read_text(encoding="utf-8")
    blocks = _blocks(DOCS / "tutorial.md")
    assert len(blocks) >= 8
    for block in blocks:
        assert block in program, f"not in tutorial_bot.py:\n{block}"


def test_tutorial_program_runs(tmp_path: Path) -> None:
    """The tutorial bot answers, survives a SIGKILL mid-reply with a labelled redelivery, answers
    what was buffered while it slept, and loses nothing."""
    done = _run([str(DOCS / "tutorial_bot.py"), str(tmp_path)], ROOT)
    out = done.stdout
    assert done.returncode == 0, f"{out}\n{done.stderr}"
    assert "[chat] bot: you said: hello" in out
    assert "[bot process] exited with -9" in out
    assert "[bot] restarted" in out
    assert "Recovered reply (this may repeat a message you already received)" in out
    assert "[ledger] claim    attempting -> attempting" in out
    assert "[connector] buffered for the sleeping bot: 2" in out
    assert "[chat] bot: you said: and another" in out
    assert out.rstrip().endswith(
        "summary: messages 4, replies 4, labelled 1, lost 0, owed 0, abandoned 0"
    )


# -- lifecycles ----------------------------------------------------------------------------------


def test_lifecycles_doc_is_the_generators_output() -> None:
    """docs/lifecycles.md is exactly what docs/generate_lifecycles.py makes from the declarations
    (regenerate with ``python docs/generate_lifecycles.py --write``)."""
    generator = _load(DOCS / "generate_lifecycles.py")
    committed = (DOCS / "lifecycles.md").read_text(encoding="utf-8")
    assert committed == generator.render()


def test_lifecycles_doc_shows_what_the_cli_prints() -> None:
    """Every lifecycle ``statecore lifecycles`` lists is in the doc, with the very diagram the
    command prints."""
    generator = _load(DOCS / "generate_lifecycles.py")
    committed = (DOCS / "lifecycles.md").read_text(encoding="utf-8")
    names = [lc.name for lc in generator.own_lifecycles()]
    assert {"obligation", "transport", "session", "delegation", "buffer", "dedupe"} <= set(names)
    for name in names:
        out = io.StringIO()
        assert statecore_cli(["lifecycles", "--format", "mermaid", name], out=out) == 0
        assert f"## {name}\n" in committed
        assert f"```mermaid\n{out.getvalue()}```" in committed


# -- configuration reference ---------------------------------------------------------------------


def _row(name: str, default: Any) -> str:
    shown = "(required)" if default is inspect.Parameter.empty else f"`{default!r}`"
    return f"| `{name}` | {shown} |"


@pytest.mark.parametrize(
    "component", [WebSocketRelayTransport, Connector, Gateway, RelayAdapter, SQLiteStore]
)
def test_configuration_lists_every_option_with_its_default(component: type) -> None:
    """Every keyword option of the component is in docs/configuration.md with its current
    default."""
    doc = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for name, parameter in inspect.signature(component).parameters.items():
        if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
            continue
        assert _row(name, parameter.default) in doc, f"{component.__name__}({name}=...)"


def test_configuration_lists_every_policy_field_with_its_default() -> None:
    """Every LedgerPolicy field is in docs/configuration.md with its current default."""
    doc = (DOCS / "configuration.md").read_text(encoding="utf-8")
    for field in attrs.fields(LedgerPolicy):
        assert _row(field.name, field.default) in doc, f"LedgerPolicy.{field.name}"


def test_configuration_names_the_environment_variable_and_every_logger() -> None:
    """The environment variable and every logger the packages create are documented."""
    doc = (DOCS / "configuration.md").read_text(encoding="utf-8")
    assert f"`{DISCONNECT_TIMEOUT_ENV}`" in doc
    for package in ("statecore", "stores", "relay"):
        for module in sorted((ROOT / package).glob("*.py")):
            if "getLogger(__name__)" in module.read_text(encoding="utf-8"):
                assert f"`{package}.{module.stem}`" in doc, f"logger {package}.{module.stem}"


# -- links ----------------------------------------------------------------------------------------

_LINK = re.compile(r"\]\(([^)\s]+)\)")


def _anchors(path: Path) -> set[str]:
    """The heading anchors of a Markdown file (lower case, punctuation dropped, spaces to -)."""
    text = _FENCE.sub("", path.read_text(encoding="utf-8"))
    headings = re.findall(r"^#+ (.+)$", text, re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-") for h in headings}


@pytest.mark.parametrize("page", [README, *sorted(DOCS.glob("*.md"))], ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    """Every relative link of the page names an existing file (and an existing heading)."""
    text = _FENCE.sub("", page.read_text(encoding="utf-8"))
    for target in _LINK.findall(text):
        if "://" in target:
            continue
        file_part, _, anchor = target.partition("#")
        linked = (page.parent / file_part).resolve() if file_part else page
        assert linked.exists(), f"{page.name}: {target}"
        if anchor:
            assert anchor in _anchors(linked), f"{page.name}: {target}"
