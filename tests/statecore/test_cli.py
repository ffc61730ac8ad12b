"""Tests for the ``statecore`` command line (statecore.cli)."""

from __future__ import annotations

import io
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from relay.client.lifecycle import TRANSPORT
from statecore.cli import all_lifecycles, main
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
    assert "obligation, session" in err
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
