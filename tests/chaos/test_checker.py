"""The chaos run's history checker (tests/chaos/checker.py): crafted transcripts against a
crafted index, and a real PostgreSQL ledger and connector buffer written through the real
Ledger and InboundBuffer -- a clean run passes, and each violation is caught."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import psycopg
import pytest

from relay.connector.buffer import BufferState, InboundBuffer
from relay.wire.frames import EventSource, InboundEvent
from statecore import OBLIGATION_KIND, Audit, FakeClock, Ledger, ObligationState
from stores.postgres import PostgresStore
from tests.chaos.checker import CheckReport, LedgerIndex, check_run, check_transcript
from tests.chaos.transcript import BotMessage, Transcript, UserMessage
from tests.crash_analysis import BANNERS
from tests.statecore.ledger_helpers import DEAD, LIVE, FakeProbe

OS = ObligationState
LABEL = BANNERS[0]


def user(n: int, chat: str = "chat-0", tenant: str = "tenant-a") -> UserMessage:
    return UserMessage(chat_id=chat, tenant=tenant, message_id=f"m-{n}", text=f"hello {n}", at=n)


def bot(text: str, chat: str = "chat-0", tenant: str = "tenant-a") -> BotMessage:
    return BotMessage(chat_id=chat, tenant=tenant, text=text, at=0.0)


def violations(report: CheckReport) -> dict[str, int]:
    names = (
        "lost",
        "unlabelled_duplicates",
        "wrong_tenant",
        "wrong_chat",
        "stray",
        "double_settles",
        "fenced_writes_accepted",
        "bad_walks",
        "bad_fences",
    )
    return {n: getattr(report, n) for n in names if getattr(report, n)}


def test_answered_messages_and_labelled_repeats_pass() -> None:
    """Each message answered in its chat; a repeat with a banner is fine, and so is a first
    copy with one (a recovered send that was the first the user saw)."""
    transcript = Transcript(
        [
            user(1),
            user(2, "chat-1", "tenant-b"),
            bot("echo: hello 1"),
            bot(f"{LABEL}echo: hello 1"),
            bot(f"{LABEL}echo: hello 2", "chat-1", "tenant-b"),
        ]
    )
    report = check_transcript(transcript, LedgerIndex())
    assert report.ok
    assert (report.messages, report.answered, report.owed, report.lost) == (2, 2, 0, 0)
    assert report.problems == []


@pytest.mark.parametrize(
    ("bots", "expected", "problem"),
    [
        (["echo: hello 1", "echo: hello 1"], {"unlabelled_duplicates": 1}, "unlabelled duplicate"),
        (
            [f"{LABEL}echo: hello 1", "echo: hello 1"],
            {"unlabelled_duplicates": 1},
            "unlabelled duplicate",
        ),
        (["echo: hello 1", "echo: nobody said this"], {"stray": 1}, "stray"),
        (["echo: hello 1", "something else"], {"stray": 1}, "stray"),
    ],
)
def test_repeats_and_strays_in_one_chat(
    bots: list[str], expected: dict[str, int], problem: str
) -> None:
    transcript = Transcript([user(1), *(bot(b) for b in bots)])
    report = check_transcript(transcript, LedgerIndex())
    assert violations(report) == expected
    assert not report.ok
    assert problem in report.problems[0]


def test_an_answer_in_another_tenants_chat_and_in_another_chat() -> None:
    """chat-0 and chat-2 are tenant-a's, chat-1 tenant-b's: an answer to chat-0's message in
    chat-1 crossed tenants; in chat-2 it is only in the wrong chat."""
    transcript = Transcript(
        [
            user(1),
            bot("echo: hello 1"),
            bot("echo: hello 1", "chat-1", "tenant-b"),
            bot("echo: hello 1", "chat-2", "tenant-a"),
        ]
    )
    report = check_transcript(transcript, LedgerIndex())
    assert violations(report) == {"wrong_tenant": 1, "wrong_chat": 1}
    assert report.problems == [
        "answer to m-1 of chat-0 (tenant-a) posted in chat-1 of tenant tenant-b",
        "answer to m-1 of chat-0 posted in chat-2",
    ]


def _index(*obligations: tuple[str, str | None, str, OS]) -> LedgerIndex:
    index = LedgerIndex()
    for chat, reply_to, content, state in obligations:
        if reply_to is not None:
            index.by_reply_to[chat, reply_to].append(state)
        index.by_content[chat, content].append(state)
    return index


@pytest.mark.parametrize(
    ("index", "owed", "lost", "abandoned"),
    [
        (_index(("chat-0", "m-1", "echo: hello 1", OS.PENDING)), 1, 0, 0),
        (_index(("chat-0", "m-1", "echo: hello 1", OS.FAILED)), 1, 0, 0),
        (_index(("chat-0", None, "echo: hello 1", OS.ATTEMPTING)), 1, 0, 0),  # found by text
        (_index(("chat-0", "m-1", "echo: hello 1", OS.ABANDONED)), 0, 0, 1),
        (_index(("chat-0", "m-1", "echo: hello 1", OS.DELIVERED)), 0, 1, 0),
        (_index(("chat-9", "m-1", "echo: hello 1", OS.PENDING)), 0, 1, 0),  # another chat's
        (LedgerIndex(), 0, 1, 0),
    ],
)
def test_an_unanswered_message_is_owed_abandoned_or_lost(
    index: LedgerIndex, owed: int, lost: int, abandoned: int
) -> None:
    report = check_transcript(Transcript([user(1)]), index)
    assert (report.owed, report.lost, report.abandoned, report.answered) == (
        owed,
        lost,
        abandoned,
        0,
    )
    assert report.ok is (lost == 0)
    assert len(report.problems if lost else report.notes) == 1


@pytest.mark.parametrize(
    ("states", "owed", "lost"),
    [
        ([BufferState.BUFFERED], 1, 0),
        ([BufferState.ACKED, BufferState.SENT], 1, 0),
        ([BufferState.ACKED], 0, 1),
        ([BufferState.EXPIRED], 0, 0),
    ],
)
def test_a_message_not_yet_recorded_is_owed_while_the_buffer_holds_it(
    states: list[BufferState], owed: int, lost: int
) -> None:
    index = LedgerIndex()
    index.buffered["chat-0", "m-1"].extend(states)
    report = check_transcript(Transcript([user(1)]), index)
    assert (report.owed, report.lost) == (owed, lost)
    if lost:
        assert "acked by a gateway" in report.problems[0]


# -- a real PostgreSQL ledger and buffer --------------------------------------------------------


def event(message: UserMessage) -> InboundEvent:
    return InboundEvent(
        text=message.text,
        message_id=message.message_id,
        source=EventSource(platform="chaos", chat_id=message.chat_id, chat_type="group"),
    )


@pytest.fixture
def schemas(postgres_url: str) -> Iterator[tuple[str, str]]:
    names = (f"chk_l_{uuid.uuid4().hex[:12]}", f"chk_c_{uuid.uuid4().hex[:12]}")
    try:
        yield names
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            for name in names:
                conn.execute(f"DROP SCHEMA IF EXISTS {name} CASCADE")


def write_run(url: str, ledger_schema: str, connector_schema: str) -> Transcript:
    """A small run: m-1 answered by its recorder, m-2 recorded by a gateway that died and
    answered (labelled) by the one that claimed it, m-3 owed (failed), m-4 buffered for a
    gateway that never took it; every buffer entry of an answered message acked."""
    messages = [user(n, f"chat-{n % 2}", ("tenant-a", "tenant-b")[n % 2]) for n in (1, 2, 3, 4)]
    transcript = Transcript(list(messages))
    clock = FakeClock()
    probe = FakeProbe({LIVE.pid: LIVE.started_at})
    with PostgresStore(url, schema=connector_schema, pool_size=1) as store:
        buffer = InboundBuffer(store, clock=clock)
        ids = [buffer.append("gw-0", "chaos", event(m)) for m in messages]
        buffer.ack("gw-0", ids[:3])
    with PostgresStore(url, schema=ledger_schema, pool_size=1) as store:
        dead = Ledger(store, clock=clock, probe=probe, incarnation=DEAD)
        live = Ledger(store, clock=clock, probe=probe, incarnation=LIVE)

        def record(ledger: Ledger, m: UserMessage) -> str:
            return ledger.record(
                session_key=f"s:{m.chat_id}",
                platform="chaos",
                chat_id=m.chat_id,
                content=f"echo: {m.text}",
                message_ref=m.message_id,
                reply_to=m.message_id,
            ).obligation_id

        one = record(live, messages[0])
        live.mark_attempting(one)
        live.mark_delivered(one)
        transcript.add(bot("echo: hello 1", "chat-1", "tenant-b"))
        dead.mark_attempting(record(dead, messages[1]))
        (claim,) = live.sweep_recoverable()
        transcript.add(bot(claim.render(), "chat-0", "tenant-a"))
        live.mark_delivered(claim.obligation_id)
        three = record(live, messages[2])
        live.mark_attempting(three)
        live.mark_failed(three, "platform down")
        live.heartbeat()  # an owner record: a kind the catalog lists beside the obligations
        live.heartbeat()
    return transcript


def test_a_clean_run_on_postgresql_passes(postgres_url: str, schemas: tuple[str, str]) -> None:
    transcript = write_run(postgres_url, *schemas)
    report = check_run(
        pg_url=postgres_url,
        ledger_schema=schemas[0],
        connector_schema=schemas[1],
        transcript=transcript,
    )
    assert report.problems == []
    assert report.ok
    assert (report.messages, report.answered, report.owed, report.lost) == (4, 2, 2, 0)
    ledger, connector = schemas
    assert report.kinds == {
        f"{ledger}.obligation": 3,
        f"{connector}.buffer_entry": 4,
        f"{ledger}.owner": 1,
    }
    assert report.rows == 3 + 4 + 1
    assert any("m-4" in n and "buffer" in n for n in report.notes)


def test_violations_in_the_postgresql_audit_are_caught(
    postgres_url: str, schemas: tuple[str, str]
) -> None:
    """A zombie's settle accepted after a claim, a second settle and a buffer entry's
    undeclared move (both forged in SQL), and a delivered reply the platform never showed."""
    ledger_schema, connector_schema = schemas
    transcript = write_run(postgres_url, ledger_schema, connector_schema)
    with PostgresStore(postgres_url, schema=ledger_schema, pool_size=1) as store:
        store.register(OBLIGATION_KIND)
        (owed,) = store.select(OBLIGATION_KIND, states=[OS.FAILED])
        store.transition(OBLIGATION_KIND, owed.id, "claim", audit=Audit(5.0, LIVE.label))
        store.transition(OBLIGATION_KIND, owed.id, "deliver", audit=Audit(6.0, DEAD.label))
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {ledger_schema}.statecore_audit (kind, entity_id, event, from_state, "
            "to_state, at, owner) SELECT 'obligation', obligation_id, 'abandon', 'delivered', "
            f"'abandoned', 7.0, 'forger' FROM {ledger_schema}.delivery_obligations "
            "WHERE reply_to = 'm-1'"
        )
        conn.execute(
            f"UPDATE {ledger_schema}.delivery_obligations SET state = 'abandoned', "
            "fence = fence + 1 WHERE reply_to = 'm-1'"
        )
        conn.execute(
            f"INSERT INTO {connector_schema}.statecore_audit (kind, entity_id, event, "
            "from_state, to_state, at) SELECT 'buffer_entry', buffer_id, 'append', 'acked', "
            f"'buffered', 8.0 FROM {connector_schema}.relay_inbound_buffer ORDER BY seq LIMIT 1"
        )
        conn.execute(  # an owner record expired by a write that bumped its fence twice
            f"UPDATE {ledger_schema}.statecore_owners SET state = 'gone', fence = fence + 2"
        )
        conn.execute(
            f"INSERT INTO {ledger_schema}.statecore_audit (kind, entity_id, event, from_state, "
            "to_state, at) SELECT 'owner', record_id, 'expire', 'alive', 'gone', 9.0 "
            f"FROM {ledger_schema}.statecore_owners"
        )
        conn.execute(
            f"UPDATE {connector_schema}.relay_inbound_buffer SET state = 'buffered', "
            "fence = fence + 1 WHERE seq = "
            f"(SELECT min(seq) FROM {connector_schema}.relay_inbound_buffer)"
        )
    report = check_run(
        pg_url=postgres_url,
        ledger_schema=ledger_schema,
        connector_schema=connector_schema,
        transcript=transcript,
    )
    assert violations(report) == {
        "lost": 1,  # m-3: the zombie's deliver says delivered; nothing reached the platform
        "fenced_writes_accepted": 1,
        "double_settles": 1,
        "bad_walks": 1,  # the buffer entry's
        "bad_fences": 1,  # the owner record's: its fence bumped twice by one write
    }
    assert not report.ok
    text = "\n".join(report.problems)
    assert "lost: m-3" in text
    assert f"'deliver' by {DEAD.label!r} accepted while {LIVE.label!r} held the row" in text
    assert "'abandon' into abandoned after it settled" in text
    assert "buffer_entry bad_walk" in text
    assert "owner bad_fence" in text
