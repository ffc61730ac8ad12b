"""``statecore sessions ls`` and ``statecore delegations ls``: the chat runtime's sessions and
delegations as a store holds them (registered through the ``statecore.cli`` entry point group).
Both only read.
"""

from __future__ import annotations

import argparse
from typing import Any

from statecore.cli.output import age, shorten, table
from statecore.cli.plugin import EXIT_OK, Command, Context, add_leaf
from statecore.gateway.delegations import DELEGATION, DELEGATION_KIND, Delegation, DelegationState
from statecore.gateway.sessions import SESSION_KIND, Session, SessionState
from statecore.ownership import LivenessCache, PsutilProbe
from statecore.survey import owner_status

__all__ = ["DELEGATIONS_COMMAND", "SESSIONS_COMMAND", "delegation_json", "session_json"]

_SESSION_GROUPS: dict[str, tuple[SessionState, ...]] = {
    "active": (SessionState.ACTIVE,),
    "ended": (SessionState.ENDED,),
    "all": tuple(SessionState),
}
_OWED_DELEGATIONS = tuple(s for s in DELEGATION.states if s not in DELEGATION.terminal)
_DELEGATION_GROUPS: dict[str, tuple[DelegationState, ...]] = {
    "owed": _OWED_DELEGATIONS,
    "settled": tuple(s for s in DELEGATION.states if s in DELEGATION.terminal),
    "all": tuple(DELEGATION.states),
}


def _limit(value: int) -> int | None:
    return value if value > 0 else None


def session_json(session: Session) -> dict[str, Any]:
    """One session as a JSON-ready object."""
    s = session
    return {
        "session_id": s.session_id,
        "session_key": s.session_key,
        "state": s.state.value,
        "platform": s.platform,
        "chat_id": s.chat_id,
        "started_at": s.started_at,
        "ended_at": s.ended_at,
        "end_reason": s.end_reason,
        "successor_id": s.successor_id,
        "resume_pending": s.resume_pending,
    }


def _sessions_ls(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(SESSION_KIND)
    states = _SESSION_GROUPS[args.state]
    where = None if args.key is None else {"session_key": args.key}
    rows = store.select(
        SESSION_KIND, states=states, where=where, order_by="started_at", limit=_limit(args.limit)
    )
    total = store.count(SESSION_KIND, states=states, where=where)
    found = [Session.from_row(r) for r in rows]
    now = ctx.now()

    def text() -> str:
        if not found:
            return f"no {args.state} sessions\n"
        shown = table(
            ("SESSION", "KEY", "STATE", "PLATFORM", "CHAT", "STARTED", "ENDED", "REASON", "NEXT"),
            [
                (
                    s.session_id,
                    shorten(s.session_key, 32),
                    s.state.value + (" (resume)" if s.resume_pending else ""),
                    s.platform,
                    shorten(s.chat_id, 20),
                    age(s.started_at, now),
                    age(s.ended_at, now),
                    s.end_reason,
                    s.successor_id,
                )
                for s in found
            ],
        )
        if len(found) < total:
            shown += f"{len(found)} of {total} shown (--limit 0 shows all)\n"
        return shown

    ctx.emit({"total": total, "sessions": [session_json(s) for s in found]}, text)
    return EXIT_OK


def delegation_json(delegation: Delegation) -> dict[str, Any]:
    """One delegation as a JSON-ready object (its origin as the routing fields)."""
    d = delegation
    return {
        "delegation_id": d.delegation_id,
        "state": d.state.value,
        "status": d.status,
        "origin": d.origin.to_dict(),
        "created_at": d.created_at,
        "updated_at": d.updated_at,
        "completed_at": d.completed_at,
        "attempts": d.attempts,
        "owner": str(d.owner),
        "last_reason": d.last_reason,
        "delivered_to": d.delivered_to,
    }


def _delegations_ls(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(DELEGATION_KIND)
    states = _DELEGATION_GROUPS[args.state]
    rows = store.select(
        DELEGATION_KIND, states=states, order_by="created_at", limit=_limit(args.limit)
    )
    total = store.count(DELEGATION_KIND, states=states)
    found = [(Delegation.from_row(r), r["lease_expires_at"]) for r in rows]
    now = ctx.now()
    liveness = LivenessCache(PsutilProbe())
    owners = {
        d.delegation_id: owner_status(d.owner, lease, now=now, liveness=liveness).value
        if d.state is DelegationState.RUNNING
        else None
        for d, lease in found
    }

    def text() -> str:
        if not found:
            return f"no {args.state} delegations\n"
        shown = table(
            ("DELEGATION", "STATE", "SESSION KEY", "AGE", "CHANGED", "TRIES", "OWNER", "REASON"),
            [
                (
                    d.delegation_id,
                    d.state.value,
                    shorten(d.origin.session_key, 32),
                    age(d.created_at, now),
                    age(d.updated_at, now),
                    d.attempts,
                    owners[d.delegation_id],
                    shorten(d.last_reason, 40),
                )
                for d, _ in found
            ],
        )
        if len(found) < total:
            shown += f"{len(found)} of {total} shown (--limit 0 shows all)\n"
        return shown

    data = {
        "total": total,
        "delegations": [
            {**delegation_json(d), "owner_status": owners[d.delegation_id]} for d, _ in found
        ],
    }
    ctx.emit(data, text)
    return EXIT_OK


def _build_sessions(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="sessions_command", metavar="COMMAND")
    ls = add_leaf(commands, "ls", "list sessions, oldest first", _sessions_ls)
    ls.add_argument("--state", choices=list(_SESSION_GROUPS), default="active")
    ls.add_argument("--key", help="only the sessions of this session key")
    ls.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (0: all)")


def _build_delegations(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="delegations_command", metavar="COMMAND")
    ls = add_leaf(commands, "ls", "list delegations, oldest first", _delegations_ls)
    ls.add_argument(
        "--state",
        choices=list(_DELEGATION_GROUPS),
        default="owed",
        help="owed (running, completed, unknown; default), settled or all",
    )
    ls.add_argument("--limit", type=int, default=50, metavar="N", help="at most N (0: all)")


SESSIONS_COMMAND = Command("sessions", "list the chat sessions", _build_sessions)
DELEGATIONS_COMMAND = Command(
    "delegations", "list the delegations (durable async work) and their owners", _build_delegations
)
