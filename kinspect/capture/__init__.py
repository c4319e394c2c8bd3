"""Capture: every exchange as a row of Parquet, written off the event loop (schema in schema.py)."""
