"""``with store:`` for the shipped stores: the block's end closes the store."""

from __future__ import annotations

from types import TracebackType
from typing import Self


class ClosesOnExit:
    """Makes a store a context manager: ``with SQLiteStore(path) as store:`` yields the store and
    calls its ``close()`` when the block ends, whether it ends normally or by an exception (which
    then propagates).  Closing is idempotent on every shipped store, so an explicit ``close()``
    inside the block is harmless."""

    def close(self) -> None:
        """Release the store; every class using this mixin defines its own."""
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()
