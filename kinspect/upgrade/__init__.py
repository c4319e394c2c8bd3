"""Upgrade readiness: which clients a broker upgrade would break (issue 13)."""
