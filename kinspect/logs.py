"""kinspect's logs: structlog, as JSON lines by default or a readable console form.

`configure_logging` sets structlog up on top of the standard library: structlog loggers
(`structlog.get_logger("kinspect.x")`) become stdlib loggers, and one handler on the
``kinspect`` logger renders every record, from structlog or from plain ``logging`` calls
(ProblemLog, the proxy), through structlog's ProcessorFormatter, so every line has the
same shape: ``timestamp`` (ISO 8601, UTC), ``level``, ``logger``, ``event`` and the
event's own keys. Lines about one connection carry `connection_fields`.

Calling it again replaces the previous setup (the handler it installed is removed);
`reset_logging` undoes it.
"""

from __future__ import annotations

import logging
import sys
from typing import IO

import structlog

from kinspect.session.events import ConnectionInfo

FORMATS = ("json", "console")
ROOT_LOGGER = "kinspect"

_HANDLER_MARK = "_kinspect_structlog_handler"


def connection_fields(conn: ConnectionInfo) -> dict:
    """The keys every line about one connection carries."""
    return {
        "connection_id": conn.id,
        "client_address": conn.client_address,
        "client_id": conn.client_id,
        "broker": conn.broker,
        "node_id": conn.node_id,
    }


def _level_number(level: str | int) -> int:
    if isinstance(level, int):
        return level
    number = logging.getLevelNamesMapping().get(str(level).upper())
    if number is None:
        raise ValueError(f"unknown log level {level!r}")
    return number


def _shared_processors() -> list:
    """What both structlog events and foreign (stdlib) records go through before rendering."""
    return [
        structlog.contextvars.merge_contextvars,
        structlog.stdlib.add_logger_name,
        structlog.stdlib.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]


_LEADING_KEYS = ("timestamp", "level", "logger", "event")


def _leading_keys_first(logger, method_name, event_dict: dict) -> dict:
    """JSON lines start with timestamp, level, logger and event, then the event's own keys."""
    ordered = {k: event_dict.pop(k) for k in _LEADING_KEYS if k in event_dict}
    ordered.update(event_dict)
    return ordered


def _renderer(format: str, stream) -> list:
    if format == "json":
        return [
            structlog.processors.format_exc_info,
            _leading_keys_first,
            structlog.processors.JSONRenderer(sort_keys=False),
        ]
    colors = bool(getattr(stream, "isatty", lambda: False)())
    return [structlog.dev.ConsoleRenderer(colors=colors)]


def configure_logging(format: str = "json", level: str | int = "INFO", stream: IO[str] | None = None) -> logging.Handler:
    """Route kinspect's logs (structlog and stdlib ``kinspect.*`` loggers) to one stream.

    format: "json" (one JSON object a line) or "console" (readable lines).
    Returns the installed handler.
    """
    if format not in FORMATS:
        raise ValueError(f"log format {format!r} is not one of {FORMATS}")
    number = _level_number(level)
    stream = stream if stream is not None else sys.stderr
    shared = _shared_processors()

    structlog.configure(
        processors=[
            structlog.stdlib.filter_by_level,
            *shared,
            structlog.processors.StackInfoRenderer(),
            structlog.processors.UnicodeDecoder(),
            structlog.stdlib.ProcessorFormatter.wrap_for_formatter,
        ],
        logger_factory=structlog.stdlib.LoggerFactory(),
        wrapper_class=structlog.stdlib.BoundLogger,
        cache_logger_on_first_use=False,  # so that configure_logging may be called again (tests)
    )
    formatter = structlog.stdlib.ProcessorFormatter(
        foreign_pre_chain=[*shared, structlog.stdlib.ExtraAdder()],
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, *_renderer(format, stream)],
    )
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    setattr(handler, _HANDLER_MARK, True)

    root = logging.getLogger(ROOT_LOGGER)
    _remove_handlers(root)
    root.addHandler(handler)
    root.setLevel(number)
    root.propagate = False  # one line per record, not a second one from the root logger's handlers
    return handler


def _remove_handlers(logger: logging.Logger) -> None:
    for h in list(logger.handlers):
        if getattr(h, _HANDLER_MARK, False):
            logger.removeHandler(h)


def reset_logging() -> None:
    """Undo `configure_logging`: structlog's defaults, and ``kinspect`` logs propagating as before."""
    root = logging.getLogger(ROOT_LOGGER)
    _remove_handlers(root)
    root.setLevel(logging.NOTSET)
    root.propagate = True
    structlog.reset_defaults()
