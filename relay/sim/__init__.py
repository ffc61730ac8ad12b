"""Deterministic simulation: seeded worlds of crashes, partitions and clock jumps, on virtual
time, with the guarantees checked after every run.

A world (:class:`~relay.sim.world.World`) runs in one thread on virtual time: a connector, two
gateways (one per tenant) and a chat platform, talking over an in-memory network that carries
the relay's frames as the wire does -- encoded by :func:`relay.wire.codec.encode`, read back by
a :class:`~relay.wire.codec.FrameDecoder` per connection.  The parts that hold the guarantees
are the real ones: each gateway's :class:`~statecore.Ledger` (records, claims, fencing, the
recovery and runtime sweeps) on its own store, the connector's
:class:`~relay.connector.buffer.InboundBuffer` on its store; stores are real (in memory, or
SQLite files), so a crash drops every in-memory object of a process and keeps its store.  What
is modelled around them is the event flow of the gateway runtime and the connector (who sends
which frame when), small and explicit in :mod:`relay.sim.gateway` and
:mod:`relay.sim.connector`.

Everything that varies comes from the seed: the users' writes, every delay, and the fault
schedule (:mod:`relay.sim.faults`), drawn before the run starts.  The same seed replays the
same steps exactly (the trace of one run equals the trace of another).  After the faults stop,
the world heals (every process up, every link healed) and runs to quiescence; then
:mod:`relay.sim.invariants` checks what users saw and what the stores hold.

Run ``python -m relay.sim --seeds 10000`` (``make sim SEEDS=10000``); a failing seed prints its
fault schedule and ``--seed N --trace`` replays it step by step.

:mod:`relay.sim.real` runs the same worlds with the **real runtime** instead of the models --
the real ``Connector``, ``Gateway``, relay transport and ``websockets`` -- on
:class:`relay.sim.loop.SimLoop`, a deterministic asyncio loop on virtual time with no threads,
process lives a crash kills outright, and an in-memory network (:mod:`relay.sim.sockets`).
``python -m relay.sim --real`` (``make sim-real``) runs those.
"""
