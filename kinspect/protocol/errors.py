"""The exceptions of the protocol layer: bad bytes, bad values and bad spec files."""

from __future__ import annotations


class DecodeError(ValueError):
    """Bytes that do not decode as the message they claim to be.

    Names the api, version and direction, the field path inside the message and the
    byte offset (from the start of the buffer handed to the decoder) where it went wrong.
    """

    def __init__(
        self,
        reason: str,
        *,
        api: str | None = None,
        api_key: int | None = None,
        version: int | None = None,
        direction: str | None = None,
        path: str | None = None,
        offset: int | None = None,
    ) -> None:
        self.reason = reason
        self.api = api
        self.api_key = api_key
        self.version = version
        self.direction = direction
        self.path = path
        self.offset = offset
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.api is not None or self.api_key is not None:
            what = self.api or f"api key {self.api_key}"
            if self.direction:
                what += f" {self.direction}"
            if self.version is not None:
                what += f" v{self.version}"
            where.append(what)
        if self.path:
            where.append(f"field {self.path}")
        if self.offset is not None:
            where.append(f"byte {self.offset}")
        return f"{self.reason} ({', '.join(where)})" if where else self.reason

    def to_dict(self) -> dict:
        """A JSON-friendly form for logs and the decode command."""
        return {
            "reason": self.reason,
            "api": self.api,
            "api_key": self.api_key,
            "version": self.version,
            "direction": self.direction,
            "path": self.path,
            "offset": self.offset,
        }


class UnknownApiError(DecodeError):
    """An api key, or a version of a known api, that no loaded spec defines."""


class EncodeError(ValueError):
    """A value that cannot be written as the field it is meant for."""


class SpecError(ValueError):
    """A message-definition file that is not valid; says which file and which field."""
