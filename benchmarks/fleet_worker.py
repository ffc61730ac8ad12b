"""The child processes of ``bench_fleet.py``: a statecore gateway, or a peer queue's producer or
worker, each its own process on the benchmark's PostgreSQL server.

Run by ``bench_fleet.py`` only: ``python fleet_worker.py '<json spec>'`` with the server's URL
in ``$STATECORE_BENCH_PG_URL`` (never on a command line).  The spec names the ``role``
(``statecore``, ``procrastinate-producer``, ``procrastinate-worker``, ``pgqueuer-producer``,
``pgqueuer-worker``), the ``shape`` (``each``: one item per commit, one in flight per process;
``batched``: ``concurrency`` in flight per process, batched where the library's public API
offers it) and the child's share of the work.

Protocol: the child sets everything up (connections, schema registration, listeners) and prints
``ready``.  A statecore gateway and a producer then wait for a line on stdin: ``go R`` (the
parent sends it to every child of the contender at once) makes them do their share for round
``R`` and print one JSON line (what they did, their own elapsed time); ``stop`` or EOF ends
them.  A peer's worker waits for jobs (woken by the library's LISTEN/NOTIFY) until SIGTERM,
which stops it the library's own way.  The parent, not the children, judges when every item is
done (it counts settled rows in the database), so every contender is timed the same way.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any

import psycopg

# The payload of bench_postgres.py (its ``PAYLOAD``, not imported: that module imports every
# library, and each child should load only its own): the same five fields for every contender.
PAYLOAD = {
    "session_key": "agent:main:slack:channel:C1",
    "platform": "slack",
    "chat_id": "C1",
    "thread_id": "171.001",
    "content": "x" * 100,
}

QUEUE = "bench"
ENTRYPOINT = "deliver"
STATECORE_SCHEMA = "fleet"
# How long an idle peer worker waits before it polls when no NOTIFY woke it: both peers are woken
# by LISTEN/NOTIFY on enqueue, and an idle worker must not load the server while another
# contender is timed (procrastinate's default; pgqueuer's is 30 s).
IDLE_POLL_S = 5.0
logging.getLogger("procrastinate").setLevel(logging.ERROR)
logging.getLogger("pgqueuer").setLevel(logging.ERROR)


def _rounds() -> Iterator[int]:
    """Say ``ready``, then each round the parent starts with ``go R``, until ``stop`` or EOF."""
    print("ready", flush=True)
    while True:
        words = sys.stdin.readline().split()
        if len(words) != 2 or words[0] != "go":
            return
        yield int(words[1])


async def _async_rounds() -> AsyncIterator[int]:
    """:func:`_rounds` for a child on an event loop (stdin is read on a thread)."""
    print("ready", flush=True)
    while True:
        words = (await asyncio.to_thread(sys.stdin.readline)).split()
        if len(words) != 2 or words[0] != "go":
            return
        yield int(words[1])


def _done(**result: Any) -> None:
    print(json.dumps(result), flush=True)


# -- statecore: a gateway's ledger --------------------------------------------------------------


def _no_op_send(obligation: Any) -> None:
    """The platform call: nothing (the benchmark measures the ledger, not a platform)."""


def statecore_each(url: str, index: int, share: int) -> None:
    """``share`` obligations a round, one at a time, as a gateway sends one reply:
    ``Ledger.record``, ``mark_attempting``, the send, ``mark_delivered``; three commits each."""
    from statecore import Ledger  # noqa: PLC0415 -- only the statecore children need it
    from stores.postgres import PostgresStore  # noqa: PLC0415

    store = PostgresStore(url, schema=STATECORE_SCHEMA, pool_size=2)
    try:
        ledger = Ledger(store)
        ledger.heartbeat()  # as a gateway's timer does before it sends
        ledger.sweep_recoverable()  # a gateway's startup sweep (nothing to claim here)
        for r in _rounds():
            start = time.perf_counter()
            for i in range(share):
                ob = ledger.record(**PAYLOAD, message_ref=f"r{r}-g{index}-m{i}")
                ledger.mark_attempting(ob.obligation_id)
                _no_op_send(ob)
                ledger.mark_delivered(ob.obligation_id)
            _done(done=share, elapsed_s=time.perf_counter() - start)
    finally:
        store.close()


def statecore_batched(url: str, index: int, share: int, concurrency: int) -> None:
    """``share`` obligations a round, ``concurrency`` sends in flight at once through one
    ``AsyncLedger`` (its writer commits the operations queued meanwhile together: the group
    commit a gateway gets when many sessions reply at once)."""
    from statecore import AsyncLedger  # noqa: PLC0415
    from stores.postgres import PostgresStore  # noqa: PLC0415

    store = PostgresStore(url, schema=STATECORE_SCHEMA, pool_size=4)

    async def sender(ledger: Any, r: int, refs: range) -> None:
        for i in refs:
            ob = await ledger.record(**PAYLOAD, message_ref=f"r{r}-g{index}-m{i}")
            await ledger.mark_attempting(ob.obligation_id)
            _no_op_send(ob)
            await ledger.mark_delivered(ob.obligation_id)

    async def run() -> None:
        async with AsyncLedger(store) as ledger:
            await ledger.heartbeat()
            await ledger.sweep_recoverable()
            async for r in _async_rounds():
                start = time.perf_counter()
                batches, ops = ledger.batches, ledger.operations
                await asyncio.gather(
                    *(sender(ledger, r, range(k, share, concurrency)) for k in range(concurrency))
                )
                _done(
                    done=share,
                    elapsed_s=time.perf_counter() - start,
                    batches=ledger.batches - batches,
                    operations=ledger.operations - ops,
                )

    try:
        asyncio.run(run())
    finally:
        store.close()


# -- procrastinate ------------------------------------------------------------------------------


def _procrastinate_app(url: str, pool: int) -> Any:
    import procrastinate  # noqa: PLC0415 -- only procrastinate's children load it

    connector = procrastinate.PsycopgConnector(conninfo=url, min_size=1, max_size=pool)
    app = procrastinate.App(connector=connector)

    @app.task(name=ENTRYPOINT, queue=QUEUE)
    async def deliver(**payload: Any) -> None:  # the job's work: nothing, as the send above
        return None

    return app


async def _procrastinate_produce(url: str, share: int, shape: str, conc: int) -> None:
    """Defer ``share`` jobs a round: ``each``, one ``defer_async`` (one commit) per job from
    ``conc`` concurrent tasks; ``batched``, ``batch_defer_async`` of up to 100 jobs a commit."""
    app = _procrastinate_app(url, conc)
    task = app.tasks[ENTRYPOINT]

    async def one(r: int, refs: range) -> None:
        for i in refs:
            await task.defer_async(**PAYLOAD, obligation_id=f"r{r}-{i}")

    async with app.open_async():
        async for r in _async_rounds():
            start = time.perf_counter()
            if shape == "each":
                await asyncio.gather(*(one(r, range(k, share, conc)) for k in range(conc)))
            else:
                for lo in range(0, share, 100):
                    jobs = [
                        {**PAYLOAD, "obligation_id": f"r{r}-{i}"}
                        for i in range(lo, min(share, lo + 100))
                    ]
                    await task.batch_defer_async(*jobs)
            _done(done=share, elapsed_s=time.perf_counter() - start)


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


async def _pgqueuer_produce(url: str, share: int, shape: str, conc: int) -> None:
    """Enqueue ``share`` jobs a round: ``each``, one ``Queries.enqueue`` (one commit) per job
    from ``conc`` concurrent tasks, a connection each; ``batched``, lists of up to 100 a call."""
    from pgqueuer import PsycopgDriver, Queries  # noqa: PLC0415

    body = json.dumps(PAYLOAD).encode()

    async def one(q: Any, refs: range) -> None:
        for _i in refs:
            await q.enqueue(ENTRYPOINT, body)

    conns = [
        await psycopg.AsyncConnection.connect(url, autocommit=True)
        for _ in range(conc if shape == "each" else 1)
    ]
    try:
        queries = [Queries(PsycopgDriver(c)) for c in conns]
        async for _r in _async_rounds():
            start = time.perf_counter()
            if shape == "each":
                await asyncio.gather(
                    *(one(q, range(k, share, conc)) for k, q in enumerate(queries))
                )
            else:
                for lo in range(0, share, 100):
                    count = min(share, lo + 100) - lo
                    await queries[0].enqueue([ENTRYPOINT] * count, [body] * count, [0] * count)
            _done(done=share, elapsed_s=time.perf_counter() - start)
    finally:
        for c in conns:
            await c.close()


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


def run(spec: dict[str, Any]) -> None:
    """Run the role ``spec`` names until the parent stops it."""
    url = os.environ["STATECORE_BENCH_PG_URL"]
    role, shape = spec["role"], spec["shape"]
    share, index, conc = spec.get("share", 0), spec.get("index", 0), spec["concurrency"]
    if role == "statecore" and shape == "each":
        statecore_each(url, index, share)
    elif role == "statecore":
        statecore_batched(url, index, share, conc)
    elif role == "procrastinate-worker":
        asyncio.run(_procrastinate_work(url, shape, conc))
    elif role == "pgqueuer-worker":
        asyncio.run(_pgqueuer_work(url, shape, conc))
    elif role == "procrastinate-producer":
        asyncio.run(_procrastinate_produce(url, share, shape, conc))
    elif role == "pgqueuer-producer":
        asyncio.run(_pgqueuer_produce(url, share, shape, conc))
    else:
        raise SystemExit(f"unknown role {role!r}")


def main() -> None:
    run(json.loads(sys.argv[1]))


if __name__ == "__main__":
    main()
