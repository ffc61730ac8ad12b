"""Drivers with a loop of their own (relay.connector.intake.RunningDriver): started once the
connector listens, stopped first when it stops (while the store still takes their notes), each
bounded and isolated -- one that fails or hangs is logged and the others go on."""

from __future__ import annotations

import asyncio
import logging

import pytest

from relay.connector import server as server_module
from relay.connector.intake import RunningDriver
from relay.connector.platform import LoopbackPlatform
from tests.relay.connector.connector_harness import Harness

CONNECTOR_LOGGER = "relay.connector.server"


class Running(LoopbackPlatform):
    """A loopback platform that records its start and stop, and can fail or hang."""

    def __init__(self, platform: str, calls: list[str], *, fail: str = "", hang: str = "") -> None:
        super().__init__(platform)
        self.calls = calls
        self.fail = fail
        self.hang = hang
        self.url_at_start: str | None = None
        self.connector_url: object = None

    async def start(self) -> None:
        self.calls.append(f"{self.platform}.start")
        self.url_at_start = getattr(self.connector_url, "url", None)
        if self.fail == "start":
            raise RuntimeError("bad credentials\nforged line")
        if self.hang == "start":
            await asyncio.Event().wait()

    async def stop(self) -> None:
        self.calls.append(f"{self.platform}.stop")
        if self._intake is not None:
            save = getattr(self._intake, "save", None)
            if save is not None:
                await save(self.platform, "cursor", "at-stop")
        if self.fail == "stop":
            raise RuntimeError("stop failed")


@pytest.mark.asyncio
async def test_running_drivers_are_started_after_listening_and_stopped_first(
    mh: Harness,
) -> None:
    """start() once the connector listens (its URL is known), stop() as it stops, before its
    store thread: a note saved in stop() is committed.  A plain driver is left alone."""
    calls: list[str] = []
    one, two = Running("one", calls), Running("two", calls)
    plain = LoopbackPlatform("plain")
    assert isinstance(one, RunningDriver)
    assert not isinstance(plain, RunningDriver)
    connector = await mh.start(drivers={"one": one, "two": two, "plain": plain})
    assert sorted(calls) == ["one.start", "two.start"]
    await connector.stop()
    assert sorted(calls) == ["one.start", "one.stop", "two.start", "two.stop"]
    assert await connector.driver_intake.load("one", "cursor") == "at-stop"
    await connector.stop()  # idempotent: stopped drivers are not stopped again
    assert len(calls) == 4


@pytest.mark.asyncio
async def test_the_url_is_known_when_a_driver_starts(mh: Harness) -> None:
    """The server listens before any driver starts."""
    calls: list[str] = []
    driver = Running("one", calls)
    connector = server_module.Connector(
        mh.store, secrets={"gw-a": ["s"]}, drivers={"one": driver}, open_egress=True
    )
    driver.connector_url = connector
    mh.connectors.append(connector)
    await connector.start()
    assert driver.url_at_start == connector.url
    assert connector.url.startswith("ws://")


@pytest.mark.asyncio
async def test_a_failing_or_hanging_driver_is_logged_and_the_others_go_on(
    mh: Harness, caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One driver's start raises, another's never returns (cut at the bound), a third's stop
    raises: each is one ERROR line (its text escaped); the connector starts and stops and the
    healthy driver is started and stopped all the same."""
    monkeypatch.setattr(server_module, "DRIVER_BOUND_S", 0.05)
    calls: list[str] = []
    drivers = {
        "bad": Running("bad", calls, fail="start"),
        "stuck": Running("stuck", calls, hang="start"),
        "cranky": Running("cranky", calls, fail="stop"),
        "good": Running("good", calls),
    }
    with caplog.at_level(logging.ERROR, logger=CONNECTOR_LOGGER):
        connector = await mh.start(drivers=drivers)
        assert connector.url
        await connector.stop()
    assert sorted(c for c in calls if c.endswith(".start")) == [
        "bad.start",
        "cranky.start",
        "good.start",
        "stuck.start",
    ]
    assert "good.stop" in calls
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 3
    assert any("bad driver failed to start" in e and "\n" not in e for e in errors)
    assert any("stuck driver failed to start: TimeoutError" in e for e in errors)
    assert any("cranky driver failed to stop" in e for e in errors)
