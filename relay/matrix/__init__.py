"""The Matrix platform driver: a bot's connector speaks the Matrix client-server API to a
homeserver (:class:`MatrixDriver`; ``relay.matrix.testing`` starts a throwaway homeserver for
tests and examples)."""

from __future__ import annotations

from relay.matrix._api import MatrixAuthError, MatrixError, MatrixUnreachable
from relay.matrix.driver import MatrixDriver

__all__ = ["MatrixAuthError", "MatrixDriver", "MatrixError", "MatrixUnreachable"]
