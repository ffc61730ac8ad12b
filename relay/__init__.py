"""The relay: the wire between a gateway and the connector that fronts its chat platforms."""

__all__: list[str] = []
