"""Logs a repeating warning at a bounded rate, saying how many like it were held back."""

from __future__ import annotations

import logging
import time


class RateLimitedLog:
    """At most one line per `interval` seconds per key; the next line counts what was suppressed."""

    def __init__(self, logger: logging.Logger, interval: float = 10.0, clock=time.monotonic, max_keys: int = 1024) -> None:
        self.logger = logger
        self.interval = interval
        self.clock = clock
        self.max_keys = max_keys
        self._last: dict[str, float] = {}
        self._suppressed: dict[str, int] = {}

    def warning(self, key: str, message: str, *args) -> bool:
        """Log unless a line of this key went out less than `interval` ago; True if logged."""
        now = self.clock()
        last = self._last.get(key)
        if last is not None and now - last < self.interval:
            self._suppressed[key] = self._suppressed.get(key, 0) + 1
            return False
        if last is None and len(self._last) >= self.max_keys:
            self._last.clear()
            self._suppressed.clear()
        self._last[key] = now
        held = self._suppressed.pop(key, 0)
        if held:
            message += " (%d more like it in the last %.0f s not logged)"
            args = (*args, held, now - last)
        self.logger.warning(message, *args)
        return True
