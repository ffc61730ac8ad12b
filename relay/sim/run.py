"""One seeded run: build the world, let users write while the faults land, heal, run to
quiescence, check.  :func:`run_seed` is all a caller needs."""

from __future__ import annotations

import collections
import contextlib
import tempfile
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import attrs

from relay.sim.connector import SimConnector
from relay.sim.faults import Fault, FlakyStore, schedule
from relay.sim.gateway import SimGateway, SimProbe
from relay.sim.invariants import Verdict, check_world
from relay.sim.net import Network
from relay.sim.platform import PlatformState, SimPlatform, gateway_tenants
from relay.sim.world import World
from statecore.store import Store
from stores import InMemoryStore, SQLiteStore

__all__ = ["Outcome", "disks", "quiet", "run_seed", "shrink", "store_kind"]

WRITING_S = 20.0
"""How long users write (and faults land)."""
QUIET_LIMIT_S = 300.0
"""The bound on the quiet period after the faults (virtual seconds)."""


@attrs.frozen
class Outcome:
    """What one run did and found."""

    seed: int
    store: str
    faults: tuple[Fault, ...]
    verdict: Verdict
    trace: tuple[str, ...]
    steps: int
    quiet_after_s: float

    @property
    def ok(self) -> bool:
        """No violation."""
        return not self.verdict.violations


def store_kind(seed: int) -> str:
    """The kind of store the world of ``seed`` runs on: ``sqlite`` (one seed in four) or
    ``memory``."""
    return "sqlite" if seed % 4 == 0 else "memory"


@contextlib.contextmanager
def disks(kind: str) -> Iterator[dict[str, InMemoryStore | Path]]:
    """The disk of each process of a world (the connector and every gateway): a store in
    memory, or (``sqlite``) the path of its database file, in a directory removed after."""
    names = ["connector", *gateway_tenants()]
    if kind == "memory":
        yield {name: InMemoryStore() for name in names}
        return
    with tempfile.TemporaryDirectory(prefix="statecore-sim-") as tmp:
        yield {name: Path(tmp) / f"{name}.db" for name in names}


@contextlib.contextmanager
def _stores(kind: str) -> Iterator[dict[str, Store]]:
    """Each process's store, open for the whole run (a SQLite file is closed after)."""
    with disks(kind) as found:
        made: dict[str, Store] = {
            name: SQLiteStore(disk) if isinstance(disk, Path) else disk
            for name, disk in found.items()
        }
        try:
            yield made
        finally:
            for store in made.values():
                if isinstance(store, SQLiteStore):
                    store.close()


def run_seed(seed: int, *, trace: bool = False, faults: Sequence[Fault] | None = None) -> Outcome:
    """Run the world of ``seed`` (see the module docs); ``trace`` keeps every step.

    ``faults`` replaces the seed's own schedule (the shrinker's smaller ones); the schedule is
    still drawn, so that everything else the seed decides stays the same."""
    world = World(seed)
    kind = store_kind(seed)
    gateway_ids = gateway_tenants()
    drawn = schedule(
        world.rng, seconds=WRITING_S, gateways=list(gateway_ids), count=world.rng.randint(2, 12)
    )
    faults = list(drawn if faults is None else faults)
    with _stores(kind) as stores:
        flaky = {name: FlakyStore(store) for name, store in stores.items()}
        net = Network(world)
        platform = SimPlatform(world)
        handled: set[tuple[str, str]] = set()
        acked_unhandled: list[str] = []

        def on_ack(gateway_id: str, buffer_id: str) -> None:
            if (gateway_id, buffer_id) not in handled:
                acked_unhandled.append(f"{gateway_id} {buffer_id}")

        connector = SimConnector(world, platform, flaky["connector"], gateway_ids, on_ack)
        platform.connector = connector
        probe = SimProbe()
        gateways = {
            gid: SimGateway(
                world,
                net,
                gid,
                store=flaky[gid],
                probe=probe,
                connector_attach=connector.attach,
                on_handled=lambda g, b: handled.add((g, b)),
            )
            for gid in gateway_ids
        }
        connector.start()
        for gateway in gateways.values():
            gateway.start()
        parts = _Parts(world, connector, gateways, net, platform, flaky)
        for fault in faults:
            world.at(fault.at, f"fault {fault.kind}", parts.injector(fault))
        writes = 0
        t = 0.2
        while t < WRITING_S:
            world.at(t, "write", platform.write)
            writes += 1
            t += world.rng.expovariate(2.0)
        world.run(WRITING_S + 8.0)
        # Heal: every fault lifted, every process up; the gateways restart once (the last
        # budgeted attempt of a reply is kept for a restart, by design).
        world.log("heal")
        parts.heal()
        for gateway in gateways.values():
            gateway.crash()
            gateway.start()
        began = world.now
        while world.now - began < QUIET_LIMIT_S:
            world.run(world.now + 2.0)
            if quiet(platform, stores):
                break
        verdict = check_world(
            platform,
            gateway_stores={g: stores[g] for g in gateway_ids},
            gateway_tenants=gateway_ids,
            connector_store=stores["connector"],
            acked_unhandled=acked_unhandled,
            protocol_errors=net.protocol_errors,
        )
        return Outcome(
            seed,
            kind,
            tuple(faults),
            verdict,
            tuple(world.trace) if trace else (),
            world.steps,
            world.now - began,
        )


def quiet(platform: PlatformState, stores: dict[str, Store]) -> bool:
    """Every message accepted, and nothing owed or unacked anywhere."""
    from relay.connector.buffer import BUFFER, BUFFER_KIND  # noqa: PLC0415
    from statecore.lifecycles import OBLIGATION  # noqa: PLC0415
    from statecore.obligation import OBLIGATION_KIND  # noqa: PLC0415

    if len(platform.accepted) != len(platform.written):
        return False
    owed = frozenset(OBLIGATION.states) - OBLIGATION.terminal
    for name, store in stores.items():
        if name == "connector":
            if store.count(BUFFER_KIND, states=BUFFER.sources("ack")):
                return False
        elif store.count(OBLIGATION_KIND, states=owed):
            return False
    return True


@attrs.frozen
class _Parts:
    """The parts a fault lands on."""

    world: World
    connector: SimConnector
    gateways: dict[str, SimGateway]
    net: Network
    platform: SimPlatform
    stores: dict[str, FlakyStore]

    def rotate(self, fault: Fault) -> None:
        """A new secret in front at the connector now; the gateway takes it after
        ``fault.size`` s; the connector drops the old one after a random while -- sometimes
        before the gateway switched (its dials are refused until it does)."""
        gateway = self.gateways[fault.target]
        accepted = self.connector.secrets[gateway.gateway_id]
        new = f"{gateway.gateway_id}-secret-{len(accepted) + 1}-{fault.at:.3f}"
        accepted.insert(0, new)

        def switch() -> None:
            gateway.secret = new

        def drop_old() -> None:
            del accepted[1:]

        self.world.at(fault.size, "gateway takes the new secret", switch)
        self.world.at(self.world.rng.uniform(0.0, 8.0), "connector drops old secrets", drop_old)

    def heal(self) -> None:
        """Every fault lifted: clocks set right, stores and platform well, every gateway on
        its newest secret, every process up, every link healed."""
        for store in self.stores.values():
            store.fail_writes = 0
        self.platform.refuse_next = self.platform.duplicate_next = 0
        self.platform.slow_until = self.net.spike_until = -1.0
        self.connector.clock.offset = 0.0
        if not self.connector.up:
            self.connector.start()
        for gateway in self.gateways.values():
            gateway.clock.offset = 0.0
            gateway.secret = self.connector.secrets[gateway.gateway_id][0]
            if gateway.conn is not None:
                gateway.conn.partition(False)

    def injector(self, fault: Fault) -> Callable[[], None]:
        """The event that injects ``fault``."""
        return lambda: self.inject(fault)

    def inject(self, fault: Fault) -> None:
        """Inject ``fault`` now (a crash of a process already down changes nothing)."""
        world, kind = self.world, fault.kind
        world.log(f"FAULT {fault}")
        if kind == "crash_gateway":
            gateway = self.gateways[fault.target]
            if gateway.up:
                gateway.crash()
                world.at(fault.size, "restart", gateway.start)
        elif kind == "crash_connector":
            if self.connector.up:
                self.connector.crash()
                world.at(fault.size, "restart", self.connector.start)
        elif kind in ("drop_connection", "partition"):
            conn = self.gateways[fault.target].conn
            if conn is not None and kind == "drop_connection":
                conn.cut("dropped")
            elif conn is not None:
                conn.partition(True)
                world.at(fault.size, "heal", lambda: conn.partition(False))
        elif kind == "delay_spike":
            self.net.spike_until = world.now + fault.size
        elif kind == "clock_jump":
            clock = self.connector.clock if fault.target == "connector" else None
            clock = clock or self.gateways[fault.target].clock
            clock.offset += fault.size
        elif kind == "secret_rotation":
            self.rotate(fault)
        elif kind == "store_fail":
            self.stores[fault.target].fail_writes += int(fault.size)
        elif kind == "platform_refuse":
            self.platform.refuse_next += int(fault.size)
        elif kind == "platform_slow":
            self.platform.slow_until = world.now + fault.size
        elif kind == "duplicate_delivery":
            self.platform.duplicate_next += int(fault.size)


def shrink(seed: int, run: Callable[..., Outcome] = run_seed) -> list[Fault]:
    """A smaller fault schedule on which ``seed``'s world still fails: each fault is dropped
    in turn, and kept out while the run still fails (one pass, then again until nothing more
    can go).  Returns the seed's whole schedule when the run does not fail at all.  ``run``
    is how a seed runs (default :func:`run_seed`; :func:`relay.sim.real.run_real_seed` for
    the real runtime)."""
    faults = list(run(seed).faults)
    if run(seed, faults=faults).ok:
        return faults
    shrunk = True
    while shrunk:
        shrunk = False
        for fault in list(faults):
            fewer = [f for f in faults if f is not fault]
            if not run(seed, faults=fewer).ok:
                faults, shrunk = fewer, True
    return faults


def fault_counts(outcomes: list[Outcome]) -> collections.Counter[str]:
    """Faults injected, by kind, over ``outcomes``."""
    return collections.Counter(f.kind for o in outcomes for f in o.faults)
