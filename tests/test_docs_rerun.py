"""The store guide's programs can be run again where they ran before: each Python block of
docs/stores.md runs twice in one directory, and leaves nothing behind.

(tests/test_docs.py runs every block once, in a fresh directory, which cannot show a program that
trips over a file its previous run left.)"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"
TIMEOUT_S = 60.0
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```\s*$", re.MULTILINE | re.DOTALL)

_SOURCES = [
    body
    for lang, body in _FENCE.findall((DOCS / "stores.md").read_text(encoding="utf-8"))
    if lang == "python"
]
_BLOCKS = [pytest.param(body, id=f"stores.md-{index}") for index, body in enumerate(_SOURCES)]


@pytest.mark.parametrize("block", _BLOCKS)
def test_block_runs_twice_in_one_directory(block: str, tmp_path: Path) -> None:
    """A second run in the same directory succeeds like the first, and no file is left over."""
    script = tmp_path / "block.py"
    script.write_text(block, encoding="utf-8")
    for run in (1, 2):
        done = subprocess.run(
            [sys.executable, str(script)],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=TIMEOUT_S,
            check=False,
        )
        assert done.returncode == 0, f"run {run}:\n{done.stdout}\n{done.stderr}"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "__pycache__") == ["block.py"]


def test_the_tour_is_among_the_blocks() -> None:
    """The guard-rule tour, which writes a SQLite file, is one of the blocks run twice."""
    assert any("def tour(" in body for body in _SOURCES)
