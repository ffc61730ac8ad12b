"""``statecore undeliverable ls``: the buffered deliveries a gateway recorded as undeliverable
(a poison event it could never handle) before acking them, so an operator can see what was not
delivered (registered through the ``statecore.cli`` entry point group).  Only reads.
"""

from __future__ import annotations

import argparse
from typing import Any

from relay.client.dedupe import UNDELIVERABLE, UNDELIVERABLE_KIND, UndeliverableState
from statecore.cli.output import age, shorten, table
from statecore.cli.plugin import EXIT_OK, Command, Context, add_leaf

__all__ = ["UNDELIVERABLE_COMMAND"]


def _ls(args: argparse.Namespace, ctx: Context) -> int:
    store = ctx.open_store()
    store.register(UNDELIVERABLE_KIND)
    states = tuple(UNDELIVERABLE.states) if args.all else (UndeliverableState.RECORDED,)
    rows = store.select(UNDELIVERABLE_KIND, states=states, order_by="recorded_at")
    now = ctx.now()
    data: list[dict[str, Any]] = [
        {
            "buffer_id": r.id,
            "state": r.state.value,
            "frame_type": r["frame_type"],
            "reason": r["reason"],
            "recorded_at": r["recorded_at"],
            "raw_line": r["raw_line"],
        }
        for r in rows
    ]

    def text() -> str:
        if not rows:
            return "no undeliverable deliveries recorded\n"
        return table(
            ("BUFFER ID", "STATE", "FRAME", "AGE", "REASON", "LINE"),
            [
                (
                    r.id,
                    r.state.value,
                    r["frame_type"],
                    age(r["recorded_at"], now),
                    shorten(r["reason"], 48),
                    shorten(r["raw_line"], 32),
                )
                for r in rows
            ],
        )

    ctx.emit(data, text)
    return EXIT_OK


def _build(parser: argparse.ArgumentParser) -> None:
    commands = parser.add_subparsers(dest="undeliverable_command", metavar="COMMAND")
    ls = add_leaf(commands, "ls", "list deliveries recorded as undeliverable, oldest first", _ls)
    ls.add_argument("--all", action="store_true", help="dismissed ones too")


UNDELIVERABLE_COMMAND = Command(
    "undeliverable", "list buffered deliveries a gateway could not handle", _build
)
