"""Where a PostgreSQL store connects, parsed once from a URL or a ``key=value`` conninfo:
what error messages and ``repr`` show (host, port, database, user), never the password, which
:meth:`Target.scrub` removes from any text that might carry it."""

from __future__ import annotations

import psycopg
from psycopg.conninfo import conninfo_to_dict

__all__ = ["Target"]


class Target:
    """The server, database and user a conninfo names (its password kept out of sight)."""

    def __init__(self, conninfo: str) -> None:
        try:
            params = conninfo_to_dict(conninfo)
        except psycopg.ProgrammingError as exc:
            # The message may quote the conninfo, password included: never pass it on.
            raise ValueError(
                f"not a PostgreSQL URL or conninfo string ({_scrub_any(str(exc), conninfo)})"
            ) from None
        self.conninfo = conninfo
        self.host = str(params.get("host") or params.get("hostaddr") or "localhost")
        self.port = str(params.get("port") or "5432")
        self.dbname = str(params.get("dbname") or params.get("user") or "(default)")
        self.user = None if params.get("user") is None else str(params["user"])
        self._password = None if params.get("password") is None else str(params["password"])

    def __str__(self) -> str:
        who = f"{self.user}@" if self.user else ""
        return f"postgresql://{who}{self.host}:{self.port}/{self.dbname}"

    def __repr__(self) -> str:
        return f"Target({str(self)!r})"

    def scrub(self, text: str) -> str:
        """``text`` with the password (if any) replaced by ``***``."""
        return _scrub_any(text, self._password)


def _scrub_any(text: str, secret: str | None) -> str:
    if secret:
        text = text.replace(secret, "***")
    return text
