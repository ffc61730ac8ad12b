"""The end of a chaos run: the history checker's counts (``tests/chaos/checker.py``'s
``check_run`` when it is there), else the harness's own reading of the transcript and the
ledger -- every user message answered in its own chat and tenant, every repeat labelled,
nothing owed."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import attrs

from statecore.lifecycles import ObligationState
from statecore.obligation import OBLIGATION_KIND
from stores import PostgresStore
from tests.chaos.gateway_child import REPLY_PREFIX
from tests.chaos.transcript import Transcript
from tests.crash_analysis import split_banner

__all__ = ["COUNTS", "OWED_STATES", "VIOLATIONS", "Verdict", "check"]

OWED_STATES = (ObligationState.PENDING, ObligationState.ATTEMPTING, ObligationState.FAILED)
VIOLATIONS = (
    "lost",
    "unlabelled_duplicates",
    "double_settles",
    "fenced_writes_accepted",
    "bad_walks",
    "bad_fences",
    "wrong_tenant",
    "wrong_chat",
    "stray",
)
"""The checker's counts of violations: every one must be 0."""
NOTED = ("owed", "abandoned", "messages", "answered", "rows")
"""Its other counts: visibly owed (after the quiet period: the harness's own "not settled"),
abandoned visibly (the ledger's contract allows it), and what was checked."""
COUNTS = VIOLATIONS + NOTED


@attrs.frozen
class Verdict:
    """What the checker (or the fallback) found."""

    source: str
    """``tests.chaos.checker`` or ``harness fallback``."""
    counts: dict[str, int]
    problems: tuple[str, ...]
    notes: tuple[str, ...] = ()
    """What the checker reports that is no violation (owed, abandoned), bounded."""

    @property
    def ok(self) -> bool:
        """No violation."""
        return not any(self.counts.get(name, 0) for name in VIOLATIONS)


def check(
    *, pg_url: str, ledger_schema: str, connector_schema: str, transcript: Transcript
) -> Verdict:
    """Run ``tests.chaos.checker.check_run`` when it exists, else :func:`fallback`."""
    try:
        module = importlib.import_module("tests.chaos.checker")
    except ImportError:
        module = None
    check_run: Callable[..., Any] | None = getattr(module, "check_run", None)
    if check_run is None:
        return fallback(pg_url=pg_url, ledger_schema=ledger_schema, transcript=transcript)
    report = check_run(
        pg_url=pg_url,
        ledger_schema=ledger_schema,
        connector_schema=connector_schema,
        transcript=transcript,
    )
    counts = {name: int(getattr(report, name)) for name in COUNTS if hasattr(report, name)}
    problems = tuple(getattr(report, "problems", ()))
    notes = tuple(getattr(report, "notes", ()))[:20]
    return Verdict("tests.chaos.checker", counts, problems, notes)


def fallback(*, pg_url: str, ledger_schema: str, transcript: Transcript) -> Verdict:
    """The harness's own checks: answers and labels from the transcript, owed rows from the
    ledger (the audit's double settles, fenced writes and walks are the checker's: 0 here)."""
    users = {(m.chat_id, m.text): m for m in transcript.users()}
    copies: dict[tuple[str, str], list[bool]] = {}
    wrong_tenant = 0
    problems: list[str] = []
    for bot in transcript.bots():
        labelled, body = split_banner(bot.text)
        text = body.removeprefix(REPLY_PREFIX)
        user = users.get((bot.chat_id, text))
        if user is None:
            problems.append(f"a bot message answers nothing in {bot.chat_id}: {bot.text[:60]!r}")
            continue
        if user.tenant != bot.tenant:
            wrong_tenant += 1
        copies.setdefault((bot.chat_id, text), []).append(labelled)
    lost = sum(key not in copies for key in users)
    unlabelled = sum(not flag for flags in copies.values() for flag in flags[1:])
    store = PostgresStore(pg_url, schema=ledger_schema, pool_size=1)
    try:
        owed = store.count(OBLIGATION_KIND, states=OWED_STATES)
        abandoned = store.count(OBLIGATION_KIND, states=(ObligationState.ABANDONED,))
    finally:
        store.close()
    counts = {
        "lost": lost,
        "unlabelled_duplicates": unlabelled,
        "wrong_tenant": wrong_tenant,
        "stray": len(problems),
        "owed": owed,
        "abandoned": abandoned,
        "messages": len(users),
    }
    return Verdict("harness fallback", counts, tuple(problems[:20]))
