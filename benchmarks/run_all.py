"""Run every ``benchmarks/bench_*.py`` in turn (``make bench``); exit 1 if any misses a target."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def main() -> int:
    """Run each benchmark with ``--check`` in its own process; return 1 if any failed."""
    failed = []
    for script in sorted(Path(__file__).parent.glob("bench_*.py")):
        print(f"\n### {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script), "--check"], check=False).returncode:
            failed.append(script.name)
    if failed:
        print(f"\ntargets missed in: {', '.join(failed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
