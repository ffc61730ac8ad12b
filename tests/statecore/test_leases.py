"""Ownership across hosts: host identities, owner tokens, the heartbeat and the lease.

An owner on another host cannot be probed: it is alive while its owner record beats, dead once
its lease ran out (to the instant, on the fake clock) or at once after it left.  Owners on this
host are still judged by the probe at once.  Fencing keeps a paused-then-resumed owner from
settling a row another host re-claimed.  Every test runs on the in-memory store, SQLite and
PostgreSQL (a schema of its own on the session's server); time comes from a FakeClock.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest

from statecore import (
    AsyncLedger,
    FakeClock,
    Incarnation,
    LedgerPolicy,
    StaleState,
    Store,
)
from statecore import ownership as ownership_module
from statecore.leases import OWNER_KIND, OwnerLeases, OwnerState
from statecore.ownership import host_identity
from statecore.survey import OwnerStatus, stuck_rows
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore
from tests.statecore.ledger_helpers import (
    DEAD,
    LIVE,
    POLICY,
    FakeProbe,
    S,
    _live_procs,
    current,
    make,
    record,
)

LEASE = POLICY.lease_s
BEAT = LEASE / 3

REMOTE = Incarnation("peer-host/m-0123/boot-4567", LIVE.pid, LIVE.started_at, "remote-token")
"""An owner on another host -- with this very pid and start time, which must not matter."""


@pytest.fixture(params=["memory", "sqlite", "postgres"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    """An empty store of each kind (closed at teardown)."""
    made: Store
    if request.param == "memory":
        made = InMemoryStore()
    elif request.param == "sqlite":
        made = SQLiteStore(tmp_path / "ledger.db")
    else:
        from stores.postgres import PostgresStore  # noqa: PLC0415

        url = request.getfixturevalue("postgres_url")
        made = PostgresStore(url, schema=f"l_{uuid.uuid4().hex[:16]}", pool_size=4)
    yield made
    made.close()


@pytest.fixture
def clock() -> FakeClock:
    """The only time source of every ledger in a test."""
    return FakeClock()


@pytest.fixture
def probe() -> FakeProbe:
    """Knows LIVE and OTHER_LIVE as alive -- and REMOTE's pid, which is LIVE's."""
    return FakeProbe(_live_procs())


# -- identity ------------------------------------------------------------------------------------


def test_host_identity_names_machine_boot_and_pid_namespace(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Two containers on one machine share hostname, machine id and boot id, but not their pid
    namespace: their identities differ.  A reboot changes the boot part."""
    monkeypatch.setattr(ownership_module.socket, "gethostname", lambda: "gw")
    monkeypatch.setattr(ownership_module, "_machine_id", lambda: "abc")
    monkeypatch.setattr(ownership_module, "_boot_id", lambda: "b1")
    monkeypatch.setattr(ownership_module, "_pid_namespace", lambda: "4026531836")
    one = host_identity()
    assert one == "gw/m-abc/boot-b1/pidns-4026531836"
    monkeypatch.setattr(ownership_module, "_pid_namespace", lambda: "4026532999")
    assert host_identity() != one  # another container, same machine
    monkeypatch.setattr(ownership_module, "_pid_namespace", lambda: "4026531836")
    monkeypatch.setattr(ownership_module, "_boot_id", lambda: "b2")
    assert host_identity() != one  # the same machine after a reboot
    monkeypatch.setattr(ownership_module, "_boot_id", lambda: "")
    monkeypatch.setattr(ownership_module, "_machine_id", lambda: "")
    monkeypatch.setattr(ownership_module, "_pid_namespace", lambda: "")
    assert host_identity() == "gw"  # nothing readable: the hostname alone


def test_this_hosts_identity_has_every_part_linux_offers() -> None:
    """On Linux the identity carries the boot id and the pid namespace this process sees."""
    parts = host_identity().split("/")
    if not Path("/proc/sys/kernel/random/boot_id").exists():
        pytest.skip("no boot id outside Linux")
    boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    assert f"boot-{boot[:16]}" in parts
    assert any(part.startswith("pidns-") and part[6:].isdigit() for part in parts)


def test_incarnations_of_one_pid_never_share_a_token() -> None:
    """Every incarnation built gets 128 fresh random bits, whatever its pid."""
    probe = FakeProbe({})
    tokens = {Incarnation.current(probe=probe).token for _ in range(200)}
    assert len(tokens) == 200
    assert all(len(token) == 32 and int(token, 16) >= 0 for token in tokens)


# -- other hosts: the heartbeat ------------------------------------------------------------------


def test_other_host_owner_stays_alive_while_it_beats(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Beating every lease_s / 3, an owner on another host keeps its rows for many leases --
    long after the row's own lease ended -- and beats never touch its rows' fences."""
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    oid = record(remote)
    live = make(store, clock, probe)
    for _ in range(12):  # four leases
        clock.advance(BEAT)
        remote.heartbeat()
        assert live.sweep_recoverable() == []
    row = current(live, oid)
    assert row.lease_expires_at < clock.now()  # the row's own lease would have let it go
    assert (row.fence, row.attempts, row.owner.token) == (0, 0, REMOTE.token)
    remote.mark_attempting(oid)  # the owner's own settles are not fenced out by its beats
    remote.mark_delivered(oid)


def test_other_host_rows_are_reclaimed_exactly_when_the_lease_of_the_last_beat_ends(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Beats stop: the rows wait until the last beat's lease ends (not a moment earlier),
    then the next sweep claims them -- labelled when the send may have begun."""
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    pending = record(remote, "ob-pending")
    sent = record(remote, "ob-sent")
    remote.mark_attempting(sent)
    clock.advance(BEAT)
    last = remote.heartbeat()
    assert last == clock.now() + LEASE
    live = make(store, clock, probe)
    clock.advance(LEASE - 0.5)
    assert live.sweep_recoverable() == []
    clock.advance(0.5)
    assert clock.now() == last
    claims = {c.obligation_id: c for c in live.sweep_recoverable()}
    assert sorted(claims) == ["ob-pending", "ob-sent"]
    assert claims[pending].needs_marker is False
    assert (claims[sent].needs_marker, claims[sent].reason) == (True, "recovered")


def test_other_host_rows_are_reclaimed_at_once_after_leave(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A clean stop (leave) ends the lease: the next sweep claims the rows at once, though
    both the beat's lease and the row's own lease still run."""
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    oid = record(remote)
    live = make(store, clock, probe)
    assert live.sweep_recoverable() == []
    assert remote.leave() is True
    assert remote.leave() is False  # nothing left to end
    [claim] = live.sweep_recoverable()
    assert claim.obligation_id == oid
    [owner_record] = store.select(OWNER_KIND, where={"owner_token": REMOTE.token})
    assert owner_record.state is OwnerState.GONE


def test_an_owner_is_alive_while_any_of_its_ledgers_beats(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Two ledgers of one incarnation keep a record each: one leaving does not end the other's
    lease; once both stopped, the last lease decides."""
    first = make(store, clock, probe, REMOTE)
    second = make(store, clock, probe, REMOTE)
    first.heartbeat()
    second.heartbeat()
    record(first)
    first.leave()
    live = make(store, clock, probe)
    assert live.sweep_recoverable() == []
    clock.advance(LEASE - 1)
    assert live.sweep_recoverable() == []
    clock.advance(1)
    assert len(live.sweep_recoverable()) == 1


def test_an_owner_that_never_beat_keeps_the_rows_own_lease(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """No owner record: the row's own lease decides, as before there were heartbeats."""
    remote = make(store, clock, probe, REMOTE)
    record(remote)
    live = make(store, clock, probe)
    clock.advance(LEASE - 1)
    assert live.sweep_recoverable() == []
    clock.advance(1)
    assert len(live.sweep_recoverable()) == 1


def test_same_host_owners_are_judged_by_the_probe_whatever_their_lease(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """A dead owner of this host is reclaimed at once though its record beats; a live one is
    kept though its lease ran out long ago."""
    dead = make(store, clock, FakeProbe(), DEAD)
    dead.heartbeat()
    dead_row = record(dead, "ob-dead")
    alive = make(store, clock, probe, LIVE)
    alive.heartbeat()
    alive_row = record(alive, "ob-alive")
    clock.advance(LEASE * 10)
    other = make(store, clock, probe, attrs.evolve(LIVE, token="a-third-token"))
    assert [c.obligation_id for c in other.sweep_recoverable()] == [dead_row]
    assert current(other, alive_row).owner.token == LIVE.token


def test_lease_reads_are_one_per_owner_per_sweep(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Many rows of one remote owner cost one read of its records."""
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    for n in range(5):
        record(remote, f"ob-{n}")
    leases = OwnerLeases(store)
    assert [leases.beating(REMOTE.token, clock.now()) for _ in range(5)] == [True] * 5
    assert leases.beating("nobody", clock.now()) is None
    assert leases.reads == 2


def test_the_operators_view_judges_remote_owners_as_the_sweeps_do(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """``stuck_rows`` (``statecore ledger stuck``) calls a beating remote owner remote past the
    row's own lease, and dead once it left."""
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    record(remote)
    clock.advance(LEASE + BEAT)
    remote.heartbeat()
    [stuck] = stuck_rows(store, older_than_s=1, now=clock.now(), probe=probe)
    assert stuck.owner is OwnerStatus.REMOTE
    remote.leave()
    [stuck] = stuck_rows(store, older_than_s=1, now=clock.now(), probe=probe)
    assert stuck.owner is OwnerStatus.DEAD


# -- fencing: the zombie -------------------------------------------------------------------------


def test_a_paused_owner_that_resumes_cannot_settle_what_another_host_reclaimed(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """Host A marks a send attempting and pauses past its lease; host B reclaims the row
    (labelled) and delivers it.  A resumes: its beat renews its own record, but every settle
    of the row is refused (StaleState) and the row stays B's, delivered once."""
    zombie = make(store, clock, probe, REMOTE)
    zombie.heartbeat()
    oid = record(zombie)
    zombie.mark_attempting(oid)
    clock.advance(LEASE)  # paused: no beat for a whole lease
    other_host = Incarnation("third-host/boot-89ab", 7_001, 70, "b-token")
    b = make(store, clock, FakeProbe(), other_host)
    [claim] = b.sweep_recoverable()
    assert (claim.needs_marker, claim.attempts) == (True, 1)
    zombie.heartbeat()  # wakes up and beats: the row is not given back
    for settle in (
        lambda: zombie.mark_delivered(oid),
        lambda: zombie.mark_failed(oid, "timeout"),
        lambda: zombie.release(oid),
    ):
        with pytest.raises(StaleState):
            settle()
    assert current(b, oid).owner.token == other_host.token
    b.mark_delivered(oid)
    assert current(b, oid).state is S.DELIVERED
    assert b.sweep_recoverable() == []


def test_a_beat_after_housekeeping_ended_the_record_joins_again(
    store: Store, clock: FakeClock, probe: FakeProbe
) -> None:
    """An owner paused past the retention finds its record expired: its next beat joins with
    a new record, and it is alive to its peers again."""
    policy = LedgerPolicy(retention=LEASE * 2)
    remote = make(store, clock, probe, REMOTE, policy=policy)
    remote.heartbeat()
    first = remote._heartbeat.record_id
    clock.advance(LEASE * 3 + 1)
    janitor = make(store, clock, probe, policy=policy)
    assert janitor.prune_owners() == 0  # expired now, deleted a retention later
    [ended] = store.select(OWNER_KIND, where={"owner_token": REMOTE.token})
    assert ended.state is OwnerState.GONE
    remote.heartbeat()
    assert remote._heartbeat.record_id not in (None, first)
    record(remote)
    assert janitor.sweep_recoverable() == []
    clock.advance(LEASE * 2 + 1)
    remote.heartbeat()
    assert janitor.prune_owners() == 1  # the old, ended record
    assert [r.state for r in store.select(OWNER_KIND)] == [OwnerState.ALIVE]


def test_records_rotate_so_their_history_stays_bounded(
    store: Store, clock: FakeClock, probe: FakeProbe, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After many beats a record is replaced: the new one joins before the old one leaves, so
    the owner is never without a live lease."""
    monkeypatch.setattr("statecore.leases._ROTATE_AFTER", 3)
    remote = make(store, clock, probe, REMOTE)
    remote.heartbeat()
    first = remote._heartbeat.record_id
    for _ in range(3):
        clock.advance(1)
        remote.heartbeat()
    assert remote._heartbeat.record_id != first
    states = {r.id: r.state for r in store.select(OWNER_KIND)}
    assert states == {first: OwnerState.GONE, remote._heartbeat.record_id: OwnerState.ALIVE}
    assert OwnerLeases(store).beating(REMOTE.token, clock.now()) is True


# -- asyncio -------------------------------------------------------------------------------------


@pytest.mark.asyncio
async def test_async_ledger_beats_and_leaves(store: Store, clock: FakeClock) -> None:
    """AsyncLedger's heartbeat and leave are the ledger's, off the event loop."""
    async with AsyncLedger(store, clock=clock, incarnation=REMOTE, probe=FakeProbe()) as ledger:
        assert await ledger.heartbeat() == clock.now() + LEASE
        assert OwnerLeases(store).beating(REMOTE.token, clock.now()) is True
        assert await ledger.leave() is True
        assert OwnerLeases(store).beating(REMOTE.token, clock.now()) is False
        assert await ledger.prune_owners(now=clock.now() + POLICY.retention + 1) == 1
