"""What a chaos run reports: the summary table printed at its end, and the measured part of
``docs/chaos.md`` (the results document: :data:`DOC_HEAD` says what runs and how each fault is
made, then the run's own numbers)."""

from __future__ import annotations

import math

from tests.chaos.faults import KINDS
from tests.chaos.measure import GOAL_EXTRA_S, KindRow, table
from tests.chaos.run import GATEWAYS, NODES, Outcome

__all__ = ["render_markdown", "render_summary"]

_SHOWN = 10
"""Problems listed by name (the counts are exact)."""


def _pct(value: float) -> str:
    return "-" if math.isnan(value) else f"{100 * value:.0f} %"


def _secs(value: float) -> str:
    if math.isnan(value):
        return "-"
    return "never" if math.isinf(value) else f"{value:.1f} s"


def _goal(row: KindRow) -> str:
    if row.isolated == 0:
        return "not measured"
    verdict = "yes" if row.met else "NO"
    zero = f", {row.zero_after} at 0 %" if row.kind.startswith("pg-") else ""
    return f"{verdict} ({row.goal_met}/{row.isolated}{zero})"


def _rows(outcome: Outcome) -> list[KindRow]:
    rows = table(outcome.measured, outcome.config.lease_s)
    order = {kind: n for n, kind in enumerate(KINDS)}
    return sorted(rows, key=lambda r: order.get(r.kind, len(order)))


def _table_lines(outcome: Outcome) -> list[str]:
    lines = [
        "| fault kind | count | isolated | during | after | recovery p50 | recovery p99 "
        "| goal met |",
        "|---|---:|---:|---:|---:|---:|---:|---|",
    ]
    for row in _rows(outcome):
        lines.append(
            f"| {row.kind} | {row.count} | {row.isolated} | {_pct(row.during)} "
            f"| {_pct(row.after)} | {_secs(row.recovery_p50)} | {_secs(row.recovery_p99)} "
            f"| {_goal(row)} |"
        )
    return lines


def _counts_lines(outcome: Outcome) -> list[str]:
    verdict = outcome.verdict
    lines = [f"History check ({verdict.source}):", ""]
    lines += ["| count | value |", "|---|---:|"]
    lines += [f"| {name} | {value} |" for name, value in verdict.counts.items()]
    if verdict.problems:
        shown = [f"* {p}" for p in verdict.problems[:_SHOWN]]
        more = len(verdict.problems) - _SHOWN
        lines += ["", "Problems:", "", *shown] + ([f"* ... {more} more"] if more > 0 else [])
    if verdict.notes:
        lines += ["", "Notes:", ""] + [f"* {n}" for n in verdict.notes]
    if outcome.harness_problems:
        lines += ["", "Harness problems:", ""] + [f"* {p}" for p in outcome.harness_problems]
    return lines


def _facts(outcome: Outcome) -> str:
    c = outcome.config
    alone = f"every {c.isolate_every}th made alone" if c.isolate_every else "none made alone"
    return (
        f"seed {c.seed}, {len(outcome.faults)} faults ({c.faults} asked, {alone}), "
        f"{GATEWAYS} gateways, {NODES} connector nodes, "
        f"{c.chats} chats in 2 tenants, users writing {c.rate:g} messages/s, lease "
        f"{c.lease_s:g} s (goal: back to 95 % within {c.lease_s + GOAL_EXTRA_S:g} s), steady "
        f"rate {outcome.steady:.2f} replies/s; {outcome.messages} user messages, "
        f"{outcome.replies} bot messages; quiet period {outcome.quiet_s:.1f} s "
        f"({'settled' if outcome.settled else 'NOT settled'}); wall time "
        f"{outcome.wall_s / 60:.1f} min; {outcome.spawn_retries} process starts retried; "
        f"{outcome.pushes} webhook pushes, {outcome.push_refusals} refused or unanswered"
    )


def render_summary(outcome: Outcome) -> str:
    """The plain-text summary printed at the end of a run."""
    verdict = "PASSED" if outcome.ok else "FAILED"
    return "\n".join(
        [
            f"chaos run {verdict}: {_facts(outcome)}",
            "",
            *_table_lines(outcome),
            "",
            *_counts_lines(outcome),
        ]
    )


def render_markdown(outcome: Outcome, command: str, existing: str | None = None) -> str:
    """The results document: ``existing`` (the document as it was) with its
    :data:`MEASURED` section replaced by this run's numbers -- everything before it and every
    later section (``## Findings``, ``## Rerun``) kept; a new document when there is none."""
    verdict = "passed" if outcome.ok else "FAILED"
    section = [
        MEASURED,
        "",
        f"`{command}` {verdict}: {_facts(outcome)}.",
        "",
        "Shares are of the steady rate; *during* runs from a fault's start to its end (at "
        "least 1 s), *after* over the goal window that follows its end.  Recovery: from the "
        "fault's end until a 3 s window performs >= 95 % of the steady rate, measured on the "
        "isolated faults (nothing else began or ran until it recovered); *never* means not "
        "within the window before the next fault.",
        "",
        *_table_lines(outcome),
        "",
        *_counts_lines(outcome),
        "",
    ]
    text = existing if existing is not None else FALLBACK_HEAD
    before, found, rest = text.partition(MEASURED + "\n")
    if not found:
        return before.rstrip() + "\n\n" + "\n".join(section)
    _, heading, after = rest.partition("\n## ")
    return before + "\n".join(section) + ("\n## " + after if heading else "")


MEASURED = "## Measured"
"""The heading of the section a run writes; the rest of the document is kept as it is."""

FALLBACK_HEAD = """# Chaos: the fleet under faults

What runs, the fault kinds and how each is made: `tests/chaos/` (its modules' docs).
"""
