"""The delivery obligation as persisted: its entity kind, its record and the sweep's claim.

The row layout is the one every store keeps (``delivery_obligations``, keyed by
``obligation_id``); older databases with the original 13 columns are upgraded in place by adding
the columns they lack.
"""

from __future__ import annotations

from typing import Any

import attrs

from statecore.entity import EntityKind, Field, Index
from statecore.lifecycles import OBLIGATION, ObligationState
from statecore.store import Row
from statecore.trusted import trusted_constructor

__all__ = [
    "DEFAULT_PROFILE",
    "OBLIGATION_KIND",
    "RECONNECTED_MARKER",
    "RECOVERED_MARKER",
    "Claim",
    "Obligation",
    "Owner",
]

DEFAULT_PROFILE = "default"
"""The adapter profile of an obligation recorded without one."""

RECOVERED_MARKER = "\u21bb Recovered reply (this may repeat a message you already received):"
"""Prepended to a redelivery after a restart that may duplicate what the user already saw."""

RECONNECTED_MARKER = "\u21bb Resent after reconnecting (this may repeat an earlier message):"
"""Prepended to a runtime retry after the platform connection came back."""

_O = ObligationState
_OWED = frozenset(OBLIGATION.states) - OBLIGATION.terminal  # what a row may still owe

OBLIGATION_KIND: EntityKind[ObligationState] = EntityKind(
    "obligation",
    OBLIGATION,
    table="delivery_obligations",
    id_field="obligation_id",
    fields=(
        Field("session_key", str, nullable=False, immutable=True),
        Field("platform", str, nullable=False, immutable=True),
        Field("chat_id", str, nullable=False, immutable=True),
        Field("thread_id", str, immutable=True),
        Field("reply_to", str, immutable=True),
        Field("content", str, nullable=False, immutable=True),
        Field("attempts", int, nullable=False, default=0),
        Field("created_at", float, nullable=False, immutable=True),
        Field("updated_at", float, nullable=False),
        Field("owner_host", str),
        Field("owner_pid", int),
        Field("owner_started_at", int),
        Field("owner_token", str),
        Field("lease_expires_at", float),
        Field("last_error", str),
        Field("error_kind", str),
        Field("next_attempt_at", float),
        Field("adapter_profile", str, nullable=False, default=DEFAULT_PROFILE),
    ),
    indexes=(
        # Owed rows, by owner: the sweeps read owed rows (all of them, or one owner's), and
        # claims of one owner's rows (``FOR UPDATE SKIP LOCKED ... ORDER BY id LIMIT n``) read
        # them in id order within the owner, so a claim never walks the rows already claimed
        # (they changed owner) as a walk of the primary key would.  Settled rows are never in
        # it, and it does not key on the state: a move between owed states leaves it as it was.
        Index(("owner_pid", "obligation_id"), states=_OWED),
        # The runtime sweep: failed rows of one platform and profile.
        Index(("platform", "adapter_profile"), states=frozenset({_O.FAILED})),
        # Pruning: settled rows by age.
        Index(("updated_at",), states=OBLIGATION.terminal),
    ),
)
"""The persisted shape of :data:`~statecore.OBLIGATION` entities."""


@attrs.frozen
class Owner:
    """The incarnation recorded as a row's owner (any part may be unknown in old rows)."""

    host: str | None
    pid: int | None
    started_at: int | None
    token: str | None

    def __str__(self) -> str:
        return f"{self.host or '?'}:{self.pid or '?'}:{self.started_at or '?'}:{self.token or '?'}"


@attrs.frozen
class Obligation:
    """One delivery obligation as stored (a snapshot: re-read it to see later changes)."""

    obligation_id: str
    session_key: str
    platform: str
    chat_id: str
    thread_id: str | None
    reply_to: str | None
    content: str
    state: ObligationState
    attempts: int
    created_at: float
    updated_at: float
    owner: Owner
    fence: int
    last_error: str | None
    adapter_profile: str
    error_kind: str | None = None
    next_attempt_at: float | None = None
    lease_expires_at: float | None = None

    @classmethod
    def from_row(cls, row: Row[ObligationState]) -> Obligation:
        """Build the record from a store row of :data:`OBLIGATION_KIND`."""
        v: Any = row.values
        # The store checked every value against OBLIGATION_KIND: no second check (hot path).
        return _new_obligation(
            row.id,
            v["session_key"],
            v["platform"],
            v["chat_id"],
            v["thread_id"],
            v["reply_to"],
            v["content"],
            row.state,
            v["attempts"],
            v["created_at"],
            v["updated_at"],
            _new_owner(v["owner_host"], v["owner_pid"], v["owner_started_at"], v["owner_token"]),
            row.fence,
            v["last_error"],
            v["adapter_profile"] or DEFAULT_PROFILE,
            v["error_kind"],
            v["next_attempt_at"],
            v["lease_expires_at"],
        )


_new_owner = trusted_constructor(Owner)
_new_obligation = trusted_constructor(Obligation)


@attrs.frozen
class Claim:
    """A row a sweep claimed for a (re)send: the caller must now send it and settle it
    (``mark_delivered`` / ``mark_failed``), or hand it back with ``release``.

    ``needs_marker`` is True when the resend may duplicate something the user already saw;
    ``reason`` says why (``"recovered"``, ``"reconnected"``, ``"rate_limited"``, or ``"stuck"``
    for this process's own send left attempting by a failed ledger write), ``None`` for a plain
    first send.  :meth:`render` labels ``"stuck"`` resends with the recovered banner.
    """

    obligation: Obligation
    needs_marker: bool
    reason: str | None
    attempts: int
    profile: str

    @property
    def obligation_id(self) -> str:
        """The claimed obligation's id."""
        return self.obligation.obligation_id

    def render(
        self, *, recovered: str = RECOVERED_MARKER, reconnected: str = RECONNECTED_MARKER
    ) -> str:
        """The text to send: the content, labelled when the resend may be a duplicate."""
        if not self.needs_marker:
            return self.obligation.content
        banner = reconnected if self.reason in ("reconnected", "rate_limited") else recovered
        return f"{banner}\n\n{self.obligation.content}"
