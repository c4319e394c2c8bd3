"""Shared helpers for kinspect's tests (brokers, relays)."""
