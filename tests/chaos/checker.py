"""The chaos run's history checker: the store's audit and the platform's transcript, read after
the run has quiesced, against what the system promises.

:func:`check_run` reads two PostgreSQL schemas -- the gateways' ledger (obligations) and the
connector cluster's store (its inbound buffer) -- through :class:`~stores.PostgresStore`, and
the :class:`~tests.chaos.transcript.Transcript` the platform wrote:

* every row's audit is a legal history (``stores.testing.history``): a walk of the declared
  lifecycle (``bad_walks``), fence = audit entries - 1 (``bad_fences``), settled at most once
  (``double_settles``), and for the obligation no write accepted from a fenced-off owner
  (``fenced_writes_accepted``: after a claim by B, a send or settle by A counts unless A
  claimed again); every other kind either schema's catalog lists (the owner records, the
  sessions, the connector cluster's kinds, ...) is checked alike, as its catalog declares it
  (``stores.testing.history.check_catalog``), and counted in the same totals;
* every user message is **answered** -- a bot message ``echo: <text>`` (a redelivery banner
  before it allowed) in its own chat -- or **owed**: not answered, and visibly still owed, its
  obligation (found by chat and ``reply_to`` = the message's id, else by chat and reply text)
  pending, attempting or failed, or, with no obligation yet, an unacked (buffered or sent)
  entry of the connector's buffer for it (found by chat and message id);
* **lost** is everything else unanswered: no obligation and no unacked buffer entry, or an
  obligation the ledger calls delivered that the platform never showed.  An obligation
  abandoned (or a buffer entry expired) without an answer is counted as ``abandoned``: the
  ledger's contract lets a sweep give up on a reply visibly (the row stays queryable, its audit
  says why), so it is reported in ``notes`` and is not a violation;
* copies of an answer after the first must carry a redelivery banner
  (``tests.crash_analysis.BANNERS``; ``unlabelled_duplicates`` otherwise);
* no bot message lands in a chat of another tenant than the message it answers
  (``wrong_tenant``), nor in another chat of the same tenant (``wrong_chat``); a bot message
  answering no user message at all is ``stray``.

The run must have quiesced: faults healed, every push of the platform finished (a message the
platform never handed to a node counts as lost here), the fleet idle.  ``ok`` is True when no
count of a violation is nonzero; ``problems`` says which, message by message (bounded).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator
from enum import Enum
from typing import Any

import attrs

from relay.connector.buffer import BUFFER_KIND, BufferState
from relay.wire.codec import decode_event
from statecore.entity import EntityKind
from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from statecore.store import Row, TransitionRecord
from stores.postgres import PostgresStore
from stores.testing.history import (
    OBLIGATION_OWNERSHIP,
    HistoryReport,
    Ownership,
    check_catalog,
    check_histories,
    rows_with_histories,
)
from tests.chaos.transcript import BotMessage, Transcript, UserMessage
from tests.crash_analysis import split_banner

__all__ = [
    "REPLY_PREFIX",
    "CheckReport",
    "LedgerIndex",
    "check_run",
    "check_transcript",
]

REPLY_PREFIX = "echo: "
"""What the chaos gateways answer a message ``text`` with: ``echo: <text>``."""

MAX_PROBLEMS = 200
"""Problem texts kept per report (the counts are exact)."""

_O = ObligationState
_OWED = frozenset({_O.PENDING, _O.ATTEMPTING, _O.FAILED})
_UNACKED = frozenset({BufferState.BUFFERED, BufferState.SENT})


@attrs.frozen
class CheckReport:
    """What :func:`check_run` found (see the module docs for each count)."""

    messages: int
    answered: int
    owed: int
    lost: int
    abandoned: int
    unlabelled_duplicates: int
    wrong_tenant: int
    wrong_chat: int
    stray: int
    double_settles: int
    fenced_writes_accepted: int
    bad_walks: int
    bad_fences: int
    rows: int
    """Rows whose audit was checked, of every kind."""
    kinds: dict[str, int]
    """Rows checked per kind (``schema.kind``): the obligations, the buffer entries, and every
    other kind the two schemas' catalogs list."""
    problems: list[str]
    notes: list[str]
    """What is reported but no violation: abandoned replies, owed messages."""

    @property
    def ok(self) -> bool:
        """True when no violation was found."""
        return not (
            self.lost
            or self.unlabelled_duplicates
            or self.wrong_tenant
            or self.wrong_chat
            or self.stray
            or self.double_settles
            or self.fenced_writes_accepted
            or self.bad_walks
            or self.bad_fences
        )

    def summary(self) -> str:
        """One line of the counts, for a run's log."""
        return (
            f"messages={self.messages} answered={self.answered} owed={self.owed} "
            f"lost={self.lost} abandoned={self.abandoned} "
            f"unlabelled_duplicates={self.unlabelled_duplicates} "
            f"wrong_tenant={self.wrong_tenant} wrong_chat={self.wrong_chat} stray={self.stray} "
            f"double_settles={self.double_settles} "
            f"fenced_writes_accepted={self.fenced_writes_accepted} bad_walks={self.bad_walks} "
            f"bad_fences={self.bad_fences} rows={self.rows} ok={self.ok}"
        )


@attrs.define
class LedgerIndex:
    """What the stores say about each message: obligations by (chat, reply_to) and by (chat,
    content), buffer entries by (chat, message id) -- the states only."""

    by_reply_to: dict[tuple[str, str], list[Enum]] = attrs.field(factory=lambda: defaultdict(list))
    by_content: dict[tuple[str, str], list[Enum]] = attrs.field(factory=lambda: defaultdict(list))
    buffered: dict[tuple[str, str], list[Enum]] = attrs.field(factory=lambda: defaultdict(list))

    def obligation(self, row: Row[Any]) -> None:
        """Index one obligation row."""
        chat = str(row["chat_id"])
        if row["reply_to"] is not None:
            self.by_reply_to[chat, str(row["reply_to"])].append(row.state)
        self.by_content[chat, str(row["content"])].append(row.state)

    def buffer_entry(self, row: Row[Any]) -> str | None:
        """Index one buffer entry; the reason it cannot be read (None when it can)."""
        try:
            event = decode_event(str(row["event_json"]))
        except ValueError as exc:  # ProtocolError is a ValueError too
            return f"buffer entry {row.id} holds no readable event: {exc}"
        if event.message_id is not None:
            self.buffered[event.source.chat_id, event.message_id].append(row.state)
        return None

    def obligation_states(self, message: UserMessage) -> list[Enum]:
        """The states of the obligations answering ``message`` (by its id, else by text)."""
        found = self.by_reply_to.get((message.chat_id, message.message_id))
        if found:
            return found
        return self.by_content.get((message.chat_id, REPLY_PREFIX + message.text), [])


@attrs.define
class _Counts:
    messages: int = 0
    answered: int = 0
    owed: int = 0
    lost: int = 0
    abandoned: int = 0
    unlabelled_duplicates: int = 0
    wrong_tenant: int = 0
    wrong_chat: int = 0
    stray: int = 0
    problems: list[str] = attrs.field(factory=list)
    notes: list[str] = attrs.field(factory=list)

    def problem(self, text: str) -> None:
        if len(self.problems) < MAX_PROBLEMS:
            self.problems.append(text)

    def note(self, text: str) -> None:
        if len(self.notes) < MAX_PROBLEMS:
            self.notes.append(text)


def check_transcript(transcript: Transcript, index: LedgerIndex) -> CheckReport:
    """The transcript's checks alone (no audit read): every user message answered or owed,
    duplicates labelled, every bot message in the chat of the message it answers.  Returns a
    report whose audit counts are 0.  Raises nothing."""
    counts = _Counts()
    _check_messages(transcript, index, counts)
    return _report(counts, [])


def _check_messages(transcript: Transcript, index: LedgerIndex, c: _Counts) -> None:
    users: dict[tuple[str, str], list[UserMessage]] = defaultdict(list)  # (chat, text) -> msgs
    by_text: dict[str, list[UserMessage]] = defaultdict(list)
    for user in transcript.users():
        users[user.chat_id, user.text].append(user)
        by_text[user.text].append(user)
    copies: dict[tuple[str, str], list[bool]] = defaultdict(list)  # -> labelled flag per copy
    for bot in transcript.bots():
        labelled, body = split_banner(bot.text)
        text = body[len(REPLY_PREFIX) :] if body.startswith(REPLY_PREFIX) else None
        if text is not None and (bot.chat_id, text) in users:
            copies[bot.chat_id, text].append(labelled)
            continue
        _misplaced(bot, None if text is None else by_text.get(text), c)
    for (chat, text), messages in users.items():
        c.messages += len(messages)
        flags = copies.get((chat, text), [])
        c.answered += min(len(flags), len(messages))
        # One answer per message; copies beyond that are repeats and must carry a banner.
        for flag in flags[len(messages) :]:
            if not flag:
                c.unlabelled_duplicates += 1
                c.problem(f"unlabelled duplicate in {chat}: {REPLY_PREFIX}{text!r}")
        for message in messages[len(flags) :]:
            _unanswered(message, index, c)


def _misplaced(bot: BotMessage, candidates: list[UserMessage] | None, c: _Counts) -> None:
    """A bot message that answers no message of its own chat."""
    if not candidates:
        c.stray += 1
        c.problem(f"stray bot message in {bot.chat_id} ({bot.tenant}): {bot.text!r}")
    elif all(m.tenant != bot.tenant for m in candidates):
        c.wrong_tenant += 1
        origin = candidates[0]
        c.problem(
            f"answer to {origin.message_id} of {origin.chat_id} ({origin.tenant}) posted in "
            f"{bot.chat_id} of tenant {bot.tenant}"
        )
    else:
        c.wrong_chat += 1
        origin = next(m for m in candidates if m.tenant == bot.tenant)
        c.problem(f"answer to {origin.message_id} of {origin.chat_id} posted in {bot.chat_id}")


def _unanswered(message: UserMessage, index: LedgerIndex, c: _Counts) -> None:
    """Classify a message with no answer on the platform: owed, abandoned, or lost."""
    what = f"{message.message_id} in {message.chat_id} ({message.text!r})"
    states = index.obligation_states(message)
    owed = [s for s in states if s in _OWED]
    if owed:
        c.owed += 1
        c.note(f"owed: {what}, its obligation {owed[0].value}")
    elif _O.DELIVERED in states:
        c.lost += 1
        c.problem(f"lost: {what}: the ledger says delivered, the platform never showed it")
    elif _O.ABANDONED in states:
        c.abandoned += 1
        c.note(f"abandoned: {what}: its obligation was abandoned (visible in the ledger)")
    else:
        entries = index.buffered.get((message.chat_id, message.message_id), [])
        if any(s in _UNACKED for s in entries):
            c.owed += 1
            c.note(f"owed: {what}, unacked in the connector's buffer")
        elif BufferState.EXPIRED in entries:
            c.abandoned += 1
            c.note(f"abandoned: {what}: its buffer entry expired (counted by the connector)")
        else:
            c.lost += 1
            why = "acked by a gateway" if entries else "in no buffer"
            c.problem(f"lost: {what}: no answer, no obligation, {why}")


def _report(c: _Counts, histories: list[tuple[str, HistoryReport]]) -> CheckReport:
    """The report of the transcript's counts and the audits' (``(schema, report)`` pairs)."""
    problems = list(c.problems)
    for _, history in histories:
        problems.extend(history.problems[: max(0, MAX_PROBLEMS - len(problems))])
    reports = [h for _, h in histories]
    return CheckReport(
        messages=c.messages,
        answered=c.answered,
        owed=c.owed,
        lost=c.lost,
        abandoned=c.abandoned,
        unlabelled_duplicates=c.unlabelled_duplicates,
        wrong_tenant=c.wrong_tenant,
        wrong_chat=c.wrong_chat,
        stray=c.stray,
        double_settles=sum(h.double_settles for h in reports),
        fenced_writes_accepted=sum(h.fenced_writes for h in reports),
        bad_walks=sum(h.bad_walks for h in reports),
        bad_fences=sum(h.bad_fences for h in reports),
        rows=sum(h.rows for h in reports),
        kinds={f"{schema}.{h.kind}": h.rows for schema, h in histories},
        problems=problems,
        notes=list(c.notes),
    )


def _indexed(
    source: Iterator[tuple[str, Row[Any], list[TransitionRecord]]],
    index: LedgerIndex,
    kind: EntityKind[Any],
    c: _Counts,
) -> Iterator[tuple[str, Row[Any], list[TransitionRecord]]]:
    """The rows of ``source``, each indexed on its way to the history check."""
    for item in source:
        if kind is OBLIGATION_KIND:
            index.obligation(item[1])
        else:
            unreadable = index.buffer_entry(item[1])
            if unreadable is not None:
                c.problem(unreadable)
        yield item


def _check_kind(
    store: PostgresStore,
    kind: EntityKind[Any],
    ownership: Ownership | None,
    index: LedgerIndex,
    c: _Counts,
) -> HistoryReport:
    store.register(kind)
    rows = _indexed(rows_with_histories(store, kind, page=1000), index, kind, c)
    return check_histories(kind, rows, ownership=ownership, max_problems=MAX_PROBLEMS)


def check_run(
    *, pg_url: str, ledger_schema: str, connector_schema: str, transcript: Transcript
) -> CheckReport:
    """Check a quiesced chaos run (see the module docs): the obligations of ``ledger_schema``,
    the buffer entries of ``connector_schema`` (the same schema may hold both), the audit of
    every other kind either schema's catalog lists (walks, fences, settles), and the
    ``transcript``.  Read ``ok``, ``problems`` and the counts.  Raises ``StoreError`` when the
    database cannot be read, ``ValueError`` for a malformed schema name."""
    counts = _Counts()
    index = LedgerIndex()
    histories: list[tuple[str, HistoryReport]] = []
    mine = {OBLIGATION_KIND.name, BUFFER_KIND.name}
    for schema in dict.fromkeys((ledger_schema, connector_schema)):
        with PostgresStore(pg_url, schema=schema, pool_size=1) as store:
            if schema == ledger_schema:
                report = _check_kind(store, OBLIGATION_KIND, OBLIGATION_OWNERSHIP, index, counts)
                histories.append((schema, report))
            if schema == connector_schema:
                histories.append((schema, _check_kind(store, BUFFER_KIND, None, index, counts)))
            others = check_catalog(store, skip=mine, max_problems=MAX_PROBLEMS)
            histories += [(schema, report) for report in others]
    _check_messages(transcript, index, counts)
    return _report(counts, histories)
