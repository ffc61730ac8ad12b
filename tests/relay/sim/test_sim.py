"""The deterministic simulation: seeded worlds hold every invariant, a seed replays exactly,
and the checks are not vacuous -- a world with a known bug planted fails them."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator

import pytest

from relay.connector.buffer import BUFFER_KIND
from relay.sim import gateway as sim_gateway
from relay.sim.__main__ import report_failure
from relay.sim.connector import SimConnector
from relay.sim.gateway import SimGateway
from relay.sim.jobs import outcomes
from relay.sim.net import Connection
from relay.sim.run import Outcome, run_seed, shrink
from relay.wire.codec import encode
from relay.wire.frames import Frame, Inbound, InboundAck
from statecore.store import Audit
from tests.cli_run import run_module

SEEDS = range(1, 301)
"""The seeds every ``make test`` runs (about 15 s on the reference machine in one process; in
two worker processes, one per core, here)."""


@pytest.fixture(autouse=True)
def _quiet_ledger() -> Iterator[None]:
    """Abandonments under faults are logged at WARNING by the ledger: expected here."""
    logger = logging.getLogger("statecore")
    level = logger.level
    logger.setLevel(logging.ERROR)
    yield
    logger.setLevel(level)


def failures(seeds: range) -> list[Outcome]:
    return [o for o in (run_seed(seed) for seed in seeds) if not o.ok]


def test_three_hundred_seeded_worlds_hold_every_invariant() -> None:
    """Crashes, partitions, clock jumps, store and platform faults, duplicate deliveries: in
    every world, every accepted message is answered (or abandoned with its reason), every
    possible repeat is labelled, no reply reaches another tenant's chat, no entry is acked
    before its handler returned, nothing is owed or unacked once quiet, and every stored
    history is a walk of declared transitions."""
    runs = list(outcomes(SEEDS[0], len(SEEDS), real=False, jobs=2))
    failed = [o for o in runs if not o.ok]
    assert not failed, "\n\n".join(report_failure(o) for o in failed)
    assert [o.seed for o in runs] == list(SEEDS)
    sample = runs[0]
    assert sample.verdict.checks > 100
    assert sample.verdict.replies > 10


def test_a_seed_replays_exactly() -> None:
    """Two runs of one seed take the same steps (full traces compared); another seed does
    not."""
    first, again = run_seed(42, trace=True), run_seed(42, trace=True)
    assert first.trace == again.trace
    assert len(first.trace) > 100
    assert first.faults == again.faults
    assert run_seed(43, trace=True).trace != first.trace


def test_sqlite_worlds_replay_exactly_too() -> None:
    """Every fourth seed keeps its stores in SQLite files: same steps on a replay."""
    first, again = run_seed(8, trace=True), run_seed(8, trace=True)
    assert first.store == "sqlite"
    assert first.trace == again.trace


# -- the checks catch planted bugs -----------------------------------------------------------------


def test_an_ack_before_the_handler_returned_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway that acks a buffered message as it arrives, before its handler ran."""
    original = SimGateway._frame

    def acks_early(self: SimGateway, life: int, conn: Connection, frame: Frame) -> None:
        if isinstance(frame, Inbound) and frame.buffer_id is not None and conn.open:
            conn.to_connector(encode(InboundAck(frame.buffer_id)))
        original(self, life, conn, frame)

    monkeypatch.setattr(SimGateway, "_frame", acks_early)
    failed = failures(range(1, 6))
    assert failed
    assert any("acked before its handler returned" in v for v in failed[0].verdict.violations)


def test_an_unlabelled_resend_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A gateway that resends claimed replies without their banner."""

    def unlabelled(self: SimGateway, claims: list[sim_gateway.Claim]) -> None:
        for claim in claims:
            ob = claim.obligation
            self._send(ob.obligation_id, ob.chat_id, ob.content)

    monkeypatch.setattr(SimGateway, "_send_claims", unlabelled)
    failed = failures(range(1, 81))
    assert any(
        "unlabelled duplicate" in v for outcome in failed for v in outcome.verdict.violations
    )


def test_egress_to_another_tenant_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connector without its tenant guard, and a gateway that writes to a chat it does not
    serve."""
    # The guard now reads every chat as acme's: gw-acme may write anywhere.
    monkeypatch.setattr("relay.sim.connector.tenant_of", lambda chat: "acme")
    original = SimGateway._send

    def misroutes(self: SimGateway, obligation_id: str, chat_id: str, text: str) -> None:
        original(self, obligation_id, chat_id.replace("acme", "globex"), text)

    monkeypatch.setattr(SimGateway, "_send", misroutes)
    failed = failures(range(1, 4))
    assert any("another tenant" in v for o in failed for v in o.verdict.violations)


def test_a_dropped_message_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """A connector that takes a message from the platform and never buffers it."""
    original = SimConnector.accept

    def drops(self: SimConnector, event: object) -> bool:
        if getattr(event, "message_id", "") == "m3":
            return True  # accepted, and forgotten
        return original(self, event)  # type: ignore[arg-type]

    monkeypatch.setattr(SimConnector, "accept", drops)
    failed = failures(range(1, 3))
    assert any("lost: m3" in v for o in failed for v in o.verdict.violations)
    assert "fault schedule" in report_failure(failed[0])


def test_the_shrinker_keeps_only_the_faults_a_failure_needs(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bug that shows only when the connector crashes: the shrunk schedule still fails, is
    shorter than the seed's, and holds a connector crash."""
    original = SimConnector.start

    def forgets_its_buffer(self: SimConnector) -> None:
        original(self)
        if self.life > 1:  # a restarted connector that lost everything buffered before
            for row in self.store.select(BUFFER_KIND):
                with contextlib.suppress(Exception):
                    self.store.transition(
                        BUFFER_KIND, row.id, "ack", audit=Audit(0.0, None, reason="bug")
                    )

    monkeypatch.setattr(SimConnector, "start", forgets_its_buffer)
    seed = next(o.seed for o in failures(range(1, 60)) if len(o.faults) > 3)
    full = run_seed(seed).faults
    smaller = shrink(seed)
    assert len(smaller) < len(full)
    assert any(f.kind == "crash_connector" for f in smaller)
    assert not run_seed(seed, faults=smaller).ok


# -- the command -----------------------------------------------------------------------------------


def test_the_command_runs_a_campaign_and_prints_the_summary() -> None:
    done = run_module("relay.sim", "--seeds", "12", "--first", "100")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "12 runs (seeds 100..111)" in done.stdout
    assert "invariant checks made" in done.stdout
    assert "runs with a violation            0" in done.stdout
    for kind in ("crash_gateway", "partition", "clock_jump", "store_fail"):
        assert kind in done.stdout


def test_the_command_replays_one_seed_step_by_step() -> None:
    done = run_module("relay.sim", "--seed", "5", "--trace")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAULT" in done.stdout
    assert done.stdout.rstrip().endswith("seed 5: ok")
