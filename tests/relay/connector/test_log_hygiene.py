"""What an authenticated gateway (or the platform's users) can put into the connector's log: a
flood of frames writes a bounded number of lines with the count of the rest, and text the peer
chose never starts a line of its own nor carries a raw control character.  A real connector on
127.0.0.1, raw WebSocket peers, and the log read back through a real ``StreamHandler``."""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import Mapping
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection

from relay.connector.platform import LoopbackPlatform
from relay.wire.frames import OutboundOutcome
from tests.log_capture import EVIL, Captured
from tests.relay.connector.connector_harness import (
    Harness,
    is_live,
    raw_hello,
    recv_frame,
    send_action,
    send_line,
)
from tests.waiting import BOUND, eventually

FLOOD = 10_000
SLOW_BOUND_S = 60.0
"""Real seconds the connector may take over the flood (a connector that logs every frame is
slow at it: the test must still see how many lines it wrote)."""


class _TalkativeDriver(LoopbackPlatform):
    """A loopback platform whose refusals quote what it was asked (as platforms' APIs do)."""

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        content = str(action.get("content", ""))
        if content.startswith("boom"):
            raise RuntimeError(f"the platform refused {content}")
        return await super().perform(action)


async def _result_of(ws: ClientConnection, request_id: str) -> dict[str, Any]:
    """The result of ``request_id``, skipping other frames (split on newlines alone: the
    frames carry the peer's line separators back inside their JSON strings)."""
    while True:
        message = await asyncio.wait_for(ws.recv(), BOUND)
        for line in str(message).split("\n"):
            frame = json.loads(line) if line.strip() else {}
            if frame.get("type") == "outbound_result" and frame.get("requestId") == request_id:
                result = frame["result"]
                assert isinstance(result, dict)
                return result


@pytest.mark.asyncio
async def test_ten_thousand_interrupts_in_one_message_log_a_handful_of_lines_and_a_count(
    mh: Harness, captured: Captured
) -> None:
    """One message of 10,000 interrupt frames writes at most 20 log lines, and the lines
    logged plus the count of those not logged make 10,000."""
    connector = await mh.start()
    ws = await mh.raw(connector)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "gw-a live")
    frame = json.dumps({"type": "interrupt", "session_key": "s-1", "reason": "stop"})
    await ws.send((frame + "\n") * FLOOD)
    # Frames are handled in order: once the request sent after the flood is answered, every
    # interrupt before it was handled (a connector writing a line for each takes a while).
    await send_line(ws, {"type": "outbound", "requestId": "sync", "action": send_action("c1", "x")})
    answer = await recv_frame(ws, timeout=SLOW_BOUND_S)
    assert (answer["type"], answer["requestId"]) == ("outbound_result", "sync"), answer
    written = captured.text.splitlines()
    assert len(written) <= 20, f"{len(written)} lines for {FLOOD} interrupts"
    logged = len(captured.lines_with("interrupt for session"))
    assert logged >= 1
    await ws.close()
    await eventually(lambda: bool(captured.lines_with("lines not logged")), "the closing count")
    (summary,) = captured.lines_with("lines not logged")
    counted = re.search(r"(\d+) interrupts", summary)
    assert counted is not None, summary
    assert logged + int(counted.group(1)) == FLOOD, summary
    assert len(captured.text.splitlines()) <= 20


@pytest.mark.asyncio
async def test_control_characters_a_peer_sends_never_reach_the_log_raw(
    mh: Harness, captured: Captured
) -> None:
    """Control characters, line separators and a forged record in every field a gateway or
    the platform supplies that reaches a log line (an interrupt's session key and reason, an
    invalid frame's requestId, a hello's platform, a driver's error text, a chat id no gateway
    listens to): each record is one line of printable text, no forged line appears, and
    every field did reach the log (escaped)."""
    driver = _TalkativeDriver()
    elsewhere = LoopbackPlatform("elsewhere", id_prefix="e")
    connector = await mh.start(drivers={"loopback": driver, "elsewhere": elsewhere})
    ws = await mh.raw(connector)
    await raw_hello(ws)
    await eventually(lambda: is_live(connector, "gw-a"), "gw-a live")
    fields: dict[str, dict[str, Any]] = {
        "SESSIONKEY": {"type": "interrupt", "session_key": "SESSIONKEY" + EVIL},
        "REASON": {"type": "interrupt", "session_key": "s", "reason": "REASON" + EVIL},
        "REQUESTID": {"type": "outbound", "requestId": "REQUESTID" + EVIL, "action": 5},
        "PLATFORM": {"type": "hello", "platform": "PLATFORM" + EVIL, "botId": "BOT" + EVIL},
    }
    for frame in fields.values():
        await send_line(ws, frame)
    boom = send_action("c1", "boom DRIVERTEXT" + EVIL)
    await send_line(ws, {"type": "outbound", "requestId": "r-boom", "action": boom})
    result = await _result_of(ws, "r-boom")
    assert result["success"] is False
    await elsewhere.inject("CHATID" + EVIL, "nobody listens here")
    markers = [*fields, "DRIVERTEXT", "CHATID"]
    await eventually(
        lambda: all(captured.lines_with(marker) for marker in markers), "every field logged"
    )

    captured.check_one_line_each()
    for marker in markers:
        (line,) = captured.lines_with(marker)
        assert marker + "\\nCRITICAL:statecore.ledger:forged\\r\\x1b" in line, line
