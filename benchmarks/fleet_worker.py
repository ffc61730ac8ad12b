"""The child processes of ``bench_fleet.py``: a statecore gateway, or a peer queue's producer or
worker, each its own process on the benchmark's PostgreSQL server.

Run by ``bench_fleet.py`` only: ``python fleet_worker.py '<json spec>'`` with the server's URL
in ``$STATECORE_BENCH_PG_URL`` (never on a command line).  The spec names the ``role``
(``statecore``, ``procrastinate-producer``, ``procrastinate-worker``, ``pgqueuer-producer``,
``pgqueuer-worker``), the ``shape`` (``each``: one item per commit, one in flight per process;
``batched``: ``concurrency`` in flight per process, batched where the library's public API
offers it) and the child's share of the work.

Protocol: the child sets everything up (connections, schema registration, listeners), prints
``ready`` and waits for a line on stdin; the parent sends ``go`` to every child at once.  A
statecore gateway and a producer then do their share and print one JSON line (what they did,
their own elapsed time) and exit; a peer's worker runs until SIGTERM, which stops it the
library's own way.  The parent, not the children, judges when every item is done (it counts
settled rows in the database), so every contender is timed the same way.
"""

from __future__ import annotations

import asyncio
import cProfile
import json
import logging
import os
import signal
import sys
import time
from datetime import timedelta
from typing import Any

import procrastinate
import psycopg

# The payload of bench_postgres.py: the same five fields for every contender.
from bench_postgres import _PAYLOAD

QUEUE = "bench"
ENTRYPOINT = "deliver"
STATECORE_SCHEMA = "fleet"
# How long an idle peer worker waits before polling again when no NOTIFY woke it (both peers
# are woken by LISTEN/NOTIFY on enqueue; this only bounds a missed wake-up).
IDLE_POLL_S = 0.1
logging.getLogger("procrastinate").setLevel(logging.ERROR)
logging.getLogger("pgqueuer").setLevel(logging.ERROR)


def _ready_then_wait() -> None:
    """Say ``ready`` and block until the parent says ``go`` (EOF: the parent gave up)."""
    print("ready", flush=True)
    if sys.stdin.readline().strip() != "go":
        sys.exit(3)


def _done(**result: Any) -> None:
    print(json.dumps(result), flush=True)


# -- statecore: a gateway's ledger --------------------------------------------------------------


def _no_op_send(obligation: Any) -> None:
    """The platform call: nothing (the benchmark measures the ledger, not a platform)."""


def statecore_each(url: str, index: int, share: int) -> dict[str, Any]:
    """``share`` obligations, one at a time, as a gateway sends one reply: ``Ledger.record``,
    ``mark_attempting``, the send, ``mark_delivered``; three commits each."""
    from statecore import Ledger  # noqa: PLC0415 -- only the statecore children need it
    from stores.postgres import PostgresStore  # noqa: PLC0415

    store = PostgresStore(url, schema=STATECORE_SCHEMA, pool_size=2)
    try:
        ledger = Ledger(store)
        ledger.heartbeat()  # as a gateway's timer does before it sends
        ledger.sweep_recoverable()  # a gateway's startup sweep (nothing to claim here)
        _ready_then_wait()
        start = time.perf_counter()
        for i in range(share):
            ob = ledger.record(**_PAYLOAD, message_ref=f"g{index}-m{i}")
            ledger.mark_attempting(ob.obligation_id)
            _no_op_send(ob)
            ledger.mark_delivered(ob.obligation_id)
        return {"done": share, "elapsed_s": time.perf_counter() - start}
    finally:
        store.close()


def statecore_batched(url: str, index: int, share: int, concurrency: int) -> dict[str, Any]:
    """``share`` obligations, ``concurrency`` sends in flight at once through one
    ``AsyncLedger`` (its writer commits the operations queued meanwhile together: the group
    commit a gateway gets when many sessions reply at once)."""
    from statecore import AsyncLedger  # noqa: PLC0415
    from stores.postgres import PostgresStore  # noqa: PLC0415

    store = PostgresStore(url, schema=STATECORE_SCHEMA, pool_size=4)

    async def sender(ledger: Any, refs: range) -> None:
        for i in refs:
            ob = await ledger.record(**_PAYLOAD, message_ref=f"g{index}-m{i}")
            await ledger.mark_attempting(ob.obligation_id)
            _no_op_send(ob)
            await ledger.mark_delivered(ob.obligation_id)

    async def run() -> dict[str, Any]:
        async with AsyncLedger(store) as ledger:
            await ledger.heartbeat()
            await ledger.sweep_recoverable()
            await asyncio.to_thread(_ready_then_wait)
            start = time.perf_counter()
            await asyncio.gather(
                *(sender(ledger, range(k, share, concurrency)) for k in range(concurrency))
            )
            elapsed = time.perf_counter() - start
            batches, ops = ledger.batches, ledger.operations
        return {"done": share, "elapsed_s": elapsed, "batches": batches, "operations": ops}

    try:
        return asyncio.run(run())
    finally:
        store.close()


# -- procrastinate ------------------------------------------------------------------------------


def _procrastinate_app(url: str, pool: int) -> procrastinate.App:
    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool)
    app = procrastinate.App(connector=connector)

    @app.task(name=ENTRYPOINT, queue=QUEUE)
    async def deliver(**payload: Any) -> None:  # the job's work: nothing, as the send above
        return None

    return app


async def _procrastinate_produce(url: str, index: int, share: int, shape: str, conc: int) -> int:
    """Defer ``share`` jobs: ``each``, one ``defer_async`` (one commit) per job from ``conc``
    concurrent tasks; ``batched``, ``batch_defer_async`` of up to 100 jobs per commit."""
    app = _procrastinate_app(url, conc)
    task = app.tasks[ENTRYPOINT]
    async with app.open_async():
        await asyncio.to_thread(_ready_then_wait)
        if shape == "each":

            async def one(refs: range) -> None:
                for i in refs:
                    await task.defer_async(**_PAYLOAD, obligation_id=f"p{index}-{i}")

            await asyncio.gather(*(one(range(k, share, conc)) for k in range(conc)))
        else:
            for lo in range(0, share, 100):
                jobs = [
                    {**_PAYLOAD, "obligation_id": f"p{index}-{i}"}
                    for i in range(lo, min(share, lo + 100))
                ]
                await task.batch_defer_async(*jobs)
    return share


async def _procrastinate_work(url: str, shape: str, conc: int) -> None:
    """A procrastinate worker as shipped (``run_worker_async``), until SIGTERM: fetch, run the
    no-op task, finish (status ``succeeded``; jobs kept, not deleted)."""
    concurrency = 1 if shape == "each" else conc
    app = _procrastinate_app(url, concurrency + 2)
    async with app.open_async():
        print("ready", flush=True)  # a worker does not wait for go: it waits for jobs
        await app.run_worker_async(
            queues=[QUEUE],
            concurrency=concurrency,
            wait=True,
            delete_jobs="never",
            listen_notify=True,
            fetch_job_polling_interval=IDLE_POLL_S,
        )


# -- pgqueuer -----------------------------------------------------------------------------------


async def _pgqueuer_produce(url: str, index: int, share: int, shape: str, conc: int) -> int:
    """Enqueue ``share`` jobs: ``each``, one ``Queries.enqueue`` (one commit) per job from
    ``conc`` concurrent tasks, a connection each; ``batched``, lists of up to 100 per call."""
    from pgqueuer import PsycopgDriver, Queries  # noqa: PLC0415

    body = json.dumps(_PAYLOAD).encode()
    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True)
        for _ in range(conc if shape == "each" else 1)
    ]
    try:
        queries = [Queries(PsycopgDriver(c)) for c in conns]
        await asyncio.to_thread(_ready_then_wait)
        if shape == "each":

            async def one(q: Any, refs: range) -> None:
                for _i in refs:
                    await q.enqueue(ENTRYPOINT, body)

            await asyncio.gather(*(one(q, range(k, share, conc)) for k, q in enumerate(queries)))
        else:
            for lo in range(0, share, 100):
                count = min(share, lo + 100) - lo
                await queries[0].enqueue([ENTRYPOINT] * count, [body] * count, [0] * count)
    finally:
        for c in conns:
            await c.close()
    return share


async def _pgqueuer_work(url: str, shape: str, conc: int) -> None:
    """A pgqueuer ``QueueManager`` as shipped, until SIGTERM: dequeue a batch (``each``: 1,
    ``batched``: ``conc``), run the no-op entrypoint, log it done (pgqueuer deletes the job and
    logs ``successful``; its log buffer flushes a batch at a time).  The periodic log
    aggregation is off, so that ``pgqueuer_log`` keeps one ``successful`` row per job."""
    from pgqueuer import PsycopgDriver, Queries, QueueManager  # noqa: PLC0415

    conn = await psycopg.AsyncConnection.connect(url, autocommit=True)
    qm = QueueManager(Queries(PsycopgDriver(conn)))

    @qm.entrypoint(ENTRYPOINT)
    async def deliver(job: Any) -> None:  # the job's work: nothing
        return None

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, qm.shutdown.set)
    print("ready", flush=True)
    try:
        await qm.run(
            dequeue_timeout=timedelta(seconds=IDLE_POLL_S),
            batch_size=1 if shape == "each" else conc,
            log_aggregation_interval=timedelta(0),
        )
    finally:
        await conn.close()


# -- entry point --------------------------------------------------------------------------------


def run(spec: dict[str, Any]) -> dict[str, Any] | None:
    """Run the role ``spec`` names; the result line to print, or None for a peer's worker."""
    url = os.environ["STATECORE_BENCH_PG_URL"]
    role, shape = spec["role"], spec["shape"]
    share, index, conc = spec.get("share", 0), spec.get("index", 0), spec["concurrency"]
    if role == "statecore":
        if shape == "each":
            return statecore_each(url, index, share)
        return statecore_batched(url, index, share, conc)
    if role == "procrastinate-worker":
        asyncio.run(_procrastinate_work(url, shape, conc))
        return None
    if role == "pgqueuer-worker":
        asyncio.run(_pgqueuer_work(url, shape, conc))
        return None
    start = time.perf_counter()
    if role == "procrastinate-producer":
        done = asyncio.run(_procrastinate_produce(url, index, share, shape, conc))
    elif role == "pgqueuer-producer":
        done = asyncio.run(_pgqueuer_produce(url, index, share, shape, conc))
    else:
        raise SystemExit(f"unknown role {role!r}")
    return {"done": done, "elapsed_s": time.perf_counter() - start}


def main() -> None:
    spec = json.loads(sys.argv[1])
    profile = spec.get("profile")
    if profile:
        profiler = cProfile.Profile()
        result = profiler.runcall(run, spec)
        profiler.dump_stats(profile)
    else:
        result = run(spec)
    if result is not None:
        _done(**result)


if __name__ == "__main__":
    main()
