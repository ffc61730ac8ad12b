"""The distribution's declaration and what the package says about itself agree: the version, the
license, the classifiers, the ``testing`` extra, the changelog and the README's install notes."""

from __future__ import annotations

import importlib.metadata
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import statecore

ROOT = Path(__file__).resolve().parent.parent
PROJECT: dict[str, Any] = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
META: dict[str, Any] = PROJECT["project"]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _names(requirements: list[str]) -> list[str]:
    """The distribution names of requirement strings (``pytest>=8.0`` -> ``pytest``)."""
    return [re.split(r"[\s\[<>=!~;@]", requirement, maxsplit=1)[0] for requirement in requirements]


def _section(text: str, heading: str) -> str:
    """The Markdown section under ``heading`` (up to the next heading of the same level)."""
    start = text.index(f"{heading}\n")
    level = heading.split(" ", 1)[0]
    following = text.find(f"\n{level} ", start + len(heading))
    return text[start : following if following != -1 else len(text)]


def test_version_is_the_installed_distributions() -> None:
    """``statecore.__version__`` is the version installed, which is the one declared."""
    assert statecore.__version__ == importlib.metadata.version("statecore")
    assert statecore.__version__ == META["version"]


def test_version_is_not_a_public_name() -> None:
    """``__version__`` is a module attribute, not part of ``__all__`` (star imports skip it)."""
    assert "__version__" not in statecore.__all__


def test_version_falls_back_when_the_distribution_is_not_installed() -> None:
    """Imported from a tree that was never installed, the package still imports and says so."""
    script = (
        "import importlib.metadata as m\n"
        "def missing(name):\n"
        "    raise m.PackageNotFoundError(name)\n"
        "m.version = missing\n"
        "import statecore\n"
        "print(statecore.__version__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "0+unknown"


def test_testing_extra_is_pytest_alone() -> None:
    """``statecore[testing]`` brings pytest and nothing else (the kit needs no plugin)."""
    extras = META["optional-dependencies"]
    assert _names(extras["testing"]) == ["pytest"]


def test_license_is_apache_2_and_shipped() -> None:
    """The declared license is Apache-2.0 and the LICENSE file holding its text is shipped."""
    assert META["license"] == "Apache-2.0"
    assert META["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.split()[:5] == ["Apache", "License", "Version", "2.0,", "January"]
    assert "END OF TERMS AND CONDITIONS" in text


def test_classifiers_agree_with_the_declaration() -> None:
    """Every Python version classified is allowed by requires-python, the oldest allowed one is
    classified, and no license classifier repeats the license expression (the build backend
    refuses both together)."""
    classifiers: list[str] = META["classifiers"]
    minimum = tuple(int(p) for p in META["requires-python"].removeprefix(">=").split("."))
    versions = [
        tuple(int(p) for p in c.rsplit(" ", 1)[1].split("."))
        for c in classifiers
        if re.fullmatch(r"Programming Language :: Python :: 3\.\d+", c)
    ]
    assert minimum in versions
    assert all(version >= minimum for version in versions)
    assert "Typing :: Typed" in classifiers
    assert not [c for c in classifiers if c.startswith("License ::")]


def test_changelog_has_the_declared_version() -> None:
    """CHANGELOG.md has a section for the declared version, below the unreleased changes."""
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.+)$", changelog, re.MULTILINE)
    assert headings[0] == "Unreleased"
    assert META["version"] in headings


def test_readme_names_the_import_packages_the_distribution_installs() -> None:
    """The README's install notes name exactly the top-level packages the build includes."""
    section = _section(README, "## Installing")
    included = PROJECT["tool"]["setuptools"]["packages"]["find"]["include"]
    packages = sorted(pattern.removesuffix("*") for pattern in included)
    assert packages == ["relay", "statecore", "stores"]
    for package in packages:
        assert f"`{package}`" in section, package
    assert "shadow" in section


def test_readme_names_every_extra_a_user_installs() -> None:
    """The README's install notes name each extra meant for users, and only declared ones."""
    section = _section(README, "## Installing")
    declared = set(META["optional-dependencies"])
    named = set(re.findall(r"statecore\[(\w+)\]", section))
    named |= set(re.findall(r"'\.\[(\w+)\]'", section))
    assert named <= declared
    assert {"testing", "prometheus"} <= named


def test_the_first_install_says_what_it_does_and_how_to_reach_the_command() -> None:
    """``make``'s install step announces itself (and how long it takes) before pip's quiet
    installs, and ends by naming the ``statecore`` command's path in the venv."""
    done = subprocess.run(
        [
            "make",
            "--dry-run",
            "--always-make",
            "--no-print-directory",
            "-C",
            str(ROOT),
            ".venv/.installed",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    lines = done.stdout.splitlines()
    installs = [n for n, line in enumerate(lines) if "pip install" in line]
    announced = [n for n, line in enumerate(lines) if line.startswith('echo "==> installing')]
    assert installs
    assert announced
    assert announced[0] < installs[0]
    assert "half a minute" in lines[announced[0]]
    assert "the statecore command is .venv/bin/statecore" in lines[-1]
