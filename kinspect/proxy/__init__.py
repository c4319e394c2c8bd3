"""The asyncio sidecar proxy: listeners, relays, address rewriting and TLS."""
