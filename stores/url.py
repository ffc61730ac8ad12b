"""Opening a store from a URL."""

from __future__ import annotations

from urllib.parse import parse_qs, parse_qsl, unquote, urlencode, urlsplit, urlunsplit

from statecore.store import Store
from stores.memory import InMemoryStore
from stores.sqlite import SQLiteStore

__all__ = ["open_store"]


def open_store(url: str) -> Store:
    """Open the store a URL names.

    * ``memory://`` -- a new :class:`InMemoryStore`;
    * ``sqlite:///relative/or/absolute/path.db`` (``sqlite:////abs/path.db`` also works), with
      optional ``?synchronous=FULL``, ``&busy_timeout_s=10``, ``&page_size=4096`` and
      ``&checkpoint_pages=1000``;
    * ``postgresql://user:password@host:5432/db`` (or ``postgres://``) -- a
      :class:`~stores.postgres.PostgresStore` (needs the ``statecore[postgres]`` extra), with
      optional ``?pool_size=10``, ``&schema=name`` and ``&connect_timeout_s=5``; any other query
      parameter (``sslmode=...``) is passed to libpq.

    The caller owns the store and must ``close()`` it.  Raises ``ValueError`` for a URL of
    another scheme or a malformed one, and ``StoreError`` when the database cannot be opened.
    """
    if not isinstance(url, str):
        raise TypeError(f"a store URL must be a str, not {type(url).__name__}")
    parts = urlsplit(url)
    if parts.scheme == "memory":
        if parts.netloc or parts.path or parts.query:
            raise ValueError(f"memory:// takes no path or options: {url!r}")
        return InMemoryStore()
    if parts.scheme == "sqlite":
        if parts.netloc:
            raise ValueError(f"sqlite URLs have no host; use sqlite:///path: {url!r}")
        path = unquote(parts.path)
        if path.startswith("//"):
            path = path[1:]
        elif path.startswith("/"):
            path = path[1:] or ""
        if not path:
            raise ValueError(f"sqlite URL without a path: {url!r}")
        options = {k: v[-1] for k, v in parse_qs(parts.query, strict_parsing=False).items()}
        unknown = set(options) - {"synchronous", "busy_timeout_s", "page_size", "checkpoint_pages"}
        if unknown:
            raise ValueError(f"unknown sqlite option {sorted(unknown)[0]!r} in {url!r}")
        synchronous = options.get("synchronous", "NORMAL").upper()
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f"synchronous must be NORMAL or FULL in {url!r}")
        try:
            busy = float(options.get("busy_timeout_s", "5"))
        except ValueError:
            raise ValueError(f"busy_timeout_s must be a number in {url!r}") from None
        sizes = {}
        for name in ("page_size", "checkpoint_pages"):
            if name in options:
                try:
                    sizes[name] = int(options[name])
                except ValueError:
                    raise ValueError(f"{name} must be an integer in {url!r}") from None
        return SQLiteStore(
            path,
            synchronous="FULL" if synchronous == "FULL" else "NORMAL",
            busy_timeout_s=busy,
            **sizes,
        )
    if parts.scheme in ("postgresql", "postgres"):
        return _open_postgres(url)
    raise ValueError(
        "unsupported store URL: use memory://, sqlite:///path or postgresql://host/db "
        f"(got scheme {parts.scheme!r})"
    )


_POSTGRES_OPTIONS = ("pool_size", "schema", "connect_timeout_s")


def _open_postgres(url: str) -> Store:
    """A PostgresStore for a ``postgresql://`` URL; the store's own options are taken out of the
    query, the rest is libpq's.  Messages never quote the URL: it may hold a password."""
    from stores.postgres import PostgresStore  # noqa: PLC0415 -- psycopg is an optional extra

    parts = urlsplit(url)
    ours: dict[str, str] = {}
    theirs: list[tuple[str, str]] = []
    for key, value in parse_qsl(parts.query, keep_blank_values=True):
        if key in _POSTGRES_OPTIONS:
            ours[key] = value
        else:
            theirs.append((key, value))
    try:
        pool_size = int(ours.get("pool_size", "10"))
        timeout = float(ours.get("connect_timeout_s", "5"))
    except ValueError:
        raise ValueError(
            "pool_size and connect_timeout_s must be numbers in a postgresql URL"
        ) from None
    return PostgresStore(
        urlunsplit(parts._replace(query=urlencode(theirs))),
        pool_size=pool_size,
        connect_timeout_s=timeout,
        schema=ours.get("schema"),
    )
