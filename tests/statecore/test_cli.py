"""Tests for the ``statecore`` command line (statecore.cli)."""

from __future__ import annotations

import io
import json
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from importlib.metadata import entry_points, version
from pathlib import Path
from typing import Any

import pytest

import statecore.cli as cli_module
from relay.client.lifecycle import TRANSPORT
from statecore.cli import all_lifecycles, main
from statecore.cli.lifecycles import lifecycle_json
from statecore.cli.plugin import forwarding
from statecore.lifecycle import Lifecycle
from statecore.lifecycles import DECLARED_LIFECYCLES, OBLIGATION

REPO = Path(__file__).resolve().parents[2]
MERMAID_BLOCK = re.compile(r"```mermaid\n(.*?)```", re.DOTALL)
SUBPROCESS_TIMEOUT = 60


def _run(*argv: str) -> str:
    out = io.StringIO()
    assert main(list(argv), out=out) == 0
    return out.getvalue()


def test_the_kernel_declares_the_obligation_lifecycle() -> None:
    """The kernel's own declaration is the obligation lifecycle (the transport's is the relay
    client's, found through the entry point group)."""
    assert [lc.name for lc in DECLARED_LIFECYCLES] == ["obligation"]


def test_lifecycles_prints_table_and_mermaid_for_each() -> None:
    """'lifecycles' prints each lifecycle's title, transition table and exact mermaid block."""
    text = _run("lifecycles")
    declared = all_lifecycles()
    assert declared[0] is OBLIGATION
    assert TRANSPORT in declared
    for lifecycle in declared:
        assert f"== {lifecycle.name} ==  {lifecycle.description}\n" in text
        assert lifecycle.describe() in text
    assert MERMAID_BLOCK.findall(text) == [lc.to_mermaid() for lc in declared]
    assert text.index("== obligation ==") < text.index("== transport ==")


def test_installed_packages_add_their_lifecycles() -> None:
    """The relay's lifecycles (transport, buffer, dedupe) are found through the entry point
    group."""
    assert {"transport", "buffer", "dedupe"} <= {lc.name for lc in all_lifecycles()}


def test_lifecycles_format_all_is_the_default() -> None:
    """'--format all' prints the same as no --format."""
    assert _run("lifecycles", "--format", "all") == _run("lifecycles")


@pytest.mark.parametrize(
    ("fmt", "render"),
    [
        ("table", lambda lc: lc.describe()),
        ("mermaid", lambda lc: lc.to_mermaid()),
        ("dot", lambda lc: lc.to_dot()),
    ],
)
def test_lifecycles_single_format_prints_only_that_form(
    fmt: str, render: Callable[[Lifecycle[Any]], str]
) -> None:
    """'--format table|mermaid|dot' prints only that rendering of each lifecycle."""
    text = _run("lifecycles", "--format", fmt)
    assert text == "\n".join(render(lc) for lc in all_lifecycles())
    assert "```" not in text
    assert "==" not in text


def test_lifecycles_forms_are_distinct() -> None:
    """Table, mermaid and dot outputs differ and carry their own markers only."""
    table = _run("lifecycles", "--format", "table")
    mermaid = _run("lifecycles", "--format", "mermaid")
    dot = _run("lifecycles", "--format", "dot")
    assert "stateDiagram-v2" in mermaid
    assert "stateDiagram-v2" not in table
    assert "stateDiagram-v2" not in dot
    assert "digraph" in dot
    assert "digraph" not in table
    assert "digraph" not in mermaid


@pytest.mark.parametrize("lifecycle", [OBLIGATION, TRANSPORT], ids=lambda lc: lc.name)
def test_lifecycles_name_filter_prints_only_that_lifecycle(lifecycle: Lifecycle[Any]) -> None:
    """A lifecycle name argument prints only that lifecycle."""
    other: Lifecycle[Any] = TRANSPORT if lifecycle is OBLIGATION else OBLIGATION
    text = _run("lifecycles", lifecycle.name)
    assert f"== {lifecycle.name} ==" in text
    assert f"== {other.name} ==" not in text
    assert other.describe() not in text
    assert MERMAID_BLOCK.findall(text) == [lifecycle.to_mermaid()]
    assert _run("lifecycles", lifecycle.name, "--format", "dot") == lifecycle.to_dot()


def test_lifecycles_names_print_in_argument_order() -> None:
    """Several names print in the order given on the command line."""
    text = _run("lifecycles", "transport", "obligation", "--format", "mermaid")
    assert text == TRANSPORT.to_mermaid() + "\n" + OBLIGATION.to_mermaid()


def test_unknown_lifecycle_exits_2_with_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown lifecycle name is an argparse usage error: SystemExit(2), nothing printed."""
    out = io.StringIO()
    with pytest.raises(SystemExit) as caught:
        main(["lifecycles", "obligation", "nope"], out=out)
    assert caught.value.code == 2
    assert out.getvalue() == ""  # validated before anything is printed
    err = capsys.readouterr().err
    assert "unknown lifecycle 'nope'" in err
    assert "obligation, owner, session" in err
    assert "transport" in err
    assert "Traceback" not in err


def test_unknown_format_exits_2(capsys: pytest.CaptureFixture[str]) -> None:
    """An unknown --format is an argparse usage error with exit code 2."""
    with pytest.raises(SystemExit) as caught:
        main(["lifecycles", "--format", "svg"], out=io.StringIO())
    assert caught.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


def test_no_subcommand_prints_help_and_returns_2() -> None:
    """No subcommand prints the help to the output stream and returns 2."""
    out = io.StringIO()
    assert main([], out=out) == 2
    assert out.getvalue().startswith("usage: statecore")
    assert "lifecycles" in out.getvalue()


def test_module_entry_point_prints_mermaid() -> None:
    """'python -m statecore.cli lifecycles --format mermaid' exits 0 and prints the diagrams."""
    result = subprocess.run(
        [sys.executable, "-m", "statecore.cli", "lifecycles", "--format", "mermaid"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "stateDiagram-v2" in result.stdout
    assert result.stdout == _run("lifecycles", "--format", "mermaid")
    assert result.stderr == ""


def test_module_entry_point_unknown_name_has_no_traceback() -> None:
    """The real process exits 2 on an unknown lifecycle with a usage message, not a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "statecore.cli", "lifecycles", "nope"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert "unknown lifecycle 'nope'" in result.stderr
    assert "Traceback" not in result.stderr


def _console_script() -> str:
    beside = Path(sys.executable).parent / "statecore"
    if beside.is_file():
        return str(beside)
    found = shutil.which("statecore")
    if found is None:
        pytest.fail("the 'statecore' console script is not installed (pip install -e .)")
    return found


def test_console_script_runs() -> None:
    """The installed 'statecore' console script runs and prints the same as main()."""
    result = subprocess.run(
        [_console_script(), "lifecycles", "--format", "table"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == _run("lifecycles", "--format", "table")


def test_console_script_without_subcommand_exits_2() -> None:
    """The console script with no subcommand exits with status 2 (main's return value)."""
    result = subprocess.run(
        [_console_script()],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert result.returncode == 2
    assert "usage: statecore" in result.stdout


# -- the command line as a whole: version, module entry, plugins, JSON ---------------------------


def test_version_is_the_installed_distributions() -> None:
    """'statecore --version' (the script) and 'python -m statecore --version' print the
    installed version and exit 0."""
    expected = f"statecore {version('statecore')}\n"
    script = run("--version")
    assert (script.returncode, script.stdout, script.stderr) == (0, expected, "")
    module = subprocess.run(
        [sys.executable, "-m", "statecore", "--version"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert (module.returncode, module.stdout) == (0, expected)


def test_python_dash_m_statecore_runs_the_same_command_line() -> None:
    """'python -m statecore lifecycles' prints what the console script prints."""
    module = subprocess.run(
        [sys.executable, "-m", "statecore", "lifecycles", "--format", "dot"],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )
    assert module.returncode == 0, module.stderr
    assert module.stdout == run("lifecycles", "--format", "dot").stdout


def test_help_lists_the_commands_installed_packages_add() -> None:
    """The kernel's commands and those found through the 'statecore.cli' entry point group
    (relay: buffer, undeliverable; gateway: sessions, delegations) are all offered."""
    result = run("--help")
    assert result.returncode == 0
    listed = set(re.findall(r"^    (\w+)", result.stdout, re.MULTILINE))
    expected = {"lifecycles", "ledger", "doctor", "buffer", "undeliverable", "sessions"}
    assert expected | {"delegations"} <= listed
    registered = {e.name for e in entry_points(group="statecore.cli")}
    assert registered <= listed


def test_a_command_group_without_its_subcommand_prints_its_help_and_exits_2() -> None:
    """'statecore ledger' alone shows the ledger's subcommands."""
    result = run("ledger")
    assert result.returncode == 2
    assert result.stdout.startswith("usage: statecore ledger")
    for sub in ("ls", "show", "history", "stats", "retry", "abandon", "prune"):
        assert re.search(rf"^    {sub} ", result.stdout, re.MULTILINE), sub


def test_lifecycles_json_is_the_declarations() -> None:
    """'lifecycles --json' prints each lifecycle's states and transitions as data."""
    data = json.loads(_run("lifecycles", "obligation", "--json"))
    assert data == [lifecycle_json(OBLIGATION)]
    [obligation] = data
    assert obligation["initial"] == "pending"
    assert obligation["terminal"] == ["abandoned", "delivered"]
    assert {"event": "record", "from": [], "to": "pending"} in obligation["transitions"]
    assert {"event": "prune", "from": ["delivered", "abandoned"], "to": None} in obligation[
        "transitions"
    ]
    everything = json.loads(_run("lifecycles", "--json"))
    assert [lc["name"] for lc in everything] == [lc.name for lc in all_lifecycles()]


def test_main_reports_a_refusal_on_err_and_returns_2() -> None:
    """In process: a refusal is one line on the error stream and status 2; the store URL
    comes from the given environment."""
    out, err = io.StringIO(), io.StringIO()
    status = main(["ledger", "stats"], out=out, err=err, env={"STATECORE_STORE_URL": "x://y"})
    assert status == 2
    assert out.getvalue() == ""
    assert err.getvalue().startswith("statecore: error: unknown store URL scheme 'x' in 'x://y'")
    assert main(["ledger", "stats", "--json"], out=out, err=err, env={}) == 2
    assert "no store given" in err.getvalue()
    status = main(["ledger", "stats", "--json", "--store", "memory://"], out=out, err=err)
    assert status == 0
    assert json.loads(out.getvalue())["total"] == 0


def test_store_urls_are_found_through_the_entry_point_group() -> None:
    """The kernel names no store: sqlite and memory are registered by the stores package."""
    openers = {e.name: e.value for e in entry_points(group="statecore.stores")}
    assert openers == {
        "memory": "stores.cli:open_memory",
        "sqlite": "stores.cli:open_sqlite",
        "postgresql": "stores.cli:open_postgres",
        "postgres": "stores.cli:open_postgres",
    }


def run(*argv: str) -> subprocess.CompletedProcess[str]:
    """The console script with ``argv``."""
    return subprocess.run(
        [_console_script(), *argv],
        capture_output=True,
        text=True,
        timeout=SUBPROCESS_TIMEOUT,
        cwd=REPO,
        check=False,
    )


def test_the_cli_page_documents_every_command() -> None:
    """docs/cli.md names every command and every ledger, buffer, sessions and delegations
    subcommand the installed command line offers."""
    page = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    commands = re.findall(r"^    (\w+)", run("--help").stdout, re.MULTILINE)
    assert commands
    for command in commands:
        subcommands = re.findall(r"^    (\w+) ", run(command, "--help").stdout, re.MULTILINE)
        if command == "lifecycles":
            subcommands = []
        named = [f"{command} {sub}" for sub in subcommands] or [command]
        for name in named:
            assert f"`{name}" in page, name


def test_a_forwarding_command_gets_every_argument_after_its_name(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A runner with its own parser (plugin.forwarding) receives the rest of the command line
    untouched and its status is the exit status; it is listed in the help like any command."""
    seen: list[list[str]] = []

    def runner(argv: list[str]) -> int:
        seen.append(argv)
        return 3

    command = forwarding("runner", "run something", runner)
    monkeypatch.setattr(cli_module, "_plugins", lambda: [command])
    assert main(["runner", "--config", "c.toml", "--json", "x"], out=io.StringIO()) == 3
    assert seen == [["--config", "c.toml", "--json", "x"]]
    listing = io.StringIO()
    assert main([], out=listing) == 2
    assert "runner" in listing.getvalue()
    assert "run something" in listing.getvalue()
