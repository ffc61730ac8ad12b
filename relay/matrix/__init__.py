"""The Matrix platform driver: a bot's connector speaks the Matrix client-server API to a
homeserver (``relay.matrix.testing`` starts a throwaway one for tests and examples)."""

from __future__ import annotations

__all__: list[str] = []
