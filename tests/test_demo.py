"""The main job (``make demo``) runs end to end and loses nothing."""

from __future__ import annotations

import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from websockets.sync.client import connect

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
    # Not in a terminal: it exits at once, no URL it would take down is printed, and every
    # command it prints is one a fresh shell can run (the venv's statecore, by its path).
    assert "http://" not in out
    command = str(Path(sys.executable).parent / "statecore")
    printed = re.findall(r"^\$ (\S+) ledger stats --store", out, re.MULTILINE)
    assert len(printed) == 1
    assert Path(printed[0]).resolve() == Path(command).resolve()
    assert re.search(r"to browse this run's ledger: \S+ dashboard --store sqlite:///", out)
    assert "make chat" in out


def test_demo_in_a_terminal_serves_the_dashboard_until_ctrl_c(tmp_path: Path) -> None:
    """Run in a terminal, the demo ends by serving the dashboard of its ledger (the delivered
    replies listed) until SIGINT, then exits 0."""
    leader, follower = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, str(DEMO), "--data", str(tmp_path / "data")],
        stdin=follower,
        stdout=follower,
        stderr=subprocess.STDOUT,
        close_fds=True,
    )
    os.close(follower)
    seen = b""
    try:
        deadline = time.monotonic() + 90
        while b"Ctrl-C stops it." not in seen:
            assert time.monotonic() < deadline, seen.decode(errors="replace")
            ready, _, _ = select.select([leader], [], [], 1.0)
            if ready:
                seen += os.read(leader, 65536)
        text = seen.decode(errors="replace")
        assert "summary: 4 messages, 4 replies sent" in text
        url = re.findall(r"(http://127\.0\.0\.1:\d+/dashboard/)", text)[-1]
        with urllib.request.urlopen(url, timeout=10) as page:
            assert b"dashboard.js" in page.read()
        with connect(url.replace("http", "ws") + "ws", open_timeout=10) as ws:
            hello = json.loads(ws.recv(timeout=10))
        assert hello["type"] == "hello"
        assert "delivered" in json.dumps(hello["counts"])
        assert proc.poll() is None  # still up: the page can be opened
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(leader)
