"""Observers of the proxy's events (metrics, logs) and the HTTP endpoints that serve the metrics."""
