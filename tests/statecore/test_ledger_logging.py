"""The ledger's log: one INFO line per sweep that claimed or abandoned anything, with counts and
duration, and a WARNING per abandoned obligation naming it, its chat, platform and the reason;
both with structured fields (``extra=``) that a JSON formatter writes as keys."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from statecore import FakeClock, LedgerPolicy, ObligationState, Store, StoreError
from stores.memory import InMemoryStore
from tests.statecore.ledger_helpers import (
    DEAD,
    LIVE,
    FakeProbe,
    _live_procs,
    current,
    failed,
    make,
    record,
)

LOGGER = "statecore.ledger"
SWEEP_KEYS = ("sweep", "claimed", "labelled", "abandoned", "duration_s")
ABANDON_KEYS = ("obligation_id", "chat_id", "platform", "reason", "attempts", "sweep")
_PLAIN = set(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """What an operator's JSON formatter does: the message, plus every extra field as a key."""

    def format(self, record: logging.LogRecord) -> str:
        fields = {k: v for k, v in vars(record).items() if k not in _PLAIN}
        return json.dumps({"level": record.levelname, "msg": record.getMessage(), **fields})


class SlowClaims(InMemoryStore):
    """Each bulk claim takes 1.5 s of the fake clock; optionally fails after writing."""

    def __init__(self, clock: FakeClock) -> None:
        super().__init__()
        self.clock = clock
        self.fail = False

    def transition_many(self, *args: Any, **kwargs: Any) -> Any:
        rows = super().transition_many(*args, **kwargs)
        self.clock.advance(1.5)
        if self.fail:
            raise StoreError("disk I/O error (simulated)")
        return rows


@pytest.fixture
def clock() -> FakeClock:
    """The ledgers' clock."""
    return FakeClock()


@pytest.fixture
def store(clock: FakeClock) -> SlowClaims:
    """An in-memory store whose claims advance the fake clock."""
    return SlowClaims(clock)


@pytest.fixture
def probe() -> FakeProbe:
    """LIVE and OTHER_LIVE are alive; DEAD is not."""
    return FakeProbe(_live_procs())


def records(caplog: pytest.LogCaptureFixture, level: int) -> list[logging.LogRecord]:
    """The ledger logger's records at exactly ``level``."""
    return [r for r in caplog.records if r.name == LOGGER and r.levelno == level]


def fields(record: logging.LogRecord, keys: tuple[str, ...]) -> dict[str, Any]:
    """The record's structured fields."""
    return {key: getattr(record, key) for key in keys}


def test_a_startup_sweep_writes_one_info_line_with_counts_and_duration(
    store: Store, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """Three rows of a dead owner claimed (one of them attempting, so labelled), in two chunks
    whose claims take 1.5 s each: one INFO line saying so, as text and as fields."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    dead = make(store, clock, probe, DEAD)
    for oid in ("ob-1", "ob-2", "ob-3"):
        record(dead, oid)
    dead.mark_attempting("ob-3")
    live = make(store, clock, probe, LIVE, policy=LedgerPolicy(sweep_chunk=2))

    claims = live.sweep_recoverable()

    assert len(claims) == 3
    (line,) = records(caplog, logging.INFO)
    assert fields(line, SWEEP_KEYS) == {
        "sweep": "startup",
        "claimed": 3,
        "labelled": 1,
        "abandoned": 0,
        "duration_s": 3.0,
    }
    assert line.getMessage() == (
        "ledger startup sweep: claimed 3 (1 labelled as possible repeats), abandoned 0 in 3.000 s"
    )
    assert records(caplog, logging.WARNING) == []


def test_a_sweep_that_found_nothing_writes_nothing(
    store: Store, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """Sweeps run on timers: one that claimed and abandoned nothing stays silent at INFO."""
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    live = make(store, clock, probe, LIVE)
    record(live, "ob-1")  # alive owner: not claimed
    assert live.sweep_recoverable() == []
    assert live.sweep_failed_for_runtime("slack") == []
    assert live.sweep_stuck_own(older_than_s=60.0) == []
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_abandonment_is_a_warning_naming_the_obligation_chat_platform_and_reason(
    store: Store, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """Stale rows of a dead owner are abandoned: one WARNING each with its fields, and the
    sweep's INFO line counts them."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-old", chat_id="C-old", platform="slack")
    record(dead, "ob-older", chat_id=42, platform="telegram")
    clock.advance(LedgerPolicy().stale_after + 1)
    record(dead, "ob-new")
    live = make(store, clock, probe, LIVE)

    claims = live.sweep_recoverable()

    assert [c.obligation_id for c in claims] == ["ob-new"]
    warnings = records(caplog, logging.WARNING)
    assert [fields(w, ABANDON_KEYS) for w in warnings] == [
        {
            "obligation_id": "ob-old",
            "chat_id": "C-old",
            "platform": "slack",
            "reason": "stale: older than 86400 s",
            "attempts": 0,
            "sweep": "startup",
        },
        {
            "obligation_id": "ob-older",
            "chat_id": "42",
            "platform": "telegram",
            "reason": "stale: older than 86400 s",
            "attempts": 0,
            "sweep": "startup",
        },
    ]
    assert warnings[0].getMessage() == (
        "abandoned obligation ob-old (chat C-old on slack): stale: older than 86400 s"
    )
    (line,) = records(caplog, logging.INFO)
    assert (line.claimed, line.abandoned) == (1, 2)  # type: ignore[attr-defined]
    assert current(live, "ob-old").state is ObligationState.ABANDONED


def test_the_runtime_sweep_logs_its_claims_and_its_budget_abandonments(
    store: Store, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """A runtime sweep re-claims this process's reconnect failures (labelled), and abandons
    the one whose budget is spent, with the budget as its reason."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    live = make(store, clock, probe, LIVE, policy=LedgerPolicy(max_attempts=1))
    failed(live, "ob-1")
    (claim,) = live.sweep_failed_for_runtime("slack")
    live.mark_failed(claim.obligation_id, "send_path_degraded")
    failed(live, "ob-2")
    caplog.clear()

    claims = live.sweep_failed_for_runtime("slack")

    assert [c.obligation_id for c in claims] == ["ob-2"]
    (warning,) = records(caplog, logging.WARNING)
    assert fields(warning, ("obligation_id", "reason", "sweep")) == {
        "obligation_id": "ob-1",
        "reason": "attempt budget spent (1/1)",
        "sweep": "runtime",
    }
    (line,) = records(caplog, logging.INFO)
    assert fields(line, SWEEP_KEYS) == {
        "sweep": "runtime",
        "claimed": 1,
        "labelled": 1,
        "abandoned": 1,
        "duration_s": 1.5,
    }


def test_the_stuck_sweep_logs_its_claims(
    store: Store, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """This process's own sends left pending and attempting are re-claimed: one INFO line,
    the attempting one labelled."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    live = make(store, clock, probe, LIVE)
    record(live, "ob-pending")
    record(live, "ob-attempting")
    live.mark_attempting("ob-attempting")
    clock.advance(120)

    assert len(live.sweep_stuck_own(older_than_s=60.0)) == 2

    (line,) = records(caplog, logging.INFO)
    assert (line.sweep, line.claimed, line.labelled) == ("stuck", 2, 1)  # type: ignore[attr-defined]


def test_a_json_formatter_writes_the_fields_as_keys(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Formatted by a JSON formatter, the sweep line and the abandonment carry their fields
    as top-level keys."""
    lines: list[str] = []

    class Collect(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(self.format(record))

    handler = Collect()
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger(LOGGER)
    logger.addHandler(handler)
    old_level = logger.level
    logger.setLevel(logging.INFO)
    try:
        dead = make(store, clock, probe, DEAD)
        record(dead, "ob-1")
        clock.advance(LedgerPolicy().stale_after + 1)
        make(store, clock, probe, LIVE).sweep_recoverable()
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
    warning, info = (json.loads(line) for line in lines)
    assert warning["level"] == "WARNING"
    assert {k: warning[k] for k in ("obligation_id", "chat_id", "platform", "reason")} == {
        "obligation_id": "ob-1",
        "chat_id": "C1",
        "platform": "slack",
        "reason": "stale: older than 86400 s",
    }
    assert info["level"] == "INFO"
    assert {k: info[k] for k in SWEEP_KEYS} == {
        "sweep": "startup",
        "claimed": 0,
        "labelled": 0,
        "abandoned": 1,
        "duration_s": 0.0,
    }


def test_a_chunk_that_failed_logs_no_abandonment_it_did_not_make(
    store: SlowClaims, clock: FakeClock, probe: FakeProbe, caplog: pytest.LogCaptureFixture
) -> None:
    """The chunk's transaction fails after abandoning one row and claiming another: nothing of
    it was written, so no abandonment is logged and no sweep line written."""
    caplog.set_level(logging.INFO, logger=LOGGER)
    dead = make(store, clock, probe, DEAD)
    record(dead, "ob-old")
    clock.advance(LedgerPolicy().stale_after + 1)
    record(dead, "ob-new")
    store.fail = True
    live = make(store, clock, probe, LIVE)

    with pytest.raises(StoreError):
        live.sweep_recoverable()

    assert [r for r in caplog.records if r.name == LOGGER] == []
    assert current(live, "ob-old").state is ObligationState.PENDING
    assert current(live, "ob-new").state is ObligationState.PENDING
