"""The main job (``make demo``) runs end to end and loses nothing."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_demo_survives_sigkill_and_dormancy_and_loses_nothing(tmp_path: Path) -> None:
    """The demo's gateway is SIGKILLed mid-reply, restarted and put to sleep; every message is
    answered, the recovered reply is labelled, and the summary reports nothing lost."""
    done = subprocess.run(
        [sys.executable, str(DEMO), "--data", str(tmp_path / "data")],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "SIGKILLed the gateway mid-reply (exit status -9)" in out
    assert "claim -> attempting" in out
    assert "transport: going_idle -> dormant" in out
    assert "transport: dormant -> connecting" in out
    assert "buffer_entry" in out
    assert "ack -> acked" in out
    assert "Recovered reply" in out
    assert "summary: 4 messages, 4 replies sent, redelivered 1 (labelled 1), lost 0" in out
    # While it runs, the web chat and the dashboard are up, and it says where.
    assert re.search(r"talk to the bot yourself: http://127\.0\.0\.1:\d+/chat/", out), out
    assert re.search(r"watch its replies move: +http://127\.0\.0\.1:\d+/dashboard/", out), out
