"""The cluster's roster: which gateways are connected to which connector node, kept durably.

Each node of a connector cluster holds the sockets of some gateways; what it holds only it
knows.  So every node publishes its part in the shared store: one row per node (its id is the
node's buffer origin), naming the gateway ids it serves, written again on every heartbeat (the
cluster's sweep timer) and whenever a gateway comes or goes there (a row's history is kept to
:data:`MAX_BEATS` heartbeats: the row is then written afresh).  Any node -- or an operator's
command line, with nothing but the store -- reads the roster back from the rows.

Liveness: a node that is killed (SIGKILL), paused or cut off from the store stops writing its
row, and a row whose last heartbeat is older than the bound (``bound_s``, three heartbeats) is
left out of the roster.  The bound compares the writer's clock with the reader's: the nodes'
clocks must agree to well within it.  A node that stops cleanly leaves at once (``leave``); a
row that stayed silent longer than the retention is marked left by any node's housekeeping and
deleted with its history after that (:meth:`ClusterRoster.prune`).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from enum import StrEnum

import attrs

from statecore.clock import Clock, SystemClock
from statecore.entity import EntityKind, Field
from statecore.lifecycle import Lifecycle, Transition
from statecore.store import Audit, Row, Store, lt

__all__ = ["MAX_BEATS", "NODE", "NODE_KIND", "ClusterRoster", "NodeState", "NodeView"]

MAX_BEATS = 100
"""Heartbeats one row's history holds at most: the next one writes the row afresh (its history
deleted, its ``started_at`` kept)."""


class NodeState(StrEnum):
    """One connector node of a cluster, as its row says."""

    LIVE = "live"
    """The node writes its heartbeat (it is in the roster while the heartbeat is recent)."""
    LEFT = "left"
    """Terminal: the node stopped, or stayed silent longer than the retention."""


_N = NodeState

NODE: Lifecycle[NodeState] = Lifecycle(
    "connector_node",
    NodeState,
    initial=_N.LIVE,
    terminal=(_N.LEFT,),
    description="A connector node of a cluster and the gateways it serves (the roster).",
    transitions=(
        Transition("join", None, _N.LIVE),
        Transition("beat", _N.LIVE, _N.LIVE),
        Transition("leave", _N.LIVE, _N.LEFT),
        Transition("prune", _N.LEFT, None),
    ),
)

NODE_KIND: EntityKind[NodeState] = EntityKind(
    "connector_node",
    NODE,
    table="relay_connector_nodes",
    id_field="node_id",
    fields=(
        Field("url", str, nullable=False),
        # The gateway ids the node serves, a JSON list of strings, sorted.
        Field("gateways", str, nullable=False),
        Field("started_at", float, nullable=False),
        Field("beat_at", float, nullable=False),
    ),
)


@attrs.frozen
class NodeView:
    """One node as the roster shows it."""

    node_id: str
    url: str
    gateways: tuple[str, ...]
    beat_at: float
    """The node's last heartbeat, on its own clock."""
    live: bool
    """True when the heartbeat is within the bound (the node is in the roster)."""


class ClusterRoster:
    """The durable roster over any Store (synchronous: call it off the event loop).

    ``node_id`` is the node this process publishes for (None: a reader only, such as the
    command line); ``bound_s`` is how old a heartbeat may be for its node to count as live.
    """

    def __init__(
        self,
        store: Store,
        *,
        node_id: str | None = None,
        bound_s: float = 15.0,
        clock: Clock | None = None,
    ) -> None:
        if not bound_s > 0:
            raise ValueError(f"bound_s must be positive, not {bound_s!r}")
        self.store = store
        self.node_id = node_id
        self.bound_s = float(bound_s)
        self.clock: Clock = clock or SystemClock()
        store.register(NODE_KIND)

    def publish(self, gateways: Iterable[str], *, url: str = "") -> None:
        """Write this node's part (its heartbeat): the gateway ids it serves now.  A node whose
        row was marked left (it was paused longer than the retention) joins again; a row whose
        history holds :data:`MAX_BEATS` heartbeats is written afresh.  Raises
        ``ValueError`` for a reader (no ``node_id``), ``StoreError`` when the store fails."""
        node_id = self._own()
        now = self.clock.now()
        values = {"url": url, "gateways": json.dumps(sorted(set(gateways))), "beat_at": now}
        audit = Audit(now, node_id)
        with self.store.atomic():
            row = self.store.get(NODE_KIND, node_id)
            started = now
            if row is not None and row.state is _N.LIVE:
                if row.fence < MAX_BEATS:
                    self.store.transition(NODE_KIND, node_id, "beat", audit=audit, changes=values)
                    return
                # Every beat is an audit entry: the row starts over (leave, prune, join) so
                # that its history stays bounded however long the node lives.
                started = row["started_at"]
                self.store.transition(
                    NODE_KIND, node_id, "leave", audit=Audit(now, node_id, reason="rotated")
                )
            if row is not None:
                self.store.prune(NODE_KIND, "prune", where={NODE_KIND.id_field: node_id})
            self.store.insert(
                NODE_KIND, node_id, {**values, "started_at": started}, event="join", audit=audit
            )

    def leave(self) -> None:
        """Take this node out of the roster at once (a clean stop).  Raises ``ValueError`` for
        a reader, ``StoreError`` when the store fails; a node not in the roster is a no-op."""
        node_id = self._own()
        now = self.clock.now()
        self.store.transition_many(
            NODE_KIND, [node_id], "leave", audit=Audit(now, node_id, reason="stopped")
        )

    def nodes(self, *, now: float | None = None) -> list[NodeView]:
        """Every node whose row is live, its heartbeat judged as of ``now`` (default: this
        roster's clock; ``live`` False: silent longer than the bound), in id order.  Raises
        ``StoreError``."""
        now = self.clock.now() if now is None else now
        return [self._view(row, now) for row in self.store.select(NODE_KIND, states=(_N.LIVE,))]

    def read(self) -> dict[str, list[str]]:
        """The roster: node id -> the gateway ids it serves, live nodes only.  Raises
        ``StoreError``."""
        return {view.node_id: list(view.gateways) for view in self.nodes() if view.live}

    def prune(self, *, older_than_s: float) -> int:
        """Mark left the nodes silent for more than ``older_than_s`` (a node killed without a
        clean stop) and delete the rows left longer ago than that; return how many were
        deleted.  Raises ``StoreError``."""
        now = self.clock.now()
        cutoff = now - older_than_s
        with self.store.atomic():
            silent = self.store.select(NODE_KIND, states=(_N.LIVE,), where={"beat_at": lt(cutoff)})
            if silent:
                self.store.transition_many(
                    NODE_KIND,
                    [row.id for row in silent],
                    "leave",
                    audit=Audit(now, reason=f"silent for more than {older_than_s:g} s"),
                    expect={"beat_at": lt(cutoff)},
                )
            # A node that stopped cleanly keeps its last heartbeat: it goes a retention later.
            return self.store.prune(NODE_KIND, "prune", where={"beat_at": lt(cutoff)})

    def _own(self) -> str:
        if self.node_id is None:
            raise ValueError("this roster reads only: it was made without a node_id")
        return self.node_id

    def _view(self, row: Row[NodeState], now: float) -> NodeView:
        try:
            listed = json.loads(row["gateways"])
        except ValueError:
            listed = None  # not written by a node: nothing is taken from it
        if not isinstance(listed, list):
            listed = []
        gateways = tuple(g for g in listed if isinstance(g, str))
        beat_at = float(row["beat_at"])
        return NodeView(
            node_id=row.id,
            url=row["url"],
            gateways=gateways,
            beat_at=beat_at,
            live=now - beat_at <= self.bound_s,
        )
