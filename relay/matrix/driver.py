"""The Matrix platform driver: a bot on a real homeserver, behind the connector.

:class:`MatrixDriver` is a connector driver (``Connector(store, drivers={"matrix": driver},
...)``): the connector holds the bot's credentials through it, the gateway stays free of any
Matrix code.  It keeps the one rule of every driver (``docs/platforms.md``):

* **Inbound** (:mod:`relay.matrix._sync`): ``/sync`` long polls; the ``next_batch`` token is a
  note in the connector's store, moved only after every event of the batch went through the
  intake (or was recorded as rejected).  A restart resumes from the stored token; the connector
  recognises a redelivered event by its event id.  The bot's own events are passed over.
* **Outbound**: every send and edit is ``PUT .../send/m.room.message/{txnId}``.  For a request
  with an idempotency key the txnId is derived from it (:func:`txn_id`), and the device that
  scopes the server's dedupe outlives restarts (:mod:`relay.matrix._session`), so a resend after
  a crash or an ambiguous timeout is the same request to the server: it makes at most one event.
  The descriptor announces this (``idempotent_sends``, with the server's 24 h window), so the
  gateway sends such a resend without its "possible repeat" label while the window covers it.
  ``M_LIMIT_EXCEEDED`` pauses every request of the driver for ``retry_after_ms``; a failure
  without an answer is asked again under the same txnId within ``send_budget_s``.

Outcome codes: ``too_long`` (``M_TOO_LARGE``), ``bad_action``, ``unsupported_op``,
``not_found`` (an edit of an unknown event), ``forbidden`` (not in the room), ``rate_limited``
and ``platform_down`` (the budget ran out), ``auth`` (the credentials are gone).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import secrets
from collections.abc import Mapping
from typing import Any, Final

from relay.connector.driver_kit import IntakeSlot, LoopTask, RoundLoop, warn_limited
from relay.connector.platform import Intake
from relay.matrix._api import MatrixApi, MatrixAuthError, MatrixError, MatrixUnreachable
from relay.matrix._outbound import OPS, Sender
from relay.matrix._session import NOTE_NEXT_BATCH, Session
from relay.matrix._sync import Rooms, SyncRound, describe
from relay.wire.compat import IDEMPOTENT_SENDS
from relay.wire.descriptor import CONTRACT_VERSION, CapabilityDescriptor
from relay.wire.frames import OutboundOutcome
from relay.wire.throttle import LogLimits
from statecore.clock import Clock, SystemClock

__all__ = ["DEDUPE_WINDOW_S", "MAX_MESSAGE_CHARS", "MatrixDriver", "txn_id"]

log = logging.getLogger("relay.matrix")

DEDUPE_WINDOW_S: Final = 86_400
"""How long the homeserver keeps a transaction id (Synapse: 24 h, across its restarts)."""
MAX_MESSAGE_CHARS: Final = 16_000
"""The longest text the descriptor announces: four bytes a character still fit one event."""
_MSGTYPES: Final = frozenset(("m.text", "m.notice"))


def txn_id(key: str) -> str:
    """The transaction id of every request made under ``key``: stable, URL-safe, 42 chars."""
    return "sc" + hashlib.sha256(key.encode("utf-8")).hexdigest()[:40]


class MatrixDriver:
    """One bot account on one homeserver (see the module docs).

    ``MatrixDriver(homeserver, user_id, *, password=None, access_token=None, device_id=None,
    platform="matrix", label="Matrix", auto_join=True, msgtype="m.text", markdown=True,
    backlog_on_first_start=False, sync_timeout_ms=30000, timeline_limit=200,
    send_budget_s=20.0, request_timeout_s=30.0, clock=None)``

    ``homeserver`` is the base URL (``https://matrix.example.org``); ``user_id`` the bot's full
    id (``@bot:example.org``).  Give a ``password`` (the driver logs in, and again whenever the
    server forgets its token) and/or an ``access_token``.  The token and the device in use are
    kept as notes in the connector's store and win over the configured ones.  ``auto_join``:
    join the rooms the bot is invited to.  ``msgtype``: ``m.text`` or ``m.notice`` for the
    bot's messages.  Raises ``ValueError`` / ``TypeError`` for a bad option.

    Attach it to a connector (the connector calls :meth:`attach`, :meth:`start` and
    :meth:`stop`); :meth:`start` raises :class:`~relay.matrix._api.MatrixAuthError` when the
    credentials are refused for good.  An unreachable homeserver is retried with backoff.
    """

    def __init__(
        self,
        homeserver: str,
        user_id: str,
        *,
        password: str | None = None,
        access_token: str | None = None,
        device_id: str | None = None,
        platform: str = "matrix",
        label: str = "Matrix",
        auto_join: bool = True,
        msgtype: str = "m.text",
        markdown: bool = True,
        backlog_on_first_start: bool = False,
        sync_timeout_ms: int = 30_000,
        timeline_limit: int = 200,
        send_budget_s: float = 20.0,
        request_timeout_s: float = 30.0,
        clock: Clock | None = None,
    ) -> None:
        _check(homeserver, user_id, password, access_token, msgtype)
        if not (isinstance(sync_timeout_ms, int) and 0 <= sync_timeout_ms <= 300_000):
            raise ValueError(f"sync_timeout_ms must be 0 to 300000, not {sync_timeout_ms!r}")
        if not (isinstance(timeline_limit, int) and 1 <= timeline_limit <= 1000):
            raise ValueError(f"timeline_limit must be 1 to 1000, not {timeline_limit!r}")
        if not send_budget_s > 0 or not request_timeout_s > 0:
            raise ValueError("send_budget_s and request_timeout_s must be positive")
        self.platform = platform
        self.homeserver = homeserver.rstrip("/")
        self.user_id = user_id
        self.msgtype = msgtype
        self.markdown = markdown
        self.backlog_on_first_start = backlog_on_first_start
        self.send_budget_s = float(send_budget_s)
        self.clock: Clock = clock or SystemClock()
        self._api = MatrixApi(self.homeserver, request_timeout_s=request_timeout_s)
        self._session = Session(
            self._api,
            platform=platform,
            user_id=user_id,
            password=password,
            access_token=access_token,
            device_id=device_id,
        )
        self._attached = IntakeSlot("Matrix", needs="notes, rejections")
        self.rooms = Rooms()
        self._sync = SyncRound(
            self._api,
            platform=platform,
            me=user_id,
            intake=self._attached,
            rooms=self.rooms,
            auto_join=auto_join,
            sync_timeout_ms=sync_timeout_ms,
            timeline_limit=timeline_limit,
        )
        self._descriptor = CapabilityDescriptor(
            contract_version=CONTRACT_VERSION,
            platform=platform,
            label=label,
            max_message_length=MAX_MESSAGE_CHARS,
            supports_draft_streaming=False,
            supports_edit=True,
            supports_threads=True,
            markdown_dialect="commonmark" if markdown else "plain",
            len_unit="chars",
            supported_ops=OPS,
            features=(IDEMPOTENT_SENDS,),
            idempotency_window_s=DEDUPE_WINDOW_S,
        )
        self._sender = Sender(
            self._api,
            self._session,
            clock=self.clock,
            msgtype=msgtype,
            markdown=markdown,
            send_budget_s=send_budget_s,
        )
        self._task = LoopTask()
        self._log_limits = LogLimits(clock=self.clock)
        self._loop = RoundLoop(self.clock)

    # -- the connector's side -------------------------------------------------------------------

    def attach(self, intake: Intake) -> None:
        """Called by the connector; ``intake`` must be its :class:`DriverIntake` (the notes
        and rejections are kept through it).  Raises ``TypeError`` for a plain callable."""
        self._session.intake = self._attached.attach(intake)

    def descriptor(self) -> CapabilityDescriptor:
        """What the bot can do here (sent to gateways in answer to hello)."""
        return self._descriptor

    @property
    def device_id(self) -> str | None:
        """The device the bot's session uses (None before the first login)."""
        return self._session.device_id

    @property
    def rounds(self) -> int:
        """Sync rounds whose token was saved."""
        return self._loop.rounds

    @property
    def failed_rounds(self) -> int:
        """Sync rounds that ended before the token moved (each retried after a backoff)."""
        return self._loop.failed_rounds

    @property
    def taken(self) -> int:
        """Inbound events handed to the connector's intake by this driver."""
        return self._sync.taken

    @property
    def rejected(self) -> int:
        """Inbound events this driver recorded as rejected (could not be mapped)."""
        return self._sync.rejected

    async def start(self) -> None:
        """Log in (or check the stored token) and start the sync loop.

        Raises :class:`MatrixAuthError` when the homeserver refuses the credentials for good;
        a homeserver that cannot be reached now is retried by the loop, with backoff.
        """
        self._attached()
        if self._task.running:
            return
        self._api.open()
        try:
            await self._session.establish()
        except (MatrixUnreachable, MatrixError) as exc:
            log.warning("matrix: the homeserver cannot log the bot in yet (%s); retrying", exc)
        self._task.start(self._run(), name=f"matrix-sync-{self.platform}")

    async def stop(self) -> None:
        """Stop the sync loop and close the HTTP session; bounded, idempotent, never raises."""
        await self._task.stop()
        await self._api.close()
        self._log_limits.report(log, f"matrix driver {self.platform}")

    # -- inbound ---------------------------------------------------------------------------------

    async def _run(self) -> None:
        since: str | None = None

        async def one_round() -> bool:
            nonlocal since
            if not self._session.ready:
                await self._session.establish()
            if since is None:
                since = await self._attached().load(self.platform, NOTE_NEXT_BATCH)
            if since is None:
                since = await self._sync.first(backlog=self.backlog_on_first_start)
            else:
                since = await self._sync.run(since)
            return False

        await self._loop.run(one_round, self._failed)

    async def _failed(self, exc: Exception) -> float:
        """The wait after a failed round (a lost token is logged in again first)."""
        backoff = self._loop.backoff
        if isinstance(exc, MatrixAuthError):
            self._warn("auth", f"matrix: the bot cannot log in: {exc}")
            return backoff.fail(backoff.longest)
        if isinstance(exc, MatrixError) and exc.unknown_token:
            await self._relogin_quietly()
        if isinstance(exc, MatrixError) and exc.rate_limited and exc.retry_after_ms:
            delay = backoff.fail(exc.retry_after_ms / 1000)
        else:
            delay = backoff.fail()
        self._warn(
            "sync",
            f"matrix: a sync round failed ({describe(exc)}); the cursor stays, "
            f"asking again in {delay:g} s",
        )
        return delay

    async def _relogin_quietly(self) -> None:
        try:
            if not await self._session.relogin(self._api.token):
                self._warn("auth", "matrix: the token is gone and there is no password")
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self._warn("auth", f"matrix: logging in again failed: {describe(exc)}")

    def _warn(self, kind: str, line: str) -> None:
        warn_limited(self._log_limits, log, kind, line)

    # -- outbound --------------------------------------------------------------------------------

    async def perform(self, action: Mapping[str, Any]) -> OutboundOutcome:
        """Perform one action under a transaction id of its own (a resend of it by the relay
        would be a new event: requests with an idempotency key go through
        :meth:`perform_once`).  Never raises for the homeserver's refusals."""
        return await self._sender.perform(action, "r" + secrets.token_hex(16))

    async def perform_once(self, action: Mapping[str, Any], key: str) -> OutboundOutcome:
        """Perform ``action`` so that every call with ``key`` is one event on the server (within
        :data:`DEDUPE_WINDOW_S`, on the same device).  Never raises for refusals."""
        return await self._sender.perform(action, txn_id(key))

    @property
    def rate_limited(self) -> int:
        """Answers ``M_LIMIT_EXCEEDED`` the driver waited out (each asked again after it)."""
        return self._sender.rate_limited


def _check(
    homeserver: object, user_id: object, password: object, token: object, msgtype: object
) -> None:
    if not isinstance(homeserver, str) or not homeserver.startswith(("http://", "https://")):
        raise ValueError(f"homeserver must be an http(s):// URL, not {homeserver!r}")
    if not (isinstance(user_id, str) and user_id.startswith("@") and ":" in user_id):
        raise ValueError(f"user_id must be a full Matrix id like @bot:example.org, not {user_id!r}")
    for name, value in (("password", password), ("access_token", token)):
        if value is not None and (not isinstance(value, str) or not value):
            raise TypeError(f"{name} must be a non-empty str or None")
    if password is None and token is None:
        raise ValueError("give the bot a password or an access_token (or both)")
    if msgtype not in _MSGTYPES:
        raise ValueError(f"msgtype must be one of {sorted(_MSGTYPES)}, not {msgtype!r}")
