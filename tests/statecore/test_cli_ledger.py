"""``statecore ledger ...`` run as the real console script against a real SQLite file: every
subcommand, human and JSON output, exit codes, and refusals that change nothing."""

from __future__ import annotations

import os
import sqlite3
import time
from pathlib import Path

import attrs
import pytest

from statecore import FakeClock, Incarnation, Ledger, ObligationState
from statecore.ownership import host_identity
from statecore.repair import abandon, retry_id
from stores import SQLiteStore
from tests.cli_run import run, run_json, run_on_terminal, snapshot, url

S = ObligationState
HOUR = 3600.0
DEAD = Incarnation(host_identity(), os.getpid(), 1, "deadbeefdeadbeef")


@attrs.frozen
class Seeded:
    """A ledger file and the ids of its rows, one per state."""

    path: Path
    delivered: str
    attempting: str
    failed: str
    pending: str
    abandoned: str

    @property
    def url(self) -> str:
        """Its sqlite:/// URL."""
        return url(self.path)


@pytest.fixture
def seeded(tmp_path: Path) -> Seeded:
    """An hour-old ledger of a gateway that died: one delivered, one attempting, one failed,
    one abandoned, and one pending row recorded ten minutes later."""
    path = tmp_path / "bot.db"
    store = SQLiteStore(path)
    clock = FakeClock(time.time() - HOUR)
    ledger = Ledger(store, clock=clock, incarnation=DEAD)

    def record(n: int, platform: str = "loopback") -> str:
        return ledger.record(
            session_key=f"s{n}", platform=platform, chat_id=f"c{n}", content=f"reply {n}"
        ).obligation_id

    delivered, attempting, failed, abandoned = (record(n) for n in range(4))
    for oid in (delivered, attempting, failed, abandoned):
        ledger.mark_attempting(oid)
    ledger.mark_delivered(delivered)
    ledger.mark_failed(failed, "chat not found")
    abandon(store, abandoned, by="bob", reason="gave up", clock=clock)
    clock.advance(600)
    pending = record(9, platform="other")
    store.close()
    return Seeded(path, delivered, attempting, failed, pending, abandoned)


def test_stats_counts_rows_per_state_and_ages_the_oldest_owed(seeded: Seeded) -> None:
    """The table and the JSON agree with the seeded rows."""
    result = run("ledger", "stats", store=seeded.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["STATE", "ROWS"]
    assert [line.split() for line in lines[1:8]] == [
        ["pending", "1"],
        ["attempting", "1"],
        ["failed", "1"],
        ["delivered", "1"],
        ["abandoned", "1"],
        ["total", "5"],
        ["owed", "3"],
    ]
    assert lines[8].startswith("oldest owed: 1h 00m (")
    data = run_json("ledger", "stats", store=seeded.url)
    assert data["states"] == dict.fromkeys(("pending", "attempting", "failed"), 1) | {
        "delivered": 1,
        "abandoned": 1,
    }
    assert (data["total"], data["owed"]) == (5, 3)
    assert data["oldest_owed_id"] in (seeded.attempting, seeded.failed)
    assert HOUR - 5 < data["oldest_owed_age_s"] < HOUR + 60


def test_ls_lists_owed_rows_by_default_and_filters(seeded: Seeded) -> None:
    """Owed rows oldest first; --state, --platform and --limit narrow it; JSON has the total."""
    result = run("ledger", "ls", store=seeded.url)
    assert result.returncode == 0, result.stderr
    rows = [line.split()[:2] for line in result.stdout.splitlines()[1:]]
    assert rows == [
        [seeded.attempting, "attempting"],
        [seeded.failed, "failed"],
        [seeded.pending, "pending"],
    ]
    assert "chat not found" in result.stdout
    data = run_json("ledger", "ls", "--state", "all", store=seeded.url)
    assert data["total"] == 5
    assert [o["obligation_id"] for o in data["obligations"]][-1] == seeded.pending
    assert {o["state"] for o in data["obligations"]} == {s.value for s in S}
    settled = run_json("ledger", "ls", "--state", "settled", store=seeded.url)
    assert {o["obligation_id"] for o in settled["obligations"]} == {
        seeded.delivered,
        seeded.abandoned,
    }
    other = run_json("ledger", "ls", "--platform", "other", store=seeded.url)
    assert [o["obligation_id"] for o in other["obligations"]] == [seeded.pending]
    limited = run("ledger", "ls", "--state", "all", "--limit", "2", store=seeded.url)
    assert len(limited.stdout.splitlines()) == 4
    assert limited.stdout.endswith("2 of 5 shown (--limit 0 shows all)\n")
    none = run("ledger", "ls", "--state", "delivered", "--platform", "other", store=seeded.url)
    assert none.stdout == "no obligations on other in state delivered\n"


def test_show_prints_one_obligation_with_its_owners_liveness(seeded: Seeded) -> None:
    """Every field, and the owner (this test's pid with another start time) judged dead."""
    result = run("ledger", "show", seeded.failed, store=seeded.url)
    assert result.returncode == 0, result.stderr
    fields = {
        line[:13].strip(): line[13:] for line in result.stdout.splitlines() if line[:1] != " "
    }
    assert fields["obligation"] == seeded.failed
    assert fields["state"] == "failed"
    assert fields["chat"] == "c2"
    assert fields["last error"] == "chat not found (permanent)"
    assert fields["owner"].endswith("(dead)")
    assert result.stdout.endswith("content\n  reply 2\n")
    data = run_json("ledger", "show", seeded.failed, store=seeded.url)
    assert data["obligation_id"] == seeded.failed
    assert data["owner_status"] == "dead"
    assert data["owner"]["token"] == DEAD.token
    assert (data["retry_of"], data["retried_as"]) == (None, None)


def test_history_prints_every_transition(seeded: Seeded) -> None:
    """The audit entries oldest first, with who and why."""
    result = run("ledger", "history", seeded.abandoned, store=seeded.url)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["AT", "EVENT", "FROM", "TO", "TRIES", "BY", "REASON"]
    assert [line.split()[1] for line in lines[1:]] == ["record", "attempt", "abandon"]
    assert lines[3].split()[-6:] == ["cli:bob", "abandoned", "by", "bob:", "gave", "up"]
    data = run_json("ledger", "history", seeded.abandoned, store=seeded.url)
    assert [(h["event"], h["from"], h["to"]) for h in data] == [
        ("record", None, "pending"),
        ("attempt", "pending", "attempting"),
        ("abandon", "attempting", "abandoned"),
    ]
    assert data[-1]["owner"] == "cli:bob"


def test_retry_records_a_new_obligation_naming_the_abandoned_one(seeded: Seeded) -> None:
    """The retry is a new pending, unowned row; the abandoned row is untouched and shows its
    retry; a second retry is refused with exit 2 and changes nothing."""
    before = run_json("ledger", "history", seeded.abandoned, store=seeded.url)
    result = run(
        "ledger", "retry", seeded.abandoned, "--by", "alice", "--reason", "back", store=seeded.url
    )
    assert result.returncode == 0, result.stderr
    new = retry_id(seeded.abandoned)
    assert result.stdout.startswith(f"recorded {new}: retry of {seeded.abandoned} by cli:alice")
    assert "labelled as a possible repeat" in result.stdout
    shown = run_json("ledger", "show", new, store=seeded.url)
    assert (shown["state"], shown["owner_status"], shown["attempts"]) == ("pending", "unowned", 1)
    assert shown["retry_of"] == seeded.abandoned
    assert shown["content"] == "reply 3"
    [created] = run_json("ledger", "history", new, store=seeded.url)
    assert created["owner"] == "cli:alice"
    assert created["reason"] == f"retry of {seeded.abandoned} by alice: back"
    assert run_json("ledger", "history", seeded.abandoned, store=seeded.url) == before
    old = run_json("ledger", "show", seeded.abandoned, store=seeded.url)
    assert old["retried_as"] == {"obligation_id": new, "state": "pending"}
    unchanged = snapshot(seeded.path)
    again = run("ledger", "retry", seeded.abandoned, "--reason", "again", store=seeded.url)
    assert again.returncode == 2
    assert again.stdout == ""
    assert f"already retried as {new}, which is pending" in again.stderr
    assert snapshot(seeded.path) == unchanged


def test_retry_json_names_the_retried_id(seeded: Seeded) -> None:
    """--json prints the new obligation and the id it retries."""
    data = run_json("ledger", "retry", seeded.abandoned, "--reason", "r", store=seeded.url)
    assert data["retry_of"] == seeded.abandoned
    assert data["obligation"]["obligation_id"] == retry_id(seeded.abandoned)


def test_abandon_moves_an_owed_row_with_the_operator_in_its_history(seeded: Seeded) -> None:
    """The row is abandoned; its last audit entry names cli:<operator> and the reason."""
    result = run(
        "ledger",
        "abandon",
        seeded.attempting,
        "--by",
        "carol",
        "--reason",
        "stuck since noon",
        store=seeded.url,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == (
        f"abandoned {seeded.attempting} (was attempting) by cli:carol: stuck since noon\n"
    )
    last = run_json("ledger", "history", seeded.attempting, store=seeded.url)[-1]
    assert (last["event"], last["owner"]) == ("abandon", "cli:carol")
    assert last["reason"] == "abandoned by carol: stuck since noon"
    data = run_json("ledger", "abandon", seeded.pending, "--reason", "r", store=seeded.url)
    assert (data["was"], data["obligation"]["state"]) == ("pending", "abandoned")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("abandon", "{delivered}"), "event 'abandon' is not allowed from state 'delivered'"),
        (("abandon", "{abandoned}"), "event 'abandon' is not allowed from state 'abandoned'"),
        (("retry", "{pending}"), "event 'retry' is not allowed from state 'pending'"),
        (("retry", "{delivered}"), "only an abandoned obligation can be retried"),
        (("retry", "0123456789abcdef01234567"), "obligation '0123456789abcdef01234567' does"),
        (("abandon", "nope"), "obligation 'nope' does not exist"),
        (("show", "nope"), "obligation 'nope' does not exist"),
        (("history", "nope"), "obligation 'nope' does not exist"),
    ],
)
def test_unknown_ids_and_wrong_states_exit_2_and_change_nothing(
    seeded: Seeded, argv: tuple[str, ...], message: str
) -> None:
    """A refusal says what and why on stderr, prints nothing on stdout, exits 2, and the file
    holds exactly what it held."""
    command, oid = argv
    oid = oid.format(**attrs.asdict(seeded))
    extra = ("--reason", "why") if command in ("retry", "abandon") else ()
    before = snapshot(seeded.path)
    result = run("ledger", command, oid, *extra, store=seeded.url)
    assert result.returncode == 2
    assert result.stdout == ""
    assert message in result.stderr
    assert result.stderr.startswith("statecore: error: ")
    assert "Traceback" not in result.stderr
    assert snapshot(seeded.path) == before


def test_repairs_need_a_reason(seeded: Seeded) -> None:
    """--reason is required (a usage error, exit 2); an empty one is refused too."""
    before = snapshot(seeded.path)
    missing = run("ledger", "abandon", seeded.pending, store=seeded.url)
    assert missing.returncode == 2
    assert "--reason" in missing.stderr
    empty = run("ledger", "abandon", seeded.pending, "--reason", "", store=seeded.url)
    assert empty.returncode == 2
    assert "reason must not be empty" in empty.stderr
    assert snapshot(seeded.path) == before


def test_prune_deletes_old_settled_rows_only(seeded: Seeded) -> None:
    """Delivered and abandoned rows past the age go; owed rows stay whatever their age; the
    output is silent on stderr when stderr is not a terminal."""
    kept = run("ledger", "prune", "--older-than", "2h", store=seeded.url)
    assert (kept.returncode, kept.stderr) == (0, "")
    assert kept.stdout == "pruned 0 settled obligations unchanged for over 2h 00m\n"
    data = run_json("ledger", "prune", "--older-than", "30m", store=seeded.url)
    assert data == {"pruned": 2, "older_than_s": 1800.0}
    left = run_json("ledger", "ls", "--state", "all", store=seeded.url)
    assert {o["obligation_id"] for o in left["obligations"]} == {
        seeded.attempting,
        seeded.failed,
        seeded.pending,
    }
    bad = run("ledger", "prune", "--older-than", "soon", store=seeded.url)
    assert bad.returncode == 2
    assert "not a positive duration: 'soon'" in bad.stderr


def test_prune_draws_a_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    """With stderr on a terminal, prune draws its bar there (and wipes it); stdout is the
    same as without one."""
    path = tmp_path / "big.db"
    store = SQLiteStore(path)
    ledger = Ledger(store, clock=FakeClock(time.time() - HOUR))
    with store.atomic():
        for n in range(1200):
            oid = ledger.record(session_key="k", platform="p", chat_id="c", content=f"{n}")
            ledger.mark_attempting(oid.obligation_id)
            ledger.mark_delivered(oid.obligation_id)
    store.close()
    status, out, terminal = run_on_terminal(
        "ledger", "prune", "--older-than", "1m", store=url(path)
    )
    assert status == 0
    assert out == "pruned 1200 settled obligations unchanged for over 1m 00s\n"
    assert "pruning settled obligations [" in terminal
    assert "0/1200" in terminal
    assert terminal.endswith("\r\x1b[K")


def test_the_store_comes_from_the_environment_unless_given(seeded: Seeded, tmp_path: Path) -> None:
    """STATECORE_STORE_URL is used without --store; --store wins over it."""
    env = {"STATECORE_STORE_URL": seeded.url}
    from_env = run("ledger", "stats", "--json", env=env)
    assert from_env.returncode == 0, from_env.stderr
    empty = run("ledger", "stats", "--json", store="memory://", env=env)
    assert '"total": 0' in empty.stdout
    neither = run("ledger", "stats")
    assert neither.returncode == 2
    assert "no store given: pass --store URL or set STATECORE_STORE_URL" in neither.stderr


def test_options_go_before_or_after_the_subcommand(seeded: Seeded) -> None:
    """--json and --store mean the same on the command line and on the subcommand."""
    before = run("--json", "--store", seeded.url, "ledger", "ls")
    after = run("ledger", "ls", "--json", "--store", seeded.url)
    assert before.returncode == after.returncode == 0
    assert before.stdout == after.stdout


@pytest.mark.parametrize(
    ("store", "message"),
    [
        ("mysql://db/x", "unknown store URL scheme 'mysql' in 'mysql://db/x'; known:"),
        ("bot.db", "not a store URL: 'bot.db' (a file? use sqlite:///bot.db)"),
        ("memory://x", "memory:// takes no path"),
        ("sqlite:///{dir}/missing.db", "missing.db: no such database file"),
        ("sqlite:///{dir}/nodir/x.db", "x.db: no such database file"),
    ],
)
def test_bad_store_urls_exit_2_and_create_nothing(tmp_path: Path, store: str, message: str) -> None:
    """Unknown schemes, plain paths, malformed URLs and missing files are refused, naming the
    URL or the file; no file is created."""
    result = run("ledger", "ls", store=store.format(dir=tmp_path), cwd=tmp_path)
    assert result.returncode == 2
    assert message in result.stderr
    assert result.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_a_file_that_is_not_a_database_is_refused_unchanged(tmp_path: Path) -> None:
    """Garbage in the file: exit 2 naming it, the bytes as they were."""
    path = tmp_path / "garbage.db"
    junk = os.urandom(8192)
    path.write_bytes(junk)
    for argv in (("ledger", "ls"), ("ledger", "abandon", "x", "--reason", "r")):
        result = run(*argv, store=url(path))
        assert result.returncode == 2
        assert f"{path}: not a SQLite database" in result.stderr
    assert path.read_bytes() == junk


def test_a_locked_database_is_refused_unchanged(seeded: Seeded) -> None:
    """Another connection holds the write lock past the busy timeout: reads and repairs exit 2
    naming the file and the lock; nothing is written."""
    before = snapshot(seeded.path)
    holder = sqlite3.connect(seeded.path, isolation_level=None)
    try:
        holder.execute("BEGIN IMMEDIATE")
        locked = url(seeded.path, busy_timeout_s="0.2")
        for argv in (("ledger", "ls"), ("ledger", "abandon", seeded.pending, "--reason", "r")):
            result = run(*argv, store=locked)
            assert result.returncode == 2
            assert f"{seeded.path}: database locked for longer than the busy timeout" in (
                result.stderr
            )
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert snapshot(seeded.path) == before
