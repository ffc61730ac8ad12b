"""One seeded world of the **real runtime**: the real ``Connector``, two real ``Gateway``
processes (echo bots, one per tenant) with ``WebSocketRelayTransport`` and ``RelayAdapter``,
and ``websockets`` itself, all on one :class:`~relay.sim.loop.SimLoop` -- virtual time, no
threads, an in-memory network -- so that a seed decides every step and replays exactly.

Nothing here models the runtime: the code that runs is the code users run.  The world only
plays what is around it -- the chat platform (:class:`~relay.sim.driver.SimDriver`), the hosts
(each process a :class:`~relay.sim.loop.Life` that a crash kills with no cleanup), the network
(latency, spikes, partitions, resets, half-open sockets), the disks (stores that outlive their
processes, failing writes on demand), the hosts' clocks (jumping wall clocks) and the operator
(rotating secrets, restarting what crashed) -- and the entropy: while a world runs, every draw
the runtime and ``websockets`` make from the process (``secrets``, ``uuid.uuid4``, the
``random`` module's own generator, ``time.time``) comes from the seed instead
(:func:`_seeded_process`), and each life of the connector is given a bufferId origin derived
from the seed, so that a seed replays byte for byte in any process, whatever its
``PYTHONHASHSEED``.  Never run a world in a process that does real work meanwhile: its tokens
and ids would be the world's.  The checks are the model worlds' own
(:func:`relay.sim.invariants.check_world`), plus: no gateway handled a message of another
tenant, no buffered entry was acked before its handler returned, and the loop saw no
unexpected error in a living process.  Which gateway asked for each send is what its
transport asked for; the protocol errors counted are the invalid frames the runtime's readers
logged.

:func:`run_real_seed` is all a caller needs; ``python -m relay.sim --real`` runs many.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import random
import secrets
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from relay.client.adapter import RelayAdapter
from relay.client.dedupe import StoreBufferDedupe
from relay.client.requests import RequestResult
from relay.client.transport import WebSocketRelayTransport
from relay.connector.buffer import BUFFER_KIND
from relay.connector.platform import target_chat
from relay.connector.server import Connector
from relay.sim.driver import SimDriver
from relay.sim.faults import REAL_KINDS, Fault, FlakyStore, schedule
from relay.sim.gateway import HOST, POLICY, SimProbe
from relay.sim.invariants import Verdict, check_world
from relay.sim.lives import PROCESS, Life
from relay.sim.loop import LoopClock, SimLoop, collect_quietly
from relay.sim.platform import PLATFORM, gateway_tenants
from relay.sim.run import QUIET_LIMIT_S, WRITING_S, Outcome, disks, quiet, store_kind
from relay.sim.world import EPOCH
from relay.wire.codec import decode_event
from statecore.entity import EntityKind
from statecore.gateway import Gateway, Turn
from statecore.ownership import Incarnation
from statecore.store import Store
from stores import SQLiteStore

__all__ = ["run_real_seed"]

CONNECTOR_HOST = "127.0.0.1"
"""Where the connector listens on the simulated network (one address space for the world)."""
PORT = 7000
URL = f"ws://{CONNECTOR_HOST}:{PORT}"
_INVALID_FRAME = "sent an invalid frame"
"""What the runtime's readers (the connector's and the gateways') log for each invalid frame
they read (a rate limit may fold several into one line)."""


class _TellingTransport(WebSocketRelayTransport):
    """The real transport, telling ``asking(action)`` of each send before it asks for it."""

    def __init__(
        self, *args: Any, asking: Callable[[Mapping[str, Any]], None], **kwargs: Any
    ) -> None:
        super().__init__(*args, **kwargs)
        self._asking = asking

    async def request(self, action: Mapping[str, Any], **kwargs: Any) -> RequestResult:
        self._asking(action)
        return await super().request(action, **kwargs)


class _World:
    """The parts of one world and the operator's hands on them.  ``logged`` takes the
    runtime's log lines: the world's trace."""

    def __init__(
        self,
        loop: SimLoop,
        rng: random.Random,
        stores: dict[str, Any],
        logged: _TraceHandler,
        *,
        seed: int,
    ) -> None:
        self.loop = loop
        self.rng = rng
        self.seed = seed
        self.logged = logged
        self.trace = logged.lines
        self.gateway_ids = gateway_tenants()
        self.secrets: dict[str, list[str]] = {g: [f"{g}-secret-0"] for g in self.gateway_ids}
        self.gateway_secret = {g: s[0] for g, s in self.secrets.items()}
        self.clocks = {name: LoopClock(loop) for name in ["connector", *self.gateway_ids]}
        self.opened = stores  # name -> a store (memory) or a path (SQLite: opened per life)
        self.flaky: dict[str, FlakyStore] = {}
        self.lives: dict[str, Life | None] = dict.fromkeys(self.clocks)
        self.born = 0
        self.probe = SimProbe()
        self.connector: Connector | None = None
        self.platform = SimDriver(loop, rng, self.log, self._life("platform"))
        self.handled: set[tuple[str, str]] = set()  # (gateway, message id): handler returned
        self.misrouted: list[str] = []
        self.acked_unhandled: list[str] = []

    def log(self, what: str) -> None:
        """Record one step in the trace."""
        self.trace.append(f"{self.loop.time():10.4f} {what}")

    def _life(self, name: str) -> Life:
        self.born += 1
        return Life(name, name, self.born)

    # -- stores: the disks outlive the processes -----------------------------------------------

    def store(self, name: str) -> FlakyStore:
        """The store a new life of ``name`` opens (the same failures still pending)."""
        opened = self.opened[name]
        inner: Store = SQLiteStore(opened) if isinstance(opened, Path) else opened
        old = self.flaky.get(name)
        if old is not None and isinstance(opened, Path):
            old.inner.close()  # the dead life's file handles (the kernel closes them)
        watch = self._watch if name == "connector" else None
        flaky = FlakyStore(inner, watch=watch)
        flaky.fail_writes = old.fail_writes if old is not None else 0
        self.flaky[name] = flaky
        return flaky

    def _watch(self, kind: EntityKind[Any], ids: Sequence[str], event: str) -> None:
        """The connector is about to ack buffered entries: each one's handler must have
        returned already."""
        if kind is not BUFFER_KIND or event != "ack":
            return
        inner = self.flaky["connector"].inner
        for buffer_id in ids:
            row = inner.get(BUFFER_KIND, buffer_id)
            if row is None:
                continue
            message = decode_event(row.values["event_json"]).message_id
            gateway = str(row.values["gateway_id"])
            if (gateway, str(message)) not in self.handled:
                self.acked_unhandled.append(f"{gateway} {buffer_id} ({message})")

    # -- processes -----------------------------------------------------------------------------

    def up(self, name: str) -> bool:
        """Whether a life of ``name`` runs."""
        life = self.lives[name]
        return life is not None and life not in self.loop.dead

    def start(self, name: str) -> None:
        """Start a new life of ``name`` (nothing when one runs)."""
        if self.up(name):
            return
        life = self._life(name)
        self.lives[name] = life
        self.log(f"start {life}")
        if name == "connector":
            task = self.loop.spawn(life, self._connector_main)
        else:
            self.probe.alive[life.n] = life.n
            task = self.loop.spawn(life, lambda: self._gateway_main(name, life))
        task.add_done_callback(lambda done: self._exited(name, life, done))

    def _exited(self, name: str, life: Life, task: asyncio.Task[None]) -> None:
        """A process's main returned or raised (its start failed: a store it could not
        write): it exits, and its supervisor starts it again a second later."""
        error = None if task.cancelled() else task.exception()
        self.log(f"{life} exits: {error!r}")
        self.crash(name)
        self.loop.call_later(1.0, self.start, name)

    def crash(self, name: str) -> None:
        """SIGKILL the running life of ``name``."""
        life = self.lives[name]
        if life is None or life in self.loop.dead:
            return
        self.log(f"kill {life}")
        self.loop.kill(life)
        self.probe.alive.pop(life.n, None)
        if name == "connector":
            self.connector = None

    async def _connector_main(self) -> None:
        life = self.lives["connector"]
        assert life is not None  # set by start() before this life was spawned
        connector = Connector(
            self.store("connector"),
            secrets=self.secrets,
            drivers={PLATFORM: self.platform},
            tenants={g: [t] for g, t in self.gateway_ids.items()},
            clock=self.clocks["connector"],
            liveness_probe_s=5.0,
            store_threads=False,
            buffer_origin=_buffer_origin(self.seed, life.n),
        )
        await connector.start(CONNECTOR_HOST, PORT)
        self.connector = connector
        await asyncio.Event().wait()  # serve until killed

    async def _gateway_main(self, gateway_id: str, life: Life) -> None:
        store = self.store(gateway_id)
        clock = self.clocks[gateway_id]
        transport = _TellingTransport(
            URL,
            PLATFORM,
            "bot",
            gateway_id=gateway_id,
            secret=self.gateway_secret[gateway_id],
            dedupe=StoreBufferDedupe(store, clock=clock, threads=False),
            clock=clock,
            teardown_clock=clock,
            rng=random.Random(self.rng.random()),
            reconnect_backoff_s=0.2,
            reconnect_max_s=4.0,
            request_timeout_s=6.0,
            asking=lambda action: self._asked(gateway_id, action),
        )
        gateway = Gateway(
            store,
            clock=clock,
            teardown_clock=clock,
            incarnation=Incarnation(HOST, life.n, life.n, f"{gateway_id}-{life.n}"),
            probe=self.probe,
            policy=POLICY,
            retry_interval_s=2.0,
            stuck_after_s=8.0,
            recover_interval_s=5.0,
            store_threads=False,
        )
        gateway.add_adapter(PLATFORM, RelayAdapter(transport))
        tenant = self.gateway_ids[gateway_id]
        rng = random.Random(self.rng.random())

        async def echo(turn: Turn) -> None:
            message = turn.message
            if not message.chat_id.startswith(f"{tenant}-"):
                self.misrouted.append(f"{gateway_id} got {message.message_id} of {message.chat_id}")
            await clock.sleep(rng.uniform(0.0, 0.3))  # the bot's work
            await turn.reply(f"echo: {message.text}")
            self.handled.add((gateway_id, str(message.message_id)))

        gateway.on_message(echo)
        await gateway.start()
        await asyncio.Event().wait()  # serve until killed

    def _asked(self, gateway_id: str, action: Mapping[str, Any]) -> None:
        """A gateway's transport asks for ``action``: the platform learns who asked for it."""
        chat, content = target_chat(action), action.get("content")
        if chat is not None and isinstance(content, str):
            self.platform.asked.setdefault((chat, content), set()).add(gateway_id)

    # -- faults --------------------------------------------------------------------------------

    def inject(self, fault: Fault) -> None:
        """Inject ``fault`` now (a crash of a process already down changes nothing)."""
        kind, target = fault.kind, fault.target
        self.log(f"FAULT {fault}")
        later = self.loop.call_later
        if kind in ("crash_gateway", "crash_connector"):
            if self.up(target):
                self.crash(target)
                later(fault.size, self.start, target)
        elif kind == "drop_connection":
            for end in list(self.loop.net.ends):
                if end.host == target:
                    end.abort()
        elif kind == "partition":
            self.loop.net.partition(target, True)
            later(fault.size, self.loop.net.partition, target, False)
        elif kind == "half_open":
            self.log(f"{self.loop.net.black_hole(target)} connections of {target} half-open")
        elif kind == "delay_spike":
            self.loop.net.spike_until = self.loop.time() + fault.size
        elif kind == "clock_jump":
            self.clocks[target].offset += fault.size
        elif kind == "secret_rotation":
            self._rotate(target, fault.size)
        elif kind == "store_fail":
            self.flaky[target].fail_writes += int(fault.size)
        elif kind == "platform_refuse":
            self.platform.refuse_next += int(fault.size)
        elif kind == "platform_slow":
            self.platform.slow_until = self.loop.time() + fault.size
        elif kind == "duplicate_delivery":
            self.platform.duplicate_next += int(fault.size)

    def _rotate(self, gateway_id: str, after_s: float) -> None:
        """A new secret in front at the connector now; the gateway is redeployed with it after
        ``after_s``; the connector drops the old one after a random while -- sometimes before
        the gateway switched (its dials are refused until it does)."""
        accepted = self.secrets[gateway_id]
        new = f"{gateway_id}-secret-{len(accepted)}-{self.loop.time():.3f}"
        accepted.insert(0, new)
        self._tell_connector()

        def redeploy() -> None:
            self.gateway_secret[gateway_id] = new
            if self.up(gateway_id):
                self.crash(gateway_id)
                self.start(gateway_id)

        def drop_old() -> None:
            del accepted[1:]
            self._tell_connector()

        self.loop.call_later(after_s, redeploy)
        self.loop.call_later(self.rng.uniform(0.0, 8.0), drop_old)

    def _tell_connector(self) -> None:
        """The operator updates the running connector's secrets (its config reload)."""
        if self.connector is not None:
            for gateway_id, accepted in self.secrets.items():
                self.connector.secrets[gateway_id] = list(accepted)

    def heal(self) -> None:
        """Every fault lifted: clocks right, stores and platform well, every gateway on its
        newest secret, links healed, every process up -- and the gateways restarted once (the
        last budgeted attempt of a reply is kept for a restart, by design)."""
        self.log("heal")
        for flaky in self.flaky.values():
            flaky.fail_writes = 0
        self.platform.refuse_next = self.platform.duplicate_next = 0
        self.platform.slow_until = self.loop.net.spike_until = -1.0
        for clock in self.clocks.values():
            clock.offset = 0.0
        for host in list(self.loop.net.partitioned):
            self.loop.net.partition(host, False)
        for gateway_id in self.gateway_ids:
            self.gateway_secret[gateway_id] = self.secrets[gateway_id][0]
            self.crash(gateway_id)
            self.start(gateway_id)
        self.start("connector")

    def verdict(self) -> Verdict:
        """Check the quiet world."""
        inner = {name: flaky.inner for name, flaky in self.flaky.items()}
        verdict = check_world(
            self.platform,
            gateway_stores={g: inner[g] for g in self.gateway_ids},
            gateway_tenants=self.gateway_ids,
            connector_store=inner["connector"],
            acked_unhandled=self.acked_unhandled,
            protocol_errors=self.logged.invalid_frames,
        )
        verdict.expect_none(self.misrouted, "a message of another tenant")
        errors = [e for e in self.loop.errors if "was destroyed but it is pending" not in e]
        verdict.expect_none(errors, "unexpected error in a living process")
        return verdict


def run_real_seed(
    seed: int, *, trace: bool = False, faults: Sequence[Fault] | None = None
) -> Outcome:
    """Run the world of ``seed`` with the real runtime (see the module docs); ``faults``
    replaces the seed's own schedule, which is still drawn."""
    rng = random.Random(seed)
    kind = store_kind(seed)
    drawn = schedule(
        rng,
        seconds=WRITING_S,
        gateways=list(gateway_tenants()),
        count=rng.randint(2, 12),
        kinds=REAL_KINDS,
    )
    chosen = list(drawn if faults is None else faults)
    verdict, lines, steps, quiet_after = _simulate(seed, rng, kind, chosen)
    collect_quietly()  # the world is unreferenced now: every coroutine of it goes here
    return Outcome(
        seed,
        kind,
        tuple(chosen),
        verdict,
        tuple(lines) if trace else (),
        steps,
        quiet_after,
    )


def _buffer_origin(seed: int, life: int) -> str:
    """The bufferId origin of the connector's life number ``life`` in the world of ``seed``:
    six hex digits, as long as a random one (so that every frame keeps its size), and another
    for every life (a restarted connector hands out ids of its own).  Raises nothing."""
    return hashlib.sha256(f"real world {seed}, connector life {life}".encode()).hexdigest()[:6]


def _simulate(
    seed: int, rng: random.Random, kind: str, faults: list[Fault]
) -> tuple[Verdict, list[str], int, float]:
    """Build the world on its own loop, play it, check it: (verdict, trace, loop turns, quiet
    after).  Nothing of the world outlives this call but what it returns."""
    loop = SimLoop(random.Random(rng.random()))
    try:
        with (
            disks(kind) as found,
            _logs_into(loop) as logged,
            _seeded_process(random.Random(f"real world {seed}: entropy"), loop),
        ):
            world = _World(loop, rng, found, logged, seed=seed)
            verdict, lines, quiet_after = _run(world, faults)
    finally:
        loop.bury()
        loop.close()
    return verdict, lines, loop.steps, quiet_after


class _TraceHandler(logging.Handler):
    """Puts the runtime's log lines into the trace, with virtual time and the life."""

    def __init__(self, loop: SimLoop, lines: list[str]) -> None:
        super().__init__(logging.INFO)
        self.loop = loop
        self.lines = lines
        self.invalid_frames = 0
        """Lines of the runtime's readers that report invalid frames they read."""

    def emit(self, record: logging.LogRecord) -> None:
        if _INVALID_FRAME in str(record.msg):
            self.invalid_frames += 1
        life = PROCESS.get()
        self.lines.append(
            f"{self.loop.time():10.4f} [{life or 'world'}] {record.name}: {record.getMessage()}"
        )


@contextlib.contextmanager
def _seeded_process(entropy: random.Random, loop: SimLoop) -> Iterator[None]:
    """While the world runs, what the process would draw from the operating system or the
    real time comes from ``entropy`` and the loop instead: ``secrets.token_bytes`` (and so
    ``token_hex``: the transports' request ids, the gateways' owner records, ``websockets``'
    masks and handshake keys), ``uuid.uuid4`` (session ids, ``websockets``' connection ids),
    the ``random`` module's shared generator (``websockets``' ping payloads) and ``time.time``
    (the virtual wall clock: ``websockets``' ``Date`` header).  Each draw keeps its size, so a
    frame is as long as it would be.  Everything is put back afterwards, however the world
    ends."""

    def token_bytes(nbytes: int | None = None) -> bytes:
        return entropy.randbytes(32 if nbytes is None else nbytes)

    def uuid4() -> uuid.UUID:
        return uuid.UUID(bytes=entropy.randbytes(16), version=4)

    def wall_time() -> float:
        return EPOCH + loop.time()

    shared = random.getstate()
    replaced: list[tuple[ModuleType, str, object]] = [
        (secrets, "token_bytes", token_bytes),
        (uuid, "uuid4", uuid4),
        (time, "time", wall_time),
    ]
    originals = [(module, name, getattr(module, name)) for module, name, _ in replaced]
    random.seed(entropy.random())
    for module, name, substitute in replaced:
        setattr(module, name, substitute)
    try:
        yield
    finally:
        for module, name, original in originals:
            setattr(module, name, original)
        random.setstate(shared)


@contextlib.contextmanager
def _logs_into(loop: SimLoop) -> Iterator[_TraceHandler]:
    """While the world runs, the runtime's INFO lines go into its trace (and nowhere else)."""
    handler = _TraceHandler(loop, [])
    saved = []
    for name in ("relay", "statecore", "stores"):
        logger = logging.getLogger(name)
        saved.append((logger, logger.level, logger.propagate))
        logger.setLevel(logging.INFO)
        logger.propagate = False
        logger.addHandler(handler)
    try:
        yield handler
    finally:
        for logger, level, propagate in saved:
            logger.removeHandler(handler)
            logger.setLevel(level)
            logger.propagate = propagate


def _run(world: _World, faults: list[Fault]) -> tuple[Verdict, list[str], float]:
    """Play ``world`` and check it; close the files it opened."""
    try:
        quiet_after = world.loop.run_until_complete(_play(world, faults))
        return world.verdict(), world.trace, quiet_after
    finally:
        for flaky in world.flaky.values():
            if isinstance(flaky.inner, SQLiteStore):
                flaky.inner.close()


async def _play(world: _World, faults: list[Fault]) -> float:
    """Users write while the faults land; heal; run until quiet.  Returns how long the world
    took to go quiet after the heal (virtual seconds)."""
    loop = world.loop
    world.start("connector")
    for gateway_id in world.gateway_ids:
        world.start(gateway_id)
    for fault in faults:
        loop.call_later(fault.at, world.inject, fault)
    t = 0.2
    while t < WRITING_S:
        loop.call_later(t, world.platform.write)
        t += world.rng.expovariate(2.0)
    await asyncio.sleep(WRITING_S + 8.0)
    world.heal()
    began = loop.time()
    while loop.time() - began < QUIET_LIMIT_S:
        await asyncio.sleep(2.0)
        stores = {name: flaky.inner for name, flaky in world.flaky.items()}
        if quiet(world.platform, stores):
            break
    return loop.time() - began
