"""``statecore buffer``: what the connector's durable inbound buffer holds for sleeping gateway
instances (registered through the ``statecore.cli`` entry point group).

``buffer ls`` lists entries (unacked by default), ``buffer stats`` counts them per state and,
for each gateway instance, its unacked depth and the age of its oldest unacked entry: a depth
that keeps growing is an instance that never comes back for its backlog.  ``buffer held``
counts, per platform, the events held because no gateway listened to them (and the oldest
one's age) and lists them in the order they were held; ``buffer rejected`` lists the events
drivers could not map, with the reason and the raw form; ``buffer roster`` shows which gateways
are connected to which node of a connector cluster (:mod:`relay.connector.nodes`), with the age
of each node's last heartbeat.  All of them only read.
"""

from __future__ import annotations

import argparse
from typing import Any

from relay.connector.buffer import BUFFER, BUFFER_KIND, BufferState
from relay.connector.held import HOLD_KIND, HeldState
from relay.connector.nodes import ClusterRoster, NodeView
from relay.connector.rejected import REJECTED_KIND, RejectedState
from statecore.cli.output import age, duration, shorten, table
from statecore.cli.plugin import EXIT_OK, Command, Context, add_leaf
from statecore.store import Row

__all__ = ["BUFFER_COMMAND", "entry_json", "held_json", "node_json", "rejected_json"]

_UNACKED = BUFFER.sources("ack")
_GROUPS: dict[str, frozenset[BufferState]] = {
    "unacked": _UNACKED,
    "settled": BUFFER.terminal,
    "all": frozenset(BUFFER.states),
}


def entry_json(row: Row[BufferState]) -> dict[str, Any]:
    """One buffer entry as a JSON-ready object (the event itself as its kept JSON text)."""
    return {
        "buffer_id": row.id,
        "state": row.state.value,
        "gateway_id": row["gateway_id"],
        "platform": row["platform"],
        "seq": row["seq"],
        "created_at": row["created_at"],
        "updated_at": row["updated_at"],
        "replays": row["replays"],
        "event_json": row["event_json"],
    }


def _states(names: list[str] | None) -> frozenset[BufferState]:
    chosen: set[BufferState] = set()
    for name in names or ["unacked"]:
        chosen.update(_GROUPS[name] if name in _GROUPS else (BufferState(name),))
    return frozenset(chosen)


def _ls(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(BUFFER_KIND)
    states = _states(args.state)
    where = None if args.gateway is None else {"gateway_id": args.gateway}
    limit = args.limit or None
    rows = store.select(BUFFER_KIND, states=states, where=where, order_by="seq", limit=limit)
    total = store.count(BUFFER_KIND, states=states, where=where)
    now = ctx.now()

    def text() -> str:
        if not rows:
            return "no buffer entries in state " + ", ".join(sorted(s.value for s in states)) + "\n"
        shown = table(
            ("ID", "STATE", "GATEWAY", "PLATFORM", "SEQ", "AGE", "REPLAYS"),
            [
                (
                    r.id,
                    r.state.value,
                    r["gateway_id"],
                    r["platform"],
                    r["seq"],
                    age(r["created_at"], now),
                    r["replays"],
                )
                for r in rows
            ],
        )
        if len(rows) < total:
            shown += f"{len(rows)} of {total} shown (--limit 0 shows all)\n"
        return shown

    ctx.emit({"total": total, "entries": [entry_json(r) for r in rows]}, text)
    return EXIT_OK


def _stats(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(BUFFER_KIND)
    now = ctx.now()
    counts = {s.value: store.count(BUFFER_KIND, states=(s,)) for s in BUFFER.states}
    gateways: dict[str, dict[str, Any]] = {}
    for row in store.select(BUFFER_KIND, states=_UNACKED, order_by="created_at"):
        seen = gateways.setdefault(
            row["gateway_id"], {"unacked": 0, "oldest_unacked_age_s": now - row["created_at"]}
        )
        seen["unacked"] += 1
    data = {"states": counts, "total": sum(counts.values()), "gateways": gateways}

    def text() -> str:
        shown = table(("STATE", "ENTRIES"), [*counts.items(), ("total", data["total"])])
        if not gateways:
            return shown + "no gateway instance has unacked entries\n"
        return (
            shown
            + "\n"
            + table(
                ("GATEWAY", "UNACKED", "OLDEST"),
                [
                    (g, v["unacked"], duration(v["oldest_unacked_age_s"]))
                    for g, v in sorted(gateways.items())
                ],
            )
        )

    ctx.emit(data, text)
    return EXIT_OK


def held_json(row: Row[HeldState], now: float) -> dict[str, Any]:
    """One held event as a JSON-ready object (the event as its kept JSON text)."""
    return {
        "held_id": row.id,
        "state": row.state.value,
        "platform": row["platform"],
        "seq": row["seq"],
        "created_at": row["created_at"],
        "age_s": max(0.0, now - row["created_at"]),
        "event_json": row["event_json"],
    }


def _held(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(HOLD_KIND)
    now = ctx.now()
    where = None if args.platform is None else {"platform": args.platform}
    waiting = (HeldState.HELD,)
    platforms: dict[str, dict[str, Any]] = {}
    for row in store.select(HOLD_KIND, states=waiting, where=where, order_by="created_at"):
        entry = platforms.setdefault(
            row["platform"], {"held": 0, "oldest_age_s": max(0.0, now - row["created_at"])}
        )
        entry["held"] += 1
    total = sum(p["held"] for p in platforms.values())
    limit = args.limit or None
    rows = store.select(HOLD_KIND, states=waiting, where=where, order_by="seq", limit=limit)
    data = {
        "total": total,
        "platforms": platforms,
        "entries": [held_json(r, now) for r in rows],
    }

    def text() -> str:
        if not platforms:
            return "no events are held\n"
        shown = table(
            ("PLATFORM", "HELD", "OLDEST"),
            [(p, v["held"], duration(v["oldest_age_s"])) for p, v in sorted(platforms.items())],
        )
        shown += "\n" + table(
            ("ID", "PLATFORM", "SEQ", "AGE", "EVENT"),
            [
                (r.id, r["platform"], r["seq"], age(r["created_at"], now), shorten(r["event_json"]))
                for r in rows
            ],
        )
        if len(rows) < total:
            shown += f"{len(rows)} of {total} shown (--limit 0 shows all)\n"
        return shown

    ctx.emit(data, text)
    return EXIT_OK


def rejected_json(row: Row[RejectedState]) -> dict[str, Any]:
    """One rejected-event record as a JSON-ready object (its raw form as kept, maybe cut)."""
    return {
        "record_id": row.id,
        "state": row.state.value,
        "platform": row["platform"],
        "event_id": row["event_id"],
        "reason": row["reason"],
        "raw": row["raw"],
        "raw_chars": row["raw_chars"],
        "recorded_at": row["recorded_at"],
        "dismissed_at": row["dismissed_at"],
    }


def _rejected(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(REJECTED_KIND)
    now = ctx.now()
    states = tuple(RejectedState) if args.all else (RejectedState.RECORDED,)
    where = None if args.platform is None else {"platform": args.platform}
    limit = args.limit or None
    rows = store.select(
        REJECTED_KIND, states=states, where=where, order_by="recorded_at", limit=limit
    )
    total = store.count(REJECTED_KIND, states=states, where=where)

    def text() -> str:
        if not rows:
            return "no rejected events\n"
        shown = table(
            ("ID", "STATE", "PLATFORM", "EVENT", "AGE", "REASON", "RAW"),
            [
                (
                    shorten(r.id),
                    r.state.value,
                    r["platform"],
                    shorten(r["event_id"]),
                    age(r["recorded_at"], now),
                    shorten(r["reason"]),
                    shorten(r["raw"]),
                )
                for r in rows
            ],
        )
        if len(rows) < total:
            shown += f"{len(rows)} of {total} shown (--limit 0 shows all)\n"
        return shown

    ctx.emit({"total": total, "records": [rejected_json(r) for r in rows]}, text)
    return EXIT_OK


def node_json(view: NodeView, now: float) -> dict[str, Any]:
    """One cluster node as a JSON-ready object."""
    return {
        "node_id": view.node_id,
        "url": view.url,
        "gateways": list(view.gateways),
        "heartbeat_age_s": max(0.0, now - view.beat_at),
        "live": view.live,
    }


def _roster(args: argparse.Namespace, ctx: Context) -> int:
    if not args.bound > 0:
        raise ValueError(f"--bound must be positive, not {args.bound!r}")
    store = ctx.open_store()
    now = ctx.now()
    views = ClusterRoster(store, bound_s=args.bound).nodes(now=now)
    shown_views = views if args.all else [v for v in views if v.live]
    nodes = [node_json(v, now) for v in shown_views]

    def text() -> str:
        if not nodes:
            return "no connector node has a recent heartbeat (a cluster node writes one)\n"
        return table(
            ("NODE", "URL", "HEARTBEAT", "LIVE", "GATEWAYS"),
            [
                (
                    v.node_id,
                    v.url or "-",
                    age(v.beat_at, now),
                    "yes" if v.live else "no",
                    shorten(", ".join(v.gateways) or "-"),
                )
                for v in shown_views
            ],
        )

    ctx.emit({"bound_s": args.bound, "nodes": nodes}, text)
    return EXIT_OK


def _limit(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "--limit",
        type=int,
        default=50,
        metavar="N",
        help=f"show at most N {what} (default 50; 0: all)",
    )


def _build(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="buffer_command", metavar="COMMAND")
    ls = add_leaf(commands, "ls", "list buffer entries in replay order", _ls)
    ls.add_argument(
        "--state",
        action="append",
        choices=[*(s.value for s in BUFFER.states), *_GROUPS],
        help="only this state, or unacked (default), settled, all; may be repeated",
    )
    ls.add_argument("--gateway", metavar="ID", help="only this gateway instance's entries")
    ls.add_argument(
        "--limit",
        type=int,
        default=50,
        metavar="N",
        help="show at most N entries (default 50; 0: all)",
    )
    add_leaf(commands, "stats", "count entries per state, and unacked ones per gateway", _stats)
    held = add_leaf(
        commands,
        "held",
        "count and list the events held because no gateway listened to them",
        _held,
    )
    held.add_argument("--platform", metavar="NAME", help="only this platform's events")
    _limit(held, "events")
    rejected = add_leaf(
        commands, "rejected", "list the events drivers could not map, with why", _rejected
    )
    rejected.add_argument("--platform", metavar="NAME", help="only this platform's records")
    rejected.add_argument("--all", action="store_true", help="dismissed records too")
    _limit(rejected, "records")
    roster = add_leaf(
        commands, "roster", "show which gateways are connected to which cluster node", _roster
    )
    roster.add_argument(
        "--bound",
        type=float,
        default=15.0,
        metavar="SECONDS",
        help="a node whose heartbeat is older is not live (default 15: three sweeps of 5 s)",
    )
    roster.add_argument("--all", action="store_true", help="nodes that are not live too")


BUFFER_COMMAND = Command(
    "buffer", "list and count the connector's inbound buffer for sleeping gateways", _build
)
