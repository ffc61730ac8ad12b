"""What a connector can put into a gateway's log: text it chose -- an error frame's fields, an
invalid frame's requestId, an undeliverable delivery's bufferId and raw line, a close reason --
never starts a line of its own nor carries a raw control character.  The real transport
against a stub connector on 127.0.0.1, the log read back through a real ``StreamHandler``."""

from __future__ import annotations

import json

import pytest

from tests.log_capture import EVIL, Captured
from tests.relay.client.connector_stub import StubConnector, TransportFactory, eventually


def _raw(frame: dict[str, object]) -> str:
    """``frame`` as a line a connector may send: the control characters escaped (JSON wants
    them so), the line separators, NEL, DEL and bidi overrides left raw (JSON allows them)."""
    return json.dumps(frame, ensure_ascii=False) + "\n"


@pytest.mark.asyncio
async def test_control_characters_a_connector_sends_never_reach_the_log_raw(
    connector: StubConnector, transports: TransportFactory, captured: Captured
) -> None:
    """Control characters, line separators and a forged record in every field of the
    connector's that reaches a gateway's log line: each record is one line of printable text,
    no forged line appears, and every field did reach the log (escaped)."""
    bad_event = {"text": "x", "source": {"platform": "discord", "chat_id": ""}}  # undeliverable
    connector.push_on_handshake = [
        _raw(
            {"type": "error", "code": "CODE" + EVIL, "message": "TEXT" + EVIL, "ref": "REF" + EVIL}
        ),
        _raw({"type": "outbound_result", "requestId": "RESULTREF" + EVIL, "result": 5}),
        _raw({"type": "inbound", "event": {**bad_event, "text": "RAWLINE" + EVIL}}),
        _raw({"type": "inbound", "bufferId": "BUFFERID" + EVIL, "event": bad_event}),
    ]
    reason = "CLOSE" + EVIL
    connector.close_on_connect[2] = (4401, reason)  # the re-dial after the first close: revoked
    transport = await transports.connected(gateway_id="gw-a", secret="s", reconnect=True)
    markers = ["CODE", "TEXT", "REF", "RESULTREF", "RAWLINE", "BUFFERID"]
    await eventually(lambda: all(captured.lines_with(m) for m in markers), what="frames logged")
    await connector.close_current(4401, reason)
    await eventually(lambda: transport.close_reason is not None, what="the transport revoked")
    await eventually(lambda: len(captured.lines_with("CLOSE")) >= 3, what="the closes logged")

    captured.check_one_line_each()
    for marker in [*markers, "CLOSE"]:  # each reached the log, its line separator escaped
        assert [line for line in captured.lines_with(marker) if "\\u2028" in line], marker
