"""``statecore doctor``: is this store healthy, and is anything stuck?

First the storage checks the store's package registered for its URL scheme (for SQLite: schema
version, journal mode, integrity, file size), run without writing; then the ledger: rows left
pending or attempting past a threshold, each with its owner's liveness, and the age of the
oldest owed row; then the version of every kind's lifecycle the store's catalog records (and,
where it differs, the version the installed declaration of that kind has).  Exit status 1
when any check found a problem, 2 when the store cannot be examined at all
(unknown URL, missing file, not a database, locked).
"""

from __future__ import annotations

import argparse
from typing import Any

from statecore.cli.ledger import seconds
from statecore.cli.output import duration, shorten
from statecore.cli.plugin import (
    EXIT_FINDINGS,
    EXIT_OK,
    Check,
    CheckStatus,
    CliError,
    Command,
    Context,
    store_scheme,
)
from statecore.errors import StoreError
from statecore.kinds import known_kinds
from statecore.ownership import PsutilProbe
from statecore.store import KindCatalog, Store
from statecore.survey import OwnerStatus, failing_rows, ledger_stats, stuck_rows

__all__ = ["DEFAULT_STUCK_AFTER_S", "DOCTOR_COMMAND", "kind_versions", "ledger_checks"]

DEFAULT_STUCK_AFTER_S = 300.0
"""A pending or attempting row unchanged for this long is stuck (the ledger's default lease)."""
_SHOWN_STUCK = 20

_HINTS = {
    OwnerStatus.DEAD: "owner dead: the next gateway to start or recover claims it",
    OwnerStatus.UNOWNED: "no owner: the next gateway to start or recover claims it",
    OwnerStatus.ALIVE: "owner alive but not sending it: restart that gateway or abandon it",
    OwnerStatus.REMOTE: "owner on another host, lease valid: check that host",
}


def ledger_checks(
    ctx: Context, *, stuck_after_s: float, max_owed_age_s: float | None
) -> list[Check]:
    """The ledger's checks on the context's store: stuck rows and the oldest owed row.  Raises
    :class:`CliError` when the store cannot be opened."""
    store = ctx.open_store()
    now = ctx.now()
    stuck = stuck_rows(store, older_than_s=stuck_after_s, now=now, probe=PsutilProbe())
    stats = ledger_stats(store, now=now)
    checks = []
    if stuck:
        owners: dict[str, int] = {}
        for row in stuck:
            owners[row.owner.value] = owners.get(row.owner.value, 0) + 1
        notes = tuple(
            f"{row.obligation.obligation_id}  {row.obligation.state.value:<10}  "
            f"{duration(row.stuck_for_s):>8}  {_HINTS[row.owner]}"
            for row in stuck[:_SHOWN_STUCK]
        )
        if len(stuck) > _SHOWN_STUCK:
            notes += (f"... and {len(stuck) - _SHOWN_STUCK} more (statecore ledger ls)",)
        checks.append(
            Check(
                "stuck rows",
                CheckStatus.PROBLEM,
                f"{len(stuck)} pending/attempting for over {duration(stuck_after_s)}",
                {
                    "threshold_s": stuck_after_s,
                    "owners": owners,
                    "rows": [
                        {
                            "obligation_id": row.obligation.obligation_id,
                            "state": row.obligation.state.value,
                            "stuck_for_s": row.stuck_for_s,
                            "owner": str(row.obligation.owner),
                            "owner_status": row.owner.value,
                        }
                        for row in stuck
                    ],
                },
                notes,
            )
        )
    else:
        checks.append(
            Check(
                "stuck rows",
                CheckStatus.OK,
                f"none pending/attempting for over {duration(stuck_after_s)}",
                {"threshold_s": stuck_after_s, "owners": {}, "rows": []},
            )
        )
    checks.append(_failing_check(store, now))
    oldest = stats.oldest_owed
    age_s = stats.oldest_owed_age_s
    too_old = max_owed_age_s is not None and age_s is not None and age_s > max_owed_age_s
    checks.append(
        Check(
            "oldest owed",
            CheckStatus.PROBLEM if too_old else CheckStatus.INFO,
            "nothing owed"
            if oldest is None
            else f"{duration(age_s)} ({oldest.obligation_id}, {oldest.state.value}); "
            f"{stats.owed} owed of {stats.total}",
            {
                "age_s": age_s,
                "obligation_id": None if oldest is None else oldest.obligation_id,
                "owed": stats.owed,
                "total": stats.total,
                "limit_s": max_owed_age_s,
            },
        )
    )
    return checks


def kind_versions(store: Store) -> list[dict[str, Any]] | None:
    """Every kind the store's catalog records, by name: its lifecycle, the lifecycle's version
    and when it was registered, with ``installed_version`` the version of the installed
    declaration of that kind (None when no installed package declares it).  None for a store
    that keeps no catalog.  Reads only (registers nothing); raises ``StoreError``."""
    if not isinstance(store, KindCatalog):
        return None
    installed = {k.name: k.lifecycle.version for k in known_kinds()}
    return [
        {
            "name": r.name,
            "lifecycle": r.lifecycle,
            "version": r.version,
            "installed_version": installed.get(r.name),
            "registered_at": r.registered_at,
        }
        for r in store.catalog()
    ]


def _failing_check(store: Store, now: float) -> Check:
    """Owed replies whose sends failed: a problem when one keeps failing (a permanent
    refusal, a retry that failed again, retries spent); else shown with the retry they wait
    for."""
    failing = failing_rows(store)
    stuck = [row for row in failing if row.keeps_failing]
    notes = tuple(
        f"{row.obligation.obligation_id}  {row.kind.value:<12} attempts {row.obligation.attempts}"
        f"  {shorten(row.obligation.last_error or '', 60)!r}  waits for {row.waits_for}"
        + ("" if row.retry_at is None else f" (in {duration(max(0.0, row.retry_at - now))})")
        for row in failing[:_SHOWN_STUCK]
    )
    if len(failing) > _SHOWN_STUCK:
        notes += (
            f"... and {len(failing) - _SHOWN_STUCK} more (statecore ledger ls --state failed)",
        )
    if not failing:
        summary = "no owed reply has failed"
    elif stuck:
        summary = f"{len(stuck)} owed repl{'y keeps' if len(stuck) == 1 else 'ies keep'} failing"
    else:
        summary = f"{len(failing)} failed, each waiting for a retry"
    return Check(
        "failing replies",
        CheckStatus.PROBLEM if stuck else (CheckStatus.INFO if failing else CheckStatus.OK),
        summary,
        {
            "failed": len(failing),
            "keep_failing": len(stuck),
            "rows": [
                {
                    "obligation_id": row.obligation.obligation_id,
                    "kind": row.kind.value,
                    "attempts": row.obligation.attempts,
                    "last_error": row.obligation.last_error,
                    "retry_at": row.retry_at,
                    "keeps_failing": row.keeps_failing,
                }
                for row in failing
            ],
        },
        notes,
    )


def _run(args: argparse.Namespace, ctx: Context) -> int:
    url = ctx.store_url()
    store_scheme(url)  # refuse what is not a URL before anything else
    examine = ctx.storage_checks()
    if examine is None:
        checks = [
            Check(
                "storage",
                CheckStatus.INFO,
                f"no storage checks are installed for {store_scheme(url)}://",
            )
        ]
    else:
        try:
            checks = list(examine(url, quick=args.quick, progress=ctx.progress))
        except (ValueError, StoreError, OSError) as exc:
            raise CliError(f"cannot examine {url}: {exc}") from exc
    kinds: list[dict[str, Any]] | None = None
    if any(c.fatal for c in checks):
        # Opening a store may write (SQLite: its schema); a damaged file is left as found.
        checks.append(
            Check("ledger", CheckStatus.INFO, "not read: the storage must be repaired first")
        )
    else:
        checks += ledger_checks(
            ctx, stuck_after_s=args.stuck_after, max_owed_age_s=args.max_owed_age
        )
        kinds = kind_versions(ctx.open_store())
    problems = sum(c.status is CheckStatus.PROBLEM for c in checks)
    ctx.emit(
        {
            "store": url,
            "ok": not problems,
            "problems": problems,
            "checks": [c.to_json() for c in checks],
            "kinds": kinds,
        },
        lambda: _text(url, checks, problems, kinds),
    )
    return EXIT_FINDINGS if problems else EXIT_OK


def _text(url: str, checks: list[Check], problems: int, kinds: list[dict[str, Any]] | None) -> str:
    width = max(len(c.name) for c in checks)
    lines = [f"statecore doctor: {url}"]
    for check in checks:
        mark = "PROBLEM" if check.status is CheckStatus.PROBLEM else check.status.value
        lines.append(f"  {mark:<8} {check.name:<{width}}  {shorten(check.summary, 200)}")
        lines.extend(f"  {'':<8} {'':<{width}}    {note}" for note in check.notes)
    if kinds:
        lines.append("  kinds (lifecycle version):")
        for k in kinds:
            differs = k["installed_version"] not in (None, k["version"])
            extra = f" (installed declares v{k['installed_version']})" if differs else ""
            lines.append(f"    {k['name']:<{width}}  {k['lifecycle']} v{k['version']}{extra}")
    lines.append(f"{problems} problem{'' if problems == 1 else 's'} found" if problems else "ok")
    return "\n".join(lines) + "\n"


def _build(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--quick",
        action="store_true",
        help="run the storage's quicker integrity check (SQLite: PRAGMA quick_check)",
    )
    parser.add_argument(
        "--stuck-after",
        type=seconds,
        default=DEFAULT_STUCK_AFTER_S,
        metavar="SECONDS",
        help="a pending or attempting row unchanged this long is stuck "
        f"(default {duration(DEFAULT_STUCK_AFTER_S)})",
    )
    parser.add_argument(
        "--max-owed-age",
        type=seconds,
        default=None,
        metavar="SECONDS",
        help="report a problem when the oldest owed row is older than this (default: only show)",
    )
    parser.set_defaults(run=_run)


DOCTOR_COMMAND = Command(
    "doctor",
    "check the store's health, and find stuck rows with their owners' liveness",
    _build,
)
