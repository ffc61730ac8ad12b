"""What recording an obligation writes: the checks on its arguments and the new pending row.

:func:`plan_record` refuses bad arguments before anything is written and builds the store
creation of the pending row: owned by the recording incarnation, leased for the policy's lease,
its id derived from (session key, message ref, content) unless one is given.
"""

from __future__ import annotations

from statecore.batch import Creation
from statecore.checks import platform_id, require_text
from statecore.clock import Clock
from statecore.ids import compute_obligation_id
from statecore.obligation import DEFAULT_PROFILE
from statecore.ownership import Incarnation
from statecore.policy import LedgerPolicy
from statecore.store import Audit

__all__ = ["plan_record"]


def plan_record(
    clock: Clock,
    policy: LedgerPolicy,
    incarnation: Incarnation,
    owner_label: str,
    /,
    *,
    session_key: str,
    platform: str,
    chat_id: str | int,
    content: str,
    message_ref: str | int | None = None,
    obligation_id: str | None = None,
    thread_id: str | int | None = None,
    reply_to: str | int | None = None,
    adapter_profile: str | None = None,
) -> Creation:
    """Check ``Ledger.record``'s arguments and build the store creation of the pending row,
    recorded now (``clock``) under ``incarnation`` (audited as ``owner_label``).

    Raises as ``Ledger.record`` does: ``TypeError`` for non-text content or ids,
    ``ValueError`` for an empty session key, platform, chat id, profile or obligation id.
    """
    require_text("session_key", session_key)
    require_text("platform", platform)
    chat = platform_id("chat_id", chat_id, required=True)
    if not isinstance(content, str):
        raise TypeError(f"content must be a str, not {type(content).__name__}")
    profile = DEFAULT_PROFILE if adapter_profile is None else adapter_profile
    require_text("adapter_profile", profile)
    if obligation_id is None:
        obligation_id = compute_obligation_id(session_key, message_ref, content)
    else:
        require_text("obligation_id", obligation_id)
    now = clock.now()
    me = incarnation
    values = {
        "session_key": session_key,
        "platform": platform,
        "chat_id": chat,
        "thread_id": platform_id("thread_id", thread_id),
        "reply_to": platform_id("reply_to", reply_to),
        "content": content,
        "attempts": 0,
        "created_at": now,
        "updated_at": now,
        "owner_host": me.host,
        "owner_pid": me.pid,
        "owner_started_at": me.started_at,
        "owner_token": me.token,
        "lease_expires_at": now + policy.lease_s,
        "adapter_profile": profile,
    }
    return Creation(obligation_id, values, "record", Audit(now, owner_label, 0))
