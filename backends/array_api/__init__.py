"""The `array-api` backend: the standard-only path, on any array-API namespace."""
