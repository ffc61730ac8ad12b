"""``statecore ledger``: list, inspect, count, repair and prune the delivery obligations.

``ls``, ``show``, ``history`` and ``stats`` only read.  ``retry`` and ``abandon`` are the
operator's repairs of :mod:`statecore.repair`, each audited with who (``cli:<name>``) and why;
``prune`` deletes settled rows past an age.  An unknown id or a row in the wrong state is
refused with exit status 2 and nothing written.
"""

from __future__ import annotations

import argparse
import getpass
import re
from typing import Any

from statecore.cli.output import age, duration, shorten, table, timestamp
from statecore.cli.plugin import EXIT_OK, Command, Context, add_leaf
from statecore.errors import UnknownEntity
from statecore.leases import OWNER_KIND, OwnerLeases
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import OBLIGATION_KIND, Obligation
from statecore.ownership import LivenessCache, PsutilProbe
from statecore.policy import LedgerPolicy
from statecore.repair import abandon, prune_settled, retried_from, retry_abandoned, retry_id
from statecore.store import Store, TransitionRecord
from statecore.survey import (
    OWED_STATES,
    SETTLED_STATES,
    ledger_stats,
    list_obligations,
    owner_status,
)

__all__ = [
    "LEDGER_COMMAND",
    "history_json",
    "obligation_json",
    "operator_name",
    "seconds",
    "state_filter",
]

_K = OBLIGATION_KIND
_GROUPS: dict[str, frozenset[ObligationState] | None] = {
    "owed": OWED_STATES,
    "settled": SETTLED_STATES,
    "all": None,
}
_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
DEFAULT_LIMIT = 50


def seconds(text: str) -> float:
    """Parse a positive duration: seconds, or a number with ``s``, ``m``, ``h`` or ``d``
    (``90``, ``15m``, ``7d``).  Raises ``argparse.ArgumentTypeError`` otherwise."""
    match = _DURATION.match(text)
    value = float(match[1]) * _UNITS[match[2]] if match else 0.0
    if not value > 0:
        raise argparse.ArgumentTypeError(f"not a positive duration: {text!r} (e.g. 90, 15m, 7d)")
    return value


def _limit(text: str) -> int | None:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"not a count: {text!r} (0 shows every row)")
    return value or None


def state_filter(names: list[str] | None, *, default: str = "owed") -> frozenset[ObligationState]:
    """The states named on the command line (states or ``owed``, ``settled``, ``all``;
    ``default`` when none were)."""
    chosen: set[ObligationState] = set()
    for name in names or [default]:
        if name in _GROUPS:
            group = _GROUPS[name]
            chosen.update(OBLIGATION.states if group is None else group)
        else:
            chosen.add(ObligationState(name))
    return frozenset(chosen)


def operator_name() -> str:
    """Who runs the command: the login name (``operator`` when it cannot be read)."""
    try:
        return getpass.getuser() or "operator"
    except (OSError, KeyError):
        return "operator"


def obligation_json(obligation: Obligation) -> dict[str, Any]:
    """An obligation as a JSON-ready object (times in seconds since the epoch)."""
    o = obligation
    return {
        "obligation_id": o.obligation_id,
        "state": o.state.value,
        "session_key": o.session_key,
        "platform": o.platform,
        "adapter_profile": o.adapter_profile,
        "chat_id": o.chat_id,
        "thread_id": o.thread_id,
        "reply_to": o.reply_to,
        "content": o.content,
        "attempts": o.attempts,
        "created_at": o.created_at,
        "updated_at": o.updated_at,
        "owner": {
            "host": o.owner.host,
            "pid": o.owner.pid,
            "started_at": o.owner.started_at,
            "token": o.owner.token,
        },
        "lease_expires_at": o.lease_expires_at,
        "last_error": o.last_error,
        "error_kind": o.error_kind,
        "next_attempt_at": o.next_attempt_at,
        "fence": o.fence,
    }


def history_json(record: TransitionRecord) -> dict[str, Any]:
    """One audit entry as a JSON-ready object."""
    return {
        "event": record.event,
        "from": None if record.from_state is None else record.from_state.value,
        "to": record.to_state.value,
        "at": record.at,
        "owner": record.owner,
        "attempts": record.attempts,
        "reason": record.reason,
    }


# -- reads --------------------------------------------------------------------------------


def _ls(args: argparse.Namespace, ctx: Context) -> int:
    states = state_filter(args.state)
    store = ctx.open_store()
    found, total = list_obligations(store, states=states, platform=args.platform, limit=args.limit)
    now = ctx.now()

    def text() -> str:
        named = ", ".join(s.value for s in OBLIGATION.states if s in states)
        if not found:
            where = f" on {args.platform}" if args.platform else ""
            return f"no obligations{where} in state {named}\n"
        rows = [
            (
                o.obligation_id,
                o.state.value,
                o.platform,
                shorten(o.chat_id, 20),
                o.attempts,
                age(o.created_at, now),
                age(o.updated_at, now),
                shorten(o.content, 32),
                shorten(o.last_error, 32),
            )
            for o in found
        ]
        headers = ("ID", "STATE", "PLATFORM", "CHAT", "TRIES", "AGE", "CHANGED", "CONTENT")
        shown = table((*headers, "LAST ERROR"), rows)
        if len(found) < total:
            shown += f"{len(found)} of {total} shown (--limit 0 shows all)\n"
        return shown

    ctx.emit(
        {"total": total, "obligations": [obligation_json(o) for o in found]},
        text,
    )
    return EXIT_OK


def _get(store: Store, obligation_id: str) -> Obligation:
    store.register(_K)
    row = store.get(_K, obligation_id)
    if row is None:
        raise UnknownEntity(_K.name, obligation_id)
    return Obligation.from_row(row)


def _show(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    o = _get(store, args.id)
    now = ctx.now()
    store.register(OWNER_KIND)
    status = owner_status(
        o.owner,
        o.lease_expires_at,
        now=now,
        liveness=LivenessCache(PsutilProbe()),
        leases=OwnerLeases(store),
    )
    origin = retried_from(store.history(_K, o.obligation_id))
    retry = None
    if o.state is ObligationState.ABANDONED:
        row = store.get(_K, retry_id(o.obligation_id))
        retry = None if row is None else {"obligation_id": row.id, "state": row.state.value}
    data = {
        **obligation_json(o),
        "owner_status": status.value,
        "retry_of": origin,
        "retried_as": retry,
    }

    def text() -> str:
        owner = "-" if status.value == "unowned" else str(o.owner)
        lines = [
            ("obligation", o.obligation_id),
            ("state", o.state.value),
            ("platform", f"{o.platform} (profile {o.adapter_profile})"),
            ("chat", o.chat_id),
            ("thread", o.thread_id),
            ("reply to", o.reply_to),
            ("session", o.session_key),
            ("attempts", o.attempts),
            ("recorded", f"{timestamp(o.created_at)} ({age(o.created_at, now)} ago)"),
            ("changed", f"{timestamp(o.updated_at)} ({age(o.updated_at, now)} ago)"),
            ("owner", f"{owner} ({status.value})"),
            ("lease until", timestamp(o.lease_expires_at)),
            ("last error", None if o.last_error is None else f"{o.last_error} ({o.error_kind})"),
            ("next attempt", timestamp(o.next_attempt_at)),
            ("retry of", origin),
            (
                "retried as",
                None if retry is None else f"{retry['obligation_id']} ({retry['state']})",
            ),
        ]
        body = "".join(f"{k:<13}{'-' if v is None else v}\n" for k, v in lines)
        content = "".join(f"  {line}\n" for line in o.content.splitlines() or [""])
        return f"{body}content\n{content}"

    ctx.emit(data, text)
    return EXIT_OK


def _history(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(_K)
    records = store.history(_K, args.id)
    if not records and store.get(_K, args.id) is None:
        raise UnknownEntity(_K.name, args.id)

    def text() -> str:
        rows = [
            (
                timestamp(r.at),
                r.event,
                "-" if r.from_state is None else r.from_state.value,
                r.to_state.value,
                r.attempts,
                r.owner,
                r.reason,
            )
            for r in records
        ]
        return table(("AT", "EVENT", "FROM", "TO", "TRIES", "BY", "REASON"), rows)

    ctx.emit([history_json(r) for r in records], text)
    return EXIT_OK


def _stats(args: argparse.Namespace, ctx: Context) -> int:
    stats = ledger_stats(ctx.open_store(), now=ctx.now())
    oldest = stats.oldest_owed
    data = {
        "states": {s.value: n for s, n in stats.counts.items()},
        "total": stats.total,
        "owed": stats.owed,
        "oldest_owed_age_s": stats.oldest_owed_age_s,
        "oldest_owed_id": None if oldest is None else oldest.obligation_id,
    }

    def text() -> str:
        rows: list[tuple[str, object]] = [(s.value, n) for s, n in stats.counts.items()]
        rows += [("total", stats.total), ("owed", stats.owed)]
        shown = table(("STATE", "ROWS"), rows)
        if oldest is None:
            return shown + "nothing owed\n"
        return (
            shown + f"oldest owed: {duration(stats.oldest_owed_age_s)} "
            f"({oldest.obligation_id}, {oldest.state.value})\n"
        )

    ctx.emit(data, text)
    return EXIT_OK


# -- repairs ------------------------------------------------------------------------------


def _retry(args: argparse.Namespace, ctx: Context) -> int:
    new = retry_abandoned(ctx.open_store(), args.id, by=args.by, reason=args.reason)
    label = (
        "labelled as a possible repeat: an earlier send may have reached the user"
        if new.attempts
        else "plainly: no earlier send began"
    )
    ctx.emit(
        {"retry_of": args.id, "obligation": obligation_json(new)},
        f"recorded {new.obligation_id}: retry of {args.id} by cli:{args.by}, pending with no "
        f"owner;\na running gateway sends it at its next recover tick, or the next one to start "
        f"({label}).\n",
    )
    return EXIT_OK


def _abandon(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    was = _get(store, args.id).state
    done = abandon(store, args.id, by=args.by, reason=args.reason)
    ctx.emit(
        {"was": was.value, "obligation": obligation_json(done)},
        f"abandoned {args.id} (was {was.value}) by cli:{args.by}: {args.reason}\n",
    )
    return EXIT_OK


def _prune(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    with ctx.progress("pruning settled obligations", None) as bar:
        pruned = prune_settled(store, older_than_s=args.older_than, progress=bar.update)
    ctx.emit(
        {"pruned": pruned, "older_than_s": args.older_than},
        f"pruned {pruned} settled obligations unchanged for over {duration(args.older_than)}\n",
    )
    return EXIT_OK


# -- the parser ---------------------------------------------------------------------------


def _build(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="ledger_command", metavar="COMMAND")
    state_names = [s.value for s in OBLIGATION.states]
    ls = add_leaf(commands, "ls", "list obligations, oldest first", _ls)
    ls.add_argument(
        "--state",
        action="append",
        choices=[*state_names, *_GROUPS],
        help="only this state, or owed (default), settled, all; may be repeated",
    )
    ls.add_argument("--platform", help="only this platform")
    ls.add_argument(
        "--limit",
        type=_limit,
        default=DEFAULT_LIMIT,
        metavar="N",
        help=f"show at most N rows (default {DEFAULT_LIMIT}; 0: all)",
    )
    show = add_leaf(commands, "show", "show one obligation and its owner's liveness", _show)
    show.add_argument("id", help="the obligation id")
    history = add_leaf(commands, "history", "print one obligation's audit history", _history)
    history.add_argument("id", help="the obligation id")
    add_leaf(commands, "stats", "count obligations per state and age the oldest owed", _stats)
    for name, run, what in (
        ("retry", _retry, "owe an abandoned reply again, as a new obligation naming it"),
        ("abandon", _abandon, "give up on an owed (pending, attempting, failed) obligation"),
    ):
        repair = add_leaf(commands, name, what, run)
        repair.add_argument("id", help="the obligation id")
        repair.add_argument(
            "--by",
            default=operator_name(),
            metavar="NAME",
            help="who is doing it, for the audit entry (default: your login name)",
        )
        repair.add_argument("--reason", required=True, help="why, for the audit entry")
    prune = add_leaf(commands, "prune", "delete delivered and abandoned rows past an age", _prune)
    prune.add_argument(
        "--older-than",
        type=seconds,
        default=LedgerPolicy().retention,
        metavar="SECONDS",
        help="unchanged for longer than this: seconds or 30m, 12h, 7d "
        f"(default {duration(LedgerPolicy().retention)}, the policy's retention)",
    )


LEDGER_COMMAND = Command(
    "ledger", "list, inspect, count, repair and prune the delivery obligations", _build
)
