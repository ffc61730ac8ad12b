"""Implementations of statecore's Store protocol, and the contract kit every store must pass."""

__all__: list[str] = []
