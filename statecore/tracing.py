"""OpenTelemetry traces of the lifecycles (the optional ``statecore[otel]`` extra).

Off by default and free when off: every hook in the kernel, the gateway runtime and the relay
reads :data:`enabled` (one module attribute) before it does anything else, and does nothing
more while it is False.  It becomes True when

* the ``opentelemetry-api`` package is installed, and
* a real tracer provider is configured -- ``opentelemetry.trace.set_tracer_provider(...)``
  before the ``Gateway`` / ``WebSocketRelayTransport`` / ``Connector`` is built (each calls
  :func:`refresh`), or one handed to :func:`enable`.

What a trace then holds, across processes (docs/tracing.md): the connector's ``connector
inbound`` span for a platform event; the gateway's ``transport inbound`` (its parent is carried
in the relay frame's W3C ``traceparent``), ``gateway handle``, ``obligation record``,
``obligation attempt``, ``obligation deliver`` (with ``transport outbound``, whose context the
outbound frame carries to the connector's ``connector send``) and ``obligation settle``.  An
obligation's ``traceparent`` is kept durably in its creation audit entry (``reason`` = ``trace
<traceparent>``), so a redelivery by another process -- ``obligation redeliver`` -- is a child
of the span that recorded it: the same trace id.

A ``traceparent`` read from a peer or a store is checked (:func:`context_of`): one that is
malformed is ignored (logged at DEBUG), never an error.  Attributes name kinds, ids, fences,
owners, platforms and chats; never message text.
"""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any, Final

__all__ = [
    "AUDIT_PREFIX",
    "OFF",
    "Kind",
    "api_installed",
    "audit_reason",
    "context_of",
    "current_traceparent",
    "disable",
    "enable",
    "enabled",
    "is_traceparent",
    "refresh",
    "span",
    "traceparent_of_reason",
]

log = logging.getLogger(__name__)

try:  # the optional extra: statecore imports and runs without it
    from opentelemetry import trace as _otel_trace
    from opentelemetry.trace import SpanKind as _SpanKind
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    _PROPAGATOR: Any = TraceContextTextMapPropagator()
except ImportError:  # pragma: no cover - exercised by the tests' "API missing" subprocess
    _otel_trace = None  # type: ignore[assignment]
    _SpanKind = None  # type: ignore[assignment,misc]
    _PROPAGATOR = None

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

enabled: bool = False
"""True while spans are made and trace context is carried (see the module docs).  Hooks read
it first: while it is False they do nothing else."""

AUDIT_PREFIX: Final = "trace "
"""How an obligation's creation audit entry names the trace that recorded it (``reason``)."""

_TRACEPARENT: Final = re.compile(r"[0-9a-f]{2}-([0-9a-f]{32})-([0-9a-f]{16})-[0-9a-f]{2}")
_ZERO_TRACE: Final = "0" * 32
_ZERO_SPAN: Final = "0" * 16

_tracer: Tracer | None = None


class Kind:
    """The span kinds the hooks use (names of ``opentelemetry.trace.SpanKind`` members)."""

    INTERNAL: Final = "INTERNAL"
    SERVER: Final = "SERVER"
    CLIENT: Final = "CLIENT"
    PRODUCER: Final = "PRODUCER"
    CONSUMER: Final = "CONSUMER"


OFF: Final = contextlib.nullcontext(None)
"""The no-op context a hook uses instead of :func:`span` while tracing is off (reusable)."""


def api_installed() -> bool:
    """True when ``opentelemetry-api`` can be imported here.  Raises nothing."""
    return _otel_trace is not None


def refresh() -> bool:
    """Turn tracing on when the API is installed and a real tracer provider is configured
    (anything but the API's proxy or no-op provider); return :data:`enabled`.

    Called by the objects that trace (gateway, transport, connector) when they are built; call
    it after configuring a provider later.  Never turns tracing off once on (a provider is set
    once per process; :func:`disable` turns it off).  Raises nothing.
    """
    global enabled, _tracer  # noqa: PLW0603 -- the one switch every hook reads
    if enabled or _otel_trace is None:
        return enabled
    provider = _otel_trace.get_tracer_provider()
    if isinstance(provider, _otel_trace.ProxyTracerProvider | _otel_trace.NoOpTracerProvider):
        return False
    _tracer = provider.get_tracer("statecore")
    enabled = True
    return True


def enable(provider: TracerProvider | None = None) -> None:
    """Turn tracing on with ``provider`` (default: the global one).  Build the gateway,
    transport and connector afterwards: their ``trace`` feature is announced when they are
    built.  Raises ``ModuleNotFoundError`` when ``opentelemetry-api`` is not installed
    (install ``statecore[otel]``)."""
    global enabled, _tracer  # noqa: PLW0603 -- the one switch every hook reads
    if _otel_trace is None:
        raise ModuleNotFoundError(
            "tracing needs opentelemetry-api: pip install 'statecore[otel]'", name="opentelemetry"
        )
    chosen = provider if provider is not None else _otel_trace.get_tracer_provider()
    _tracer = chosen.get_tracer("statecore")
    enabled = True


def disable() -> None:
    """Turn tracing off (no spans, no trace context on the wire for what is built next).
    Raises nothing."""
    global enabled, _tracer  # noqa: PLW0603 -- the one switch every hook reads
    enabled = False
    _tracer = None


# -- trace context -------------------------------------------------------------------------------


def is_traceparent(value: object) -> bool:
    """True for a well-formed W3C ``traceparent`` (version, trace id, parent id, flags; ids
    not all zero).  Raises nothing."""
    if type(value) is not str or len(value) != 55:
        return False
    match = _TRACEPARENT.fullmatch(value)
    return match is not None and match[1] != _ZERO_TRACE and match[2] != _ZERO_SPAN


def context_of(traceparent: object, *, source: str = "peer") -> Context | None:
    """The remote parent context ``traceparent`` names, or None when there is none, tracing is
    off, or it is malformed (logged at DEBUG naming ``source``, never raised)."""
    if traceparent is None or not enabled or _PROPAGATOR is None:
        return None
    if not is_traceparent(traceparent):
        log.debug("ignoring a malformed traceparent from %s: %.80r", source, traceparent)
        return None
    context: Context = _PROPAGATOR.extract({"traceparent": traceparent})
    return context


def current_traceparent() -> str | None:
    """The ``traceparent`` of the current span (to put on the wire or in the store), or None
    when tracing is off or no span is current.  Raises nothing."""
    if not enabled or _PROPAGATOR is None:
        return None
    carrier: dict[str, str] = {}
    _PROPAGATOR.inject(carrier)
    value = carrier.get("traceparent")
    return value if is_traceparent(value) else None


def audit_reason(traceparent: str) -> str:
    """The creation audit entry's ``reason`` that keeps ``traceparent`` durably."""
    return AUDIT_PREFIX + traceparent


def traceparent_of_reason(reason: str | None) -> str | None:
    """The ``traceparent`` an obligation's creation audit ``reason`` keeps, or None.  Raises
    nothing."""
    if not reason or not reason.startswith(AUDIT_PREFIX):
        return None
    value = reason[len(AUDIT_PREFIX) :]
    return value if is_traceparent(value) else None


# -- spans ---------------------------------------------------------------------------------------


@contextlib.contextmanager
def span(
    name: str,
    attributes: Mapping[str, str | int | float | bool | None] | None = None,
    *,
    parent: str | None = None,
    kind: str = Kind.INTERNAL,
    source: str = "peer",
) -> Iterator[Span | None]:
    """Run the block inside a new current span ``name`` with ``attributes`` (``None`` values
    dropped) -- a child of ``parent`` (a ``traceparent``) when one is given and well-formed,
    else of the current span.  Yields the span (None while tracing is off: hooks write
    ``with tracing.span(...) if tracing.enabled else tracing.OFF``).  An exception leaving the
    block is recorded on the span and re-raised unchanged."""
    tracer = _tracer
    if not enabled or tracer is None or _SpanKind is None:
        yield None
        return
    context = context_of(parent, source=source) if parent is not None else None
    clean = {k: v for k, v in (attributes or {}).items() if v is not None}
    with tracer.start_as_current_span(
        name, context=context, kind=_SpanKind[kind], attributes=clean
    ) as current:
        yield current
