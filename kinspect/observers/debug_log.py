"""An observer that logs decoded requests (and, when asked, responses) as structlog events.

One line per request, event ``kafka.request``: api, version, correlation id, client id,
the connection's fields (kinspect.logs.connection_fields), the frame size, the header's
unknown tagged fields (tag and size), and ``body``: the decoded body rendered as JSON
with the redaction policy of kinspect.observers.redaction applied (credentials and
every bytes field redacted, records as batch summaries), cut at ``max_body_chars``
characters (then ``truncated`` is true and ``body_chars`` is the full length).

With ``responses=True``, one ``kafka.response`` line per response to a logged request,
with the latency. A message that does not decode gives a ``kafka.decode_failed``
warning with the DecodeError's fields.

Selection: ``include`` (api names or keys; None for all) and ``exclude``; then a sampling
rate (0..1) drawn per request from ``rng`` (a random.Random; seed it for tests). A
response is logged exactly when its request was.
"""

from __future__ import annotations

import json
import random
from collections import OrderedDict
from collections.abc import Iterable

import structlog

from kinspect.logs import connection_fields
from kinspect.observers.redaction import Redactor
from kinspect.session import DecodeError, Exchange, Request

LOGGER_NAME = "kinspect.debug"
_MAX_PENDING = 10_000  # sampling decisions kept for requests awaiting their response


def _selector(items: Iterable[str | int] | None) -> tuple[frozenset[str], frozenset[int]] | None:
    if items is None:
        return None
    if isinstance(items, (str, int)):
        items = [items]
    names, keys = set(), set()
    for item in items:
        if isinstance(item, int) and not isinstance(item, bool):
            keys.add(item)
        elif isinstance(item, str) and item.strip().lstrip("-").isdigit():
            keys.add(int(item))
        elif isinstance(item, str):
            names.add(item.strip().lower())
        else:
            raise ValueError(f"not an api name or key: {item!r}")
    return frozenset(names), frozenset(keys)


def _matches(selector, api_name: str | None, api_key: int) -> bool:
    names, keys = selector
    return api_key in keys or (api_name is not None and api_name.lower() in names)


class DebugLog:
    event_types = (Request, Exchange)
    needs_bodies = True

    def __init__(
        self,
        include: Iterable[str | int] | None = None,
        exclude: Iterable[str | int] = (),
        sample_rate: float = 1.0,
        responses: bool = False,
        max_body_chars: int = 4096,
        logger=None,
        rng: random.Random | None = None,
        allow_bytes: Iterable[tuple[str, str, str]] = (),
        level: str = "info",
    ) -> None:
        if not 0.0 <= sample_rate <= 1.0:
            raise ValueError(f"sample_rate {sample_rate} is not between 0 and 1")
        if max_body_chars < 0:
            raise ValueError("max_body_chars must not be negative")
        self.include = _selector(include)
        self.exclude = _selector(exclude) or (frozenset(), frozenset())
        self.sample_rate = sample_rate
        self.responses = responses
        self.max_body_chars = max_body_chars
        self.logger = logger if logger is not None else structlog.get_logger(LOGGER_NAME)
        self.rng = rng or random.Random()
        self.redactor = Redactor(allow_bytes)
        self.level = level.lower()
        self._pending: OrderedDict[tuple[int, int], None] = OrderedDict()
        self.logged = {"request": 0, "response": 0, "decode_failed": 0, "sampled_out": 0}

    # ------------------------------------------------------------------ selection

    def selected(self, api_name: str | None, api_key: int) -> bool:
        if self.include is not None and not _matches(self.include, api_name, api_key):
            return False
        return not _matches(self.exclude, api_name, api_key)

    def _sampled(self) -> bool:
        if self.sample_rate >= 1.0:
            return True
        if self.sample_rate <= 0.0:
            return False
        return self.rng.random() < self.sample_rate

    # ------------------------------------------------------------------ events

    def on_event(self, event) -> None:
        kind = type(event)
        if kind is Request:
            self._on_request(event)
        elif kind is Exchange and self.responses and event.response is not None:
            key = (event.request.connection.id, event.request.correlation_id)
            if key in self._pending:  # only requests that were logged are in _pending
                del self._pending[key]
                self._on_response(event)

    def _on_request(self, request: Request) -> None:
        if not self.selected(request.api_name, request.api_key):
            return
        if not self._sampled():
            self.logged["sampled_out"] += 1
            return
        if self.responses and request.expects_response:
            key = (request.connection.id, request.correlation_id)
            self._pending[key] = None
            self._pending.move_to_end(key)
            while len(self._pending) > _MAX_PENDING:
                self._pending.popitem(last=False)
        log = self.logger.bind(**connection_fields(request.connection))
        common = {
            "api": request.api_name, "api_key": request.api_key, "version": request.api_version,
            "correlation_id": request.correlation_id, "size": request.size,
        }
        try:
            decoded = request.decode()
            spec = request.codec.body(request.api_key, "request", request.api_version).spec
            header_spec = request.codec.header("RequestHeader", decoded.header.version).spec
        except DecodeError as exc:
            self._decode_failed(log, "request", common, exc)
            return
        _, header_unknown = self.redactor.render(decoded.header.fields, header_spec.struct, "RequestHeader", "header")
        body, unknown = self.redactor.render(decoded.body, spec.struct, decoded.api_name, "request")
        fields = {
            **common,
            "api": decoded.api_name,
            "header_version": decoded.header.version,
            "header_tagged_fields": header_unknown,
            **self._body(body, unknown, decoded.trailing),
        }
        self.logged["request"] += 1
        getattr(log, self.level)("kafka.request", **fields)

    def _on_response(self, exchange: Exchange) -> None:
        response = exchange.response
        log = self.logger.bind(**connection_fields(response.connection))
        common = {
            "api": response.api_name, "api_key": response.api_key, "version": response.api_version,
            "correlation_id": response.correlation_id, "size": response.size,
        }
        if exchange.latency is not None:
            common["latency_ms"] = round(exchange.latency * 1000.0, 3)
        try:
            decoded = response.decode()
            spec = response.codec.body(response.api_key, "response", response.api_version).spec
            header_spec = response.codec.header("ResponseHeader", decoded.header_version).spec
        except DecodeError as exc:
            self._decode_failed(log, "response", common, exc)
            return
        _, header_unknown = self.redactor.render(decoded.header, header_spec.struct, "ResponseHeader", "header")
        body, unknown = self.redactor.render(decoded.body, spec.struct, decoded.api_name, "response")
        fields = {
            **common,
            "api": decoded.api_name,
            "header_version": decoded.header_version,
            "header_tagged_fields": header_unknown,
            **self._body(body, unknown, decoded.trailing),
        }
        self.logged["response"] += 1
        getattr(log, self.level)("kafka.response", **fields)

    def _body(self, body: dict, unknown: list, trailing: bytes) -> dict:
        text = json.dumps(body, separators=(",", ":"), ensure_ascii=False, default=str)
        out = {"body": text, "truncated": False}
        if len(text) > self.max_body_chars:
            out["body"] = text[: self.max_body_chars]
            out["truncated"] = True
            out["body_chars"] = len(text)
        if unknown:
            out["unknown_tagged_fields"] = unknown
        if trailing:
            out["trailing_bytes"] = len(trailing)
        return out

    def _decode_failed(self, log, direction: str, common: dict, exc: DecodeError) -> None:
        self.logged["decode_failed"] += 1
        error = exc.to_dict()
        log.warning(
            "kafka.decode_failed", direction=direction, **common,
            reason=error["reason"], path=error["path"], offset=error["offset"], error_api=error["api"],
            error_version=error["version"], error_direction=error["direction"],
        )
