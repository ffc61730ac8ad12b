"""What must hold after every run: the users' view and the stores' contents, checked against
what the world did.  Each check appends a line per violation; ``checks`` counts what was
checked, so a summary can say how much was proven."""

from __future__ import annotations

from typing import Any

import attrs

from relay.connector.buffer import BUFFER, BUFFER_KIND
from relay.sim.platform import PlatformState, tenant_of
from statecore.entity import EntityKind
from statecore.errors import InvalidTransition
from statecore.ids import compute_obligation_id
from statecore.lifecycle import Lifecycle
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.obligation import OBLIGATION_KIND, RECONNECTED_MARKER, RECOVERED_MARKER
from statecore.store import Store

__all__ = ["Verdict", "check_world"]

BANNERS = (f"{RECOVERED_MARKER}\n\n", f"{RECONNECTED_MARKER}\n\n")
_OWED = frozenset(OBLIGATION.states) - OBLIGATION.terminal


@attrs.define
class Verdict:
    """The violations found, and how many checks were made."""

    violations: list[str] = attrs.Factory(list)
    checks: int = 0
    replies: int = 0
    labelled: int = 0
    abandoned: int = 0

    def expect(self, ok: bool, violation: str) -> None:
        """Count one check; keep ``violation`` when it failed."""
        self.checks += 1
        if not ok:
            self.violations.append(violation)

    def expect_none(self, found: list[str], what: str) -> None:
        """Count one check: that nothing was ``found``; keep each thing found as a violation
        (``what``: one thing found)."""
        self.checks += 1
        self.violations += [f"{what}: {line}" for line in found]


def _body(text: str) -> tuple[bool, str]:
    for banner in BANNERS:
        if text.startswith(banner):
            return True, text[len(banner) :]
    return False, text


def check_world(
    platform: PlatformState,
    *,
    gateway_stores: dict[str, Store],
    gateway_tenants: dict[str, str],
    connector_store: Store,
    acked_unhandled: list[str],
    protocol_errors: int,
) -> Verdict:
    """Check a quiet world (see the module docs)."""
    verdict = Verdict()
    copies: dict[tuple[str, str], list[bool]] = {}
    for sent in platform.performed:
        verdict.replies += 1
        labelled, body = _body(sent.text)
        verdict.labelled += labelled
        copies.setdefault((sent.chat_id, body), []).append(labelled)
        tenant = tenant_of(sent.chat_id)
        verdict.expect(
            tenant == gateway_tenants.get(sent.gateway_id),
            f"egress to a chat of another tenant: {sent.gateway_id} wrote in {sent.chat_id}",
        )
    for (chat, body), flags in copies.items():
        # Every resend that may repeat is labelled; the original is not, and it may reach the
        # user after a labelled resend (a slow platform): at most one unlabelled copy.
        unlabelled = sum(not labelled for labelled in flags)
        verdict.expect(
            unlabelled <= 1, f"an unlabelled duplicate in {chat}: {body!r} x{unlabelled}"
        )
    abandoned = _abandoned_ids(gateway_stores, verdict)
    for message_id in sorted(platform.accepted):
        written = platform.written[message_id]
        reply = f"echo: {written.text}"
        answered = (written.chat_id, reply) in copies
        owed_id = compute_obligation_id(written.chat_id, message_id, reply)
        verdict.expect(
            answered or owed_id in abandoned,
            f"lost: {message_id} in {written.chat_id} has no reply and none was abandoned",
        )
    for entry in acked_unhandled:
        verdict.expect(False, f"acked before its handler returned: {entry}")
    verdict.expect(protocol_errors == 0, f"{protocol_errors} lines no decoder could read")
    for gateway_id, store in sorted(gateway_stores.items()):
        owed = store.count(OBLIGATION_KIND, states=_OWED)
        verdict.expect(owed == 0, f"{gateway_id}: {owed} replies still owed after quiescence")
        _consistent(store, OBLIGATION_KIND, OBLIGATION, verdict, gateway_id)
    unacked = connector_store.count(BUFFER_KIND, states=BUFFER.sources("ack"))
    verdict.expect(unacked == 0, f"connector: {unacked} buffered entries never acked")
    _consistent(connector_store, BUFFER_KIND, BUFFER, verdict, "connector")
    return verdict


def _abandoned_ids(stores: dict[str, Store], verdict: Verdict) -> set[str]:
    """The ids of abandoned replies; each must carry its reason in its history."""
    ids: set[str] = set()
    for gateway_id, store in sorted(stores.items()):
        for row in store.select(OBLIGATION_KIND, states=(ObligationState.ABANDONED,)):
            verdict.abandoned += 1
            history = store.history(OBLIGATION_KIND, row.id)
            verdict.expect(
                bool(history) and bool(history[-1].reason),
                f"{gateway_id}: {row.id} abandoned without a reason",
            )
            ids.add(row.id)
    return ids


def _consistent(
    store: Store, kind: EntityKind[Any], lifecycle: Lifecycle[Any], verdict: Verdict, who: str
) -> None:
    """Every row's history is a walk of declared transitions ending in the row's state."""
    for row in store.select(kind):
        history = store.history(kind, row.id)
        state = None
        for record in history:
            try:
                target = lifecycle.target(record.from_state, record.event)
            except InvalidTransition:
                target = None
            allowed = record.from_state == state and target == record.to_state
            verdict.expect(allowed, f"{who}: {row.id}: undeclared step {record.event}")
            state = record.to_state
        verdict.expect(state == row.state, f"{who}: {row.id}: history ends in {state}")
