"""The benchmarks' raw SQLite baselines still run the store's statements on the store's layout.

``benchmarks/ledger_sql.py`` runs the SQLite store's own statement texts with plain sqlite3 (the
baseline of ``bench_ledger.py`` and ``bench_layouts.py``), and ``bench_ledger.py`` fills large
files with the store's own ``INSERT``.  A layout change that those scripts do not follow would
make them fail, or measure something else, only when someone runs ``make bench``; these tests
run a few of their lifecycles on every ``make test`` and read the result back through the
store.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

from statecore import FakeClock, Incarnation, Ledger, ObligationState
from stores import SQLiteStore

S = ObligationState
BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def bench() -> Iterator[tuple[ModuleType, ModuleType]]:
    """The benchmarks' ``ledger_sql`` and ``bench_ledger`` modules (imported from their
    directory, as the scripts import each other)."""
    sys.path.insert(0, str(BENCHMARKS))
    try:
        import bench_ledger  # noqa: PLC0415 - the directory is on the path only here
        import ledger_sql  # noqa: PLC0415

        yield ledger_sql, bench_ledger
    finally:
        sys.path.remove(str(BENCHMARKS))


@pytest.mark.parametrize(
    "variant", ["as is", "returning", "nosettled", "fence", "noreturn", "head", "noindex"]
)
def test_raw_lifecycles_are_the_stores_writes(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path, variant: str
) -> None:
    """Every variant's lifecycles leave what the ledger's would: delivered rows, each with its
    record, attempt and deliver audit entries."""
    ledger_sql, _ = bench
    path = str(tmp_path / "raw.db")
    raw = ledger_sql.RawLedger(path, "NORMAL", variant)
    raw.run(0, 3)
    raw.close()
    with SQLiteStore(path) as store:
        ledger = Ledger(store, clock=FakeClock())
        for i in range(3):
            row = ledger.get(f"ob-{i}")
            assert row is not None
            assert row.state is S.DELIVERED
            assert row.content == ledger_sql.PAYLOAD["content"]
            history = ledger.history(f"ob-{i}")
            assert [h.event for h in history] == ["record", "attempt", "deliver"]
            assert [h.to_state for h in history] == [S.PENDING, S.ATTEMPTING, S.DELIVERED]


def test_raw_ledger_refuses_an_unknown_variant(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """A misspelt variant is refused before any file is made."""
    ledger_sql, _ = bench
    with pytest.raises(ValueError, match="variant"):
        ledger_sql.RawLedger(str(tmp_path / "x.db"), "NORMAL", "no such")
    assert not (tmp_path / "x.db").exists()


def test_sweep_population_is_found_by_the_sweep(
    bench: tuple[ModuleType, ModuleType], tmp_path: Path
) -> None:
    """The rows ``bench_ledger`` fills a file with are what the ledger's own writes would be:
    the startup sweep claims every dead owner's row and no other, and each keeps a history."""
    _, bench_ledger = bench
    path = str(tmp_path / "sweep.db")
    SQLiteStore(path).close()
    with SQLiteStore(path) as store:
        Ledger(store, clock=FakeClock())
    bench_ledger._populate(path, 60, 12, 3, Incarnation.current())
    with SQLiteStore(path) as store:
        probe = bench_ledger._CountingProbe()
        ledger = Ledger(store, probe=probe)
        claims = ledger.sweep_recoverable()
        assert len(claims) == 12
        assert probe.calls == 3
        delivered = [ob for ob in (ledger.get(f"ob-{i:08d}") for i in range(60)) if ob]
        assert sum(ob.state is S.DELIVERED for ob in delivered) == 48
        assert ledger.history("ob-00000001")[0].event == "record"
