"""The live dashboard of every lifecycle over one store (``/dashboard/``).

:class:`Dashboard` is a :class:`~relay.web.server.WebApp`: serve it with
:class:`~relay.web.server.WebServer` (``statecore dashboard --store URL`` does).  Each browser
gets, over its WebSocket (JSON messages, see :mod:`relay.web._dashboard_requests` for what it
may send):

* ``hello`` -- the store's label, whether actions are possible, per kind (obligations, buffer
  entries, sessions, delegations, and of a connector's store its held and rejected inbound
  events) its counts per state, how many are owed and the oldest owed
  row, of the obligations also how many owed replies keep failing (``keep_failing``: a
  permanent refusal, a retry that failed again, retries spent, as ``statecore doctor`` reads
  them), the owed obligations (``obligations``), the latest changed ones whatever their state
  (``latest``), each flagged when it keeps failing (``keeps_failing``, and of a failed one its
  ``failure``: error kind, last error, what it waits for), the repairs each obligation state
  allows (``actions``, read from the declared lifecycle), the latest transitions and a
  diagram of every lifecycle the ``statecore.lifecycles`` entry points declare (SVG text drawn
  by :func:`~relay.web.diagrams.lifecycle_svg`, with the kind it counts, if any), and
  ``catalog``: every kind the store's catalog records, whatever declared it, drawn from its
  declaration, with its rows per state and its timers (rows running, due now, next due), as
  :mod:`relay.web._dashboard_kinds` reads them (sent again with every ``counts``);
* ``changes`` -- one per audit entry (a move: its event, the state it came from and the one it
  led to; an obligation's flagged the same way, as it is now), as each poll of the store finds
  them, and ``counts`` (with ``keep_failing``) after every poll that found a change (and every
  few seconds, for rows pruned meanwhile);
* ``history`` -- one obligation's audit entries, on request, and the row as it is (flagged the
  same way);
* ``kind_rows`` / ``kind_history`` -- on request (``{"type": "kind_rows", "kind": K, "state":
  S}``, ``{"type": "kind_history", "kind": K, "id": ID}``), any cataloged kind's rows or one
  row's audit entries: ids, states and fences, and field values (cut) only of kinds that are
  not built in;
* ``auth`` -- who a token names; ``done`` / ``refused`` -- the outcome of an operator's
  action; ``error`` -- a message that was not understood (the session stays open).

Operator actions (retry an abandoned obligation, abandon an owed one) are exactly the CLI's
(:mod:`statecore.repair`), audited as ``dashboard:<operator>``, and need a token minted with
:func:`relay.wire.auth.mint_token` from one of the operator secrets the dashboard was given,
living no longer than ``max_token_ttl_s``; without secrets the dashboard is read-only, and
without a valid token every action is refused.  An action on a row in a state the obligation
lifecycle does not start it from is refused too, naming the states it does.

Every store call runs on the dashboard's one worker thread, never on the event loop; the store
is polled only while a browser is connected.  Nothing sent to a browser holds a secret, a token
or the store's URL.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from enum import Enum
from typing import Any, TypeVar

from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed

from relay.web._dashboard_feed import ChangeFeed
from relay.web._dashboard_kinds import CatalogView, KindRequest, parse_kind_request
from relay.web._dashboard_reads import (
    REPAIRS,
    WATCHED,
    all_counts,
    flag_failing,
    obligation_json,
    repair_states,
    snapshot_reads,
)
from relay.web._dashboard_requests import BadRequest, Request, parse
from relay.web.diagrams import lifecycle_svg
from relay.web.server import static_files
from relay.wire.auth import DEFAULT_MAX_TTL_S, verify_token
from relay.wire.errors import AuthError
from statecore.cli.ledger import history_json  # the CLI's own shape of an entry
from statecore.cli.lifecycles import all_lifecycles
from statecore.clock import Clock, SystemClock
from statecore.errors import InvalidTransition, StaleState, StatecoreError, UnknownEntity
from statecore.lifecycle import Lifecycle
from statecore.obligation import OBLIGATION_KIND
from statecore.repair import abandon, retry_abandoned
from statecore.store import Store

__all__ = ["Dashboard"]

log = logging.getLogger("relay.web")

T = TypeVar("T")

COUNTS_EVERY_S = 5.0
"""Counts are read again at least this often while a browser is connected, changes or not
(a prune changes counts without any row changing)."""
BACKLOG = 1000
"""Messages queued for one browser at most; a browser that falls further behind is
disconnected (1013) and reconnects to a fresh snapshot."""
MAX_BROWSERS = 64
"""Browsers served at once; more are refused (1013)."""
_CAP_NAMED = "this dashboard accepts (max_token_ttl_s)"


class _Browser:
    """One connected browser's outgoing messages (sent in order by its sender task)."""

    def __init__(self, generation: float) -> None:
        self.pending: deque[dict[str, Any]] = deque()
        self.ready = asyncio.Event()
        self.overflow = False
        # Broadcasts of polls no later than the snapshot it was sent are already in it.
        self.generation = generation

    def put(self, message: dict[str, Any]) -> None:
        if len(self.pending) >= BACKLOG:
            self.overflow = True
        else:
            self.pending.append(message)
        self.ready.set()


class Dashboard:
    """The dashboard app (see the module docs).

    ``Dashboard(store, *, secrets=None, clock=None, poll_s=0.5, store_label=None,
    show_content=False, max_token_ttl_s=3600)``:
    ``secrets`` maps each operator id to its secrets, newest first (the format of the relay's
    gateway secrets); ``store_label`` is what the page calls the store (give a URL without its
    password; default: the store's class name); ``show_content`` sends replies' text to the
    page -- what the bot told each user, visible to anyone who can open the page, so only where
    every viewer may read every chat (a local demo); without it the page shows that it is
    hidden.  ``max_token_ttl_s`` is the longest lifetime of an operator token it accepts
    (seconds; default :data:`~relay.wire.auth.DEFAULT_MAX_TTL_S`, an hour): a token expiring
    further ahead is refused, saying so, so that a captured one cannot be used for long; a
    local run that mints its operator's token for its own lifetime passes that lifetime.  The
    caller owns ``store``; call :meth:`close` when the server is stopped, before closing the
    store.  Raises ``FileNotFoundError`` when the package's page files are missing,
    ``ValueError`` for a ``poll_s`` that is not positive or a ``max_token_ttl_s`` that is not
    positive and finite, ``TypeError`` for a ``max_token_ttl_s`` that is not a number.
    """

    prefix = "/dashboard"
    title = "Dashboard"

    def __init__(
        self,
        store: Store,
        *,
        secrets: Mapping[str, Sequence[str]] | None = None,
        clock: Clock | None = None,
        poll_s: float = 0.5,
        store_label: str | None = None,
        show_content: bool = False,
        max_token_ttl_s: float = DEFAULT_MAX_TTL_S,
    ) -> None:
        if not poll_s > 0:
            raise ValueError(f"poll_s must be positive, not {poll_s}")
        self._max_token_ttl_s = _token_ttl(max_token_ttl_s)
        self._store = store
        self._secrets = {op: tuple(s) for op, s in (secrets or {}).items() if s}
        self._clock = clock or SystemClock()
        self._poll_s = poll_s
        self._label = store_label or type(store).__name__
        self._files = static_files("dashboard")
        counted = {w.kind.lifecycle.name: w.kind.name for w in WATCHED}
        self._diagrams = [
            {"lifecycle": name, "kind": counted.get(name), "svg": svg} for name, svg in _drawn()
        ]
        self._repairs = repair_states()
        self._actions = _actions(self._repairs)
        # The one thread every store call runs on; the feed and _counted_at are touched only
        # there, so they need no lock.
        self._worker = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dashboard-store")
        self._show_content = show_content
        self._feed = ChangeFeed(self._clock.now(), show_content=show_content)
        self._counted_at = float("-inf")
        self._catalog = CatalogView(store)
        self._browsers: set[_Browser] = set()
        self._poller: asyncio.Task[None] | None = None
        self._wake = asyncio.Event()
        self._closed = False

    @property
    def files(self) -> Mapping[str, tuple[bytes, str]]:
        """The page's files (``index.html``, ``dashboard.js``, ``dashboard.css``)."""
        return self._files

    @property
    def writable(self) -> bool:
        """Whether any operator secret was given (without one, every action is refused)."""
        return bool(self._secrets)

    async def close(self) -> None:
        """Stop polling and wait for the store thread to finish its last call; afterwards
        sessions are refused.  Call it after the server stopped, before closing the store.
        Idempotent; never raises."""
        self._closed = True
        await self._stop_poller()
        await asyncio.to_thread(self._worker.shutdown, True)

    # -- one browser ----------------------------------------------------------------------

    async def session(self, ws: ServerConnection) -> None:
        """Serve one browser's WebSocket until it closes (see the module docs).  Never raises
        for what the browser sends; a store that cannot be read is reported to the browser and
        closes the session (1011)."""
        if self._closed or len(self._browsers) >= MAX_BROWSERS:
            await ws.close(1013, "try again later")
            return
        browser = _Browser(float("inf"))  # holds every broadcast until its snapshot is sent
        self._browsers.add(browser)
        self._start_poller()
        sender: asyncio.Task[None] | None = None
        try:
            try:
                generation, hello = await self._run(self._hello)
            except StatecoreError as exc:
                log.warning("dashboard: the store cannot be read: %s", exc)
                await ws.send(_dump({"type": "error", "error": "the store cannot be read"}))
                await ws.close(1011, "store unavailable")
                return
            await ws.send(_dump(hello))
            browser.generation = generation
            sender = asyncio.create_task(self._send(ws, browser))
            async for message in ws:
                browser.put(await self._answer(message))
        except ConnectionClosed:
            pass
        finally:
            self._browsers.discard(browser)
            if sender is not None:
                sender.cancel()
                await asyncio.gather(sender, return_exceptions=True)
            if not self._browsers:
                await self._stop_poller()

    async def _send(self, ws: ServerConnection, browser: _Browser) -> None:
        """Send ``browser``'s queued messages in order; close it when it fell too far behind."""
        try:
            while True:
                await browser.ready.wait()
                browser.ready.clear()
                if browser.overflow:
                    await ws.close(1013, "too far behind; reconnect")
                    return
                while browser.pending:
                    message = browser.pending.popleft()
                    if message.get("generation", float("inf")) <= browser.generation:
                        continue  # already in this browser's snapshot
                    await ws.send(_dump(message))
        except ConnectionClosed:
            return

    async def _answer(self, message: str | bytes) -> dict[str, Any]:
        """The reply to one message of a browser (an ``error`` for one not understood)."""
        try:
            request: Request | KindRequest = parse_kind_request(message) or parse(message)
        except BadRequest as exc:
            return {"type": "error", "error": str(exc)}
        try:
            if isinstance(request, KindRequest):
                return await self._run(self._catalog.answer, request)
            if request.type == "history":
                assert request.id is not None
                return await self._run(self._history, request.id)
            if request.type == "auth":
                operator, refusal = self._operator(request.token or "")
                return {"type": "auth", "operator": operator, "reason": refusal}
            return await self._act(request)
        except StatecoreError as exc:
            log.warning("dashboard: %s failed: %s", request.type, exc)
            return {"type": "error", "error": f"{request.type}: the store failed"}

    def _operator(self, token: str) -> tuple[str | None, str | None]:
        """The operator ``token`` authenticates, or None and why not."""
        if not self._secrets:
            return None, "read-only: this dashboard has no operator secrets"
        if not token:
            return None, "read-only: no token"
        try:
            operator = verify_token(
                token, self._secrets, now=self._clock.now(), max_ttl_s=self._max_token_ttl_s
            )
        except AuthError as exc:
            if exc.reason == "malformed" and exc.timing:  # genuine, but living too long
                cap = _duration(self._max_token_ttl_s)
                return None, f"the token's lifetime exceeds the {cap} {_CAP_NAMED}"
            return None, f"the token is {exc.reason}"
        return operator, None

    async def _act(self, request: Request) -> dict[str, Any]:
        """An operator's action, done on the store thread when the token is good; a refusal
        (read-only, bad token, unknown id, wrong state) changes nothing."""
        assert request.id is not None
        assert request.reason is not None
        answer: dict[str, Any] = {"action": request.type, "id": request.id}
        operator, refusal = self._operator(request.token or "")
        if operator is None:
            log.info("dashboard: %s of %s refused: %s", request.type, request.id, refusal)
            return {"type": "refused", **answer, "reason": refusal}
        try:
            done = await self._run(self._repair, request, operator)
        except (InvalidTransition, UnknownEntity, StaleState, TypeError, ValueError) as exc:
            log.info(
                "dashboard: %s of %s by %s refused: %s", request.type, request.id, operator, exc
            )
            return {"type": "refused", **answer, "operator": operator, "reason": str(exc)}
        self._wake.set()  # show the move now, not at the next tick
        return {"type": "done", **answer, "operator": operator, **done}

    # -- the store thread -----------------------------------------------------------------

    async def _run(self, work: Callable[..., T], *args: Any) -> T:
        """``work(*args)`` on the store thread."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._worker, functools.partial(work, *args))

    def _hello(self) -> tuple[int, dict[str, Any]]:
        now = self._clock.now()
        return self._feed.generation, {
            "type": "hello",
            "store": self._label,
            "writable": self.writable,
            "now": now,
            "kinds": [
                {
                    "kind": w.kind.name,
                    "title": w.title,
                    "lifecycle": w.kind.lifecycle.name,
                    "states": [s.value for s in w.kind.lifecycle.states],
                    "owed": [s.value for s in w.owed],
                }
                for w in WATCHED
            ],
            **snapshot_reads(
                self._store, now=now, show_content=self._show_content, recent=self._feed.recent
            ),
            "actions": self._actions,
            "diagrams": self._diagrams,
            "catalog": self._catalog.counts(now),
        }

    def _poll(self) -> list[dict[str, Any]]:
        """One poll: the changes found (flagged as their rows are now), then the counts, read
        after every change and when they are due."""
        changes = self._feed.poll(self._store)
        generation = self._feed.generation
        now = self._clock.now()
        if not changes and now - self._counted_at < COUNTS_EVERY_S:
            return []
        self._counted_at = now
        counts, failing = all_counts(self._store, now)
        out: list[dict[str, Any]] = []
        if changes:
            flagged = flag_failing(changes, failing)
            out.append({"type": "changes", "generation": generation, "changes": flagged})
        counted = {"type": "counts", "generation": generation, "now": now, "counts": counts}
        out.append({**counted, "catalog": self._catalog.counts(now)})
        return out

    def _history(self, obligation_id: str) -> dict[str, Any]:
        self._store.register(OBLIGATION_KIND)
        row = self._store.get(OBLIGATION_KIND, obligation_id)
        if row is None:
            return {"type": "history", "id": obligation_id, "found": False, "records": []}
        records = self._store.history(OBLIGATION_KIND, obligation_id)
        return {
            "type": "history",
            "id": obligation_id,
            "found": True,
            "row": obligation_json(
                self._store, row, records[-1] if records else None, show_content=self._show_content
            ),
            "records": [history_json(r) for r in records],
        }

    def _repair(self, request: Request, operator: str) -> dict[str, Any]:
        assert request.id is not None
        assert request.reason is not None
        _check_allowed(self._store, self._repairs[request.type], request.type, request.id)
        common: dict[str, Any] = {"by": operator, "reason": request.reason, "via": "dashboard"}
        if request.type == "abandon":
            done = abandon(self._store, request.id, clock=self._clock, **common)
            return {"state": done.state.value, "message": f"abandoned {request.id}"}
        new = retry_abandoned(self._store, request.id, clock=self._clock, **common)
        return {
            "state": new.state.value,
            "new_id": new.obligation_id,
            "message": f"recorded {new.obligation_id}, a retry of {request.id}, pending",
        }

    # -- the poller -----------------------------------------------------------------------

    def _start_poller(self) -> None:
        if self._poller is None or self._poller.done():
            self._poller = asyncio.create_task(self._poll_loop(), name="dashboard-poll")

    async def _stop_poller(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.cancel()
            await asyncio.gather(poller, return_exceptions=True)

    async def _poll_loop(self) -> None:
        """Poll every ``poll_s`` (sooner after an action) and send what changed to every
        browser; a store error is logged and the next tick tries again."""
        while True:
            try:
                messages = await self._run(self._poll)
            except StatecoreError as exc:
                log.warning("dashboard: polling the store failed: %s", exc)
                messages = []
            for message in messages:
                for browser in list(self._browsers):
                    browser.put(message)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._wake.wait(), self._poll_s)
            self._wake.clear()


class _NotAllowed(ValueError):
    """A repair the obligation lifecycle does not allow from the row's state."""


def _actions(repairs: Mapping[str, tuple[Enum, ...]]) -> dict[str, list[str]]:
    """Each obligation state (its value) -> the repairs ``repairs`` allows from it."""
    return {
        str(state.value): [a for a in REPAIRS if state in repairs[a]]
        for state in OBLIGATION_KIND.lifecycle.states
    }


def _token_ttl(value: object) -> float:
    """``max_token_ttl_s`` checked: a positive, finite number of seconds."""
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise TypeError(f"max_token_ttl_s must be a number of seconds, not {type(value).__name__}")
    if not 0 < value < math.inf:  # also refuses NaN
        raise ValueError(
            f"max_token_ttl_s must be a positive, finite number of seconds, not {value}"
        )
    return float(value)


def _check_allowed(
    store: Store, allowed: tuple[Enum, ...], action: str, obligation_id: str
) -> None:
    """Raise :class:`_NotAllowed` when the obligation is in none of the states ``allowed``
    (those the lifecycle starts ``action`` from); an unknown id is left to the repair, which
    names it.  On the store thread."""
    store.register(OBLIGATION_KIND)
    row = store.get(OBLIGATION_KIND, obligation_id)
    if row is not None and row.state not in allowed:
        state = str(row.state.value)
        article = "an" if state[:1] in "aeiou" else "a"
        where = ", ".join(str(s.value) for s in allowed) or "no state"
        raise _NotAllowed(
            f"{action} is not allowed for {article} {state} obligation (only from {where})"
        )


@functools.cache
def _drawn() -> tuple[tuple[str, str], ...]:
    """(name, SVG) of every lifecycle the ``statecore.lifecycles`` entry points declare
    (statecore's own first, as ``statecore lifecycles`` lists them), then of any watched
    kind's not among them; drawn once per process (the declarations do not change)."""
    drawn: list[Lifecycle[Any]] = list(all_lifecycles())
    names = {lc.name for lc in drawn}
    drawn += [w.kind.lifecycle for w in WATCHED if w.kind.lifecycle.name not in names]
    return tuple((lc.name, lifecycle_svg(lc)) for lc in drawn)


def _duration(seconds: float) -> str:
    """``3600`` -> ``"1 h"``, ``5400`` -> ``"1.5 h"``, ``600`` -> ``"10 min"``, ``45`` ->
    ``"45 s"``."""
    if seconds >= 3600:
        return f"{round(seconds / 3600, 2):g} h"
    if seconds >= 60:
        return f"{round(seconds / 60, 2):g} min"
    return f"{round(seconds, 2):g} s"


def _dump(message: Mapping[str, Any]) -> str:
    return json.dumps(message, separators=(",", ":"), allow_nan=False)
