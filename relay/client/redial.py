"""When the gateway's transport dials again: the redial policy, sans I/O, on an injected clock.

The transport tells a :class:`RedialPolicy` what happened (a handshake completed, the
connection was lost with this close, a credential refusal came before any handshake) and asks
it what to do next (end revoked, end replaced, re-dial now or after how long).  The policy owns
every piece of state those decisions read: the backoff ladder, the one-shot allowances of the
close rules, the grace for refusals at start-up and the measured clock offset.  It performs no
I/O and never sleeps, so it is tested on a :class:`~statecore.clock.FakeClock` alone.

It is also where a connection's comings and goings are told to operators: a loss, every
handshake (the first one, a reconnection after a loss with how long it was down and how many
dials it took, a wake-up after dormancy with how long it slept) at INFO with ``extra`` fields
(``relay_url``, ``down_s``, ``attempt``, ``dormant_s``), and to the metrics hook
(``reconnect(url)``, ``dormant(url, seconds)``).
"""

from __future__ import annotations

import logging
import random

import attrs

from relay.wire.logtext import peer_text
from relay.wire.urls import CloseKind, classify_close, connector_time
from statecore.clock import Clock
from statecore.metrics import NO_METRICS, Metrics

__all__ = ["LostVerdict", "RedialPolicy", "durations"]

log = logging.getLogger(__name__)

_CLOCK_OFFSET_MIN_S = 5.0  # smaller offsets are rounding and latency, not a wrong clock


def durations(**values: object) -> dict[str, float]:
    """The transport's timing settings as floats, by name; ``ValueError`` naming the first one
    that is not a non-negative number (a bool is not one)."""
    checked: dict[str, float] = {}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
            raise ValueError(f"{name} must be a non-negative number, not {value!r}")
        checked[name] = float(value)
    return checked


@attrs.frozen
class LostVerdict:
    """What a lost connection means: its :class:`~relay.wire.urls.CloseKind` (``REVOKED``,
    ``REPLACED`` end the transport; anything else re-dials) and the close it came with."""

    kind: CloseKind
    code: int | None
    reason: str | None


class RedialPolicy:
    """The decisions behind every re-dial of one transport (see the module docs).

    ``RedialPolicy(clock, rng, *, backoff_s, max_s, dormant_s, stable_after_s,
    refusal_grace_s, label="relay", metrics=NO_METRICS)`` (``label`` names the connection in
    log lines and metrics): jittered exponential backoff uniform in ``[d/2, d]`` with
    ``d = min(max_s, backoff_s * 2**attempt)``;
    the ladder starts again after a connection that lasted ``stable_after_s``; a dormant
    transport re-dials every ``dormant_s``; credential refusals before the first handshake are
    retried for ``refusal_grace_s``.
    """

    def __init__(
        self,
        clock: Clock,
        rng: random.Random,
        *,
        backoff_s: float,
        max_s: float,
        dormant_s: float,
        stable_after_s: float,
        refusal_grace_s: float,
        label: str = "relay",
        metrics: Metrics = NO_METRICS,
    ) -> None:
        self._clock = clock
        self.label = label
        self.metrics = metrics
        self._rng = rng
        self.backoff_s = backoff_s
        self.max_s = max_s
        self.dormant_s = dormant_s
        self.stable_after_s = stable_after_s
        self.refusal_grace_s = refusal_grace_s
        self.connections = 0
        """Handshakes completed so far (reconnections included)."""
        self.clock_offset_s = 0.0
        """The connector's clock minus ours, measured from a refusal that named its time."""
        self.last_close: tuple[int | None, str | None] = (None, None)
        """The most recent close received from the connector (code, reason)."""
        self._attempt = 0
        self._connected_at: float | None = None
        self._legacy_retry_used = False
        self._immediate_retry_used = False
        self._redial_now = False
        # When the current run of pre-handshake refusals began (monotonic), if one is running.
        self._refused_since: float | None = None
        # Since when the connection is down (lost, or never made) or dormant (monotonic), and
        # how many dials were armed since: what the next handshake reports.
        self._down_since: float | None = clock.monotonic()
        self._dormant_since: float | None = None
        self._dials = 0

    # -- what happened ---------------------------------------------------------------------

    def established(self) -> None:
        """A handshake completed: the one-shot allowances and the refusal grace start over;
        the connection (a first one, a reconnection or a wake-up) is logged and reported."""
        now = self._clock.monotonic()
        self.connections += 1
        self._refused_since = None
        self._connected_at = now
        self._legacy_retry_used = False
        self._immediate_retry_used = False
        self._report(now)

    def went_dormant(self) -> None:
        """The connection was closed to sleep (dormant): the next handshake is a wake-up."""
        self._dormant_since = self._clock.monotonic()

    def _report(self, now: float) -> None:
        """Log (INFO) and report the connection just established."""
        # Every re-dial follows a wait (next_wait); the very first dial is connect()'s own.
        dials = self._dials + (1 if self.connections == 1 else 0)
        self._dials = 0
        dormant_since, self._dormant_since = self._dormant_since, None
        down_since, self._down_since = self._down_since, None
        url = self.label
        if dormant_since is not None:
            slept = now - dormant_since
            log.info(
                "relay %s: woke after %.1f s dormant",
                url,
                slept,
                extra={"relay_url": url, "dormant_s": slept, "attempt": dials},
            )
            self.metrics.dormant(url, slept)
        elif self.connections == 1:
            log.info(
                "relay %s: connected (attempt %d)",
                url,
                dials,
                extra={"relay_url": url, "attempt": dials},
            )
        else:
            down = 0.0 if down_since is None else now - down_since
            log.info(
                "relay %s: reconnected after %.1f s (attempt %d)",
                url,
                down,
                dials,
                extra={"relay_url": url, "down_s": down, "attempt": dials},
            )
            self.metrics.reconnect(url)

    def lost(self, code: int | None, reason: str | None) -> LostVerdict:
        """The connection closed unexpectedly with ``code`` and ``reason`` (None: no close
        frame).  Returns the verdict; when it is a re-dial, :meth:`next_wait` knows how soon."""
        self.last_close = (code, reason)
        if self._down_since is None:  # down since the first loss, through failed re-dials
            self._down_since = self._clock.monotonic()
        # The reason is the connector's text (at most 123 bytes on the wire): escaped.
        shown = None if reason is None else peer_text(reason)
        log.info(
            "relay %s: connection lost (close %s %s)",
            self.label,
            code,
            shown or "",
            extra={"relay_url": self.label, "close_code": code, "close_reason": shown},
        )
        self.measure_clock(reason)
        # A handshake since the last legacy re-dial grants one more (see classify_close).
        handshaken = self.connections > 0 and not self._legacy_retry_used
        kind = classify_close(
            code, reason, handshaken_before=handshaken, ever_handshaken=self.connections > 0
        )
        if kind is CloseKind.REFUSED and not self.refusal_may_be_a_race():
            kind = CloseKind.REVOKED
        if (
            self._connected_at is not None
            and self._clock.monotonic() - self._connected_at >= self.stable_after_s
        ):
            self._attempt = 0  # the connection was stable: start the ladder again
        self._connected_at = None
        if kind is CloseKind.RETRY_ONCE:
            self._legacy_retry_used = True
        immediate = kind in (CloseKind.EXPIRED, CloseKind.RETRY_ONCE)
        if immediate and not self._immediate_retry_used:
            self._immediate_retry_used = True
            self._redial_now = True
        return LostVerdict(kind, code, reason)

    def measure_clock(self, reason: str | None) -> None:
        """A refusal that names the connector's time (its token check found the clocks
        disagreeing): measure the offset, say so, and let later tokens be minted on the
        connector's time (:meth:`token_time`) so that a gateway with a wrong clock connects."""
        theirs = connector_time(reason)
        if theirs is None:
            return
        offset = theirs - self._clock.now()
        if abs(offset) < _CLOCK_OFFSET_MIN_S:
            return
        self.clock_offset_s = offset
        log.warning(
            "relay %s: the connector refused our token for its times (%s); its clock is %+.0f s "
            "from ours: minting tokens on its time from now on (fix this host's clock)",
            self.label,
            peer_text(reason),
            offset,
            extra={"clock_offset_s": offset},
        )

    def refusal_may_be_a_race(self) -> bool:
        """Whether a refusal of our credentials may still be a start-up race: only before the
        first handshake ever made, and only within ``refusal_grace_s`` of the first such
        refusal (after which it is taken as revocation)."""
        if self.connections > 0:
            return False
        now = self._clock.monotonic()
        if self._refused_since is None:
            self._refused_since = now
        if now - self._refused_since >= self.refusal_grace_s:
            return False
        log.info(
            "relay %s: credentials refused before any handshake; retrying with backoff "
            "(a connector that does not know us yet), for %g s more",
            self.label,
            self.refusal_grace_s - (now - self._refused_since),
        )
        return True

    # -- what to do ------------------------------------------------------------------------

    def token_time(self) -> float:
        """The wall time to mint a token at: ours, corrected by the measured offset."""
        return self._clock.now() + self.clock_offset_s

    def next_wait(self, *, dormant: bool) -> float:
        """How long to wait before the next dial: the dormant cadence, once nothing after a
        close that allows an immediate re-dial, else the next step of the backoff ladder."""
        self._dials += 1  # a dial follows every wait
        if dormant:
            return self.dormant_s  # independent of the backoff
        if self._redial_now:
            self._redial_now = False
            return 0.0
        exponent = min(self._attempt, 32)
        ceiling = min(self.max_s, self.backoff_s * (2**exponent))
        self._attempt += 1
        return self._rng.uniform(ceiling / 2, ceiling)
