"""The options of one PostgresStore, checked once, and the connection settings they give.

Every bound the store keeps against a bad server is here: how long a connection attempt may
take, how often an unreachable server is tried again (and how long to wait between tries), how
long a statement may run on the server, and how long a claim may wait for a lock.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

__all__ = ["Options"]

_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")


def _positive(name: str, value: object, *, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if (
        not isinstance(value, int | float)
        or isinstance(value, bool)
        or not value > 0
        or value == float("inf")
    ):
        raise ValueError(f"{name} must be a positive number, not {value!r}")


@dataclass(frozen=True)
class Options:
    """The checked options of a store (see :class:`stores.postgres.PostgresStore`)."""

    pool_size: int = 10
    connect_timeout_s: float = 5.0
    schema: str | None = None
    statement_timeout_s: float | None = None
    connect_retries: int = 3
    retry_backoff_s: float = 0.2
    claim_lock_timeout_s: float = 1.0
    adopt_system_identifier: int | None = None

    def __post_init__(self) -> None:
        """Raise ``ValueError`` for an option out of range (nothing was opened)."""
        pool = self.pool_size
        if not isinstance(pool, int) or isinstance(pool, bool) or pool < 1:
            raise ValueError(f"pool_size must be a positive int, not {pool!r}")
        _positive("connect_timeout_s", self.connect_timeout_s)
        _positive("statement_timeout_s", self.statement_timeout_s, allow_none=True)
        _positive("retry_backoff_s", self.retry_backoff_s)
        _positive("claim_lock_timeout_s", self.claim_lock_timeout_s)
        retries = self.connect_retries
        if not isinstance(retries, int) or isinstance(retries, bool) or retries < 1:
            raise ValueError(f"connect_retries must be a positive int, not {retries!r}")
        if self.schema is not None and not _SCHEMA_NAME.fullmatch(self.schema):
            raise ValueError(f"schema must be a lower-case SQL identifier, not {self.schema!r}")
        adopt = self.adopt_system_identifier
        if adopt is not None and (not isinstance(adopt, int) or isinstance(adopt, bool)):
            raise ValueError(f"adopt_system_identifier must be an int, not {adopt!r}")

    @property
    def pool_timeout_s(self) -> float:
        """How long a call waits for a pooled connection: every connection attempt of the
        bounded retries, with their backoff."""
        backoff = sum(self.retry_backoff_s * 2**n for n in range(self.connect_retries - 1))
        return float(self.connect_timeout_s * self.connect_retries + backoff)

    def delays(self) -> list[float]:
        """The waits between the bounded connection attempts (one fewer than attempts)."""
        return [self.retry_backoff_s * 2**n for n in range(self.connect_retries - 1)]

    def kwargs(self) -> dict[str, Any]:
        """psycopg's connection keyword arguments for these options."""
        kwargs: dict[str, Any] = {
            "autocommit": True,
            "connect_timeout": max(1, round(self.connect_timeout_s)),
            "application_name": "statecore",
        }
        settings = []
        if self.schema is not None:
            settings.append(f"-c search_path={self.schema}")
        if self.statement_timeout_s is not None:
            settings.append(
                f"-c statement_timeout={max(1, round(self.statement_timeout_s * 1000))}"
            )
        if settings:
            kwargs["options"] = " ".join(settings)
        return kwargs
