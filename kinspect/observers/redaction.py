"""Structural redaction of decoded messages before they are logged.

Redaction follows the spec (the api, the direction and the field's path and type),
never the content: nothing here looks at a value to guess whether it is a secret.

The policy
----------
1. Credentials, by explicit rule (`SECRET_FIELDS`, from grepping specs/4.3.1 and
   specs/3.9.2 for password, salt, hmac, auth, token, secret): always redacted, whatever
   the allow-list says.

   - SaslAuthenticate request and response ``AuthBytes`` (SASL/PLAIN carries the
     password in clear, SCRAM the proofs, OAUTHBEARER the bearer token);
   - AlterUserScramCredentials request ``Upsertions.Salt`` and ``Upsertions.SaltedPassword``
     (DescribeUserScramCredentials carries only mechanisms and iteration counts);
   - delegation tokens: CreateDelegationToken response ``Hmac`` and ``TokenId``,
     DescribeDelegationToken response ``Tokens.Hmac`` and ``Tokens.TokenId``, and the
     ``Hmac`` that RenewDelegationToken and ExpireDelegationToken requests present (the
     token id is the SASL/SCRAM user name of a token and the HMAC its password);
   - AlterConfigs and IncrementalAlterConfigs request ``Resources.Configs.Value``: dynamic
     broker configs include passwords (ssl.keystore.password, sasl.jaas.config...), sent in
     clear; Kafka's own request log hides them too. Config names stay visible.

   SaslHandshake carries only mechanism names. After a SaslHandshake v0 the raw SASL
   tokens are not Kafka frames: sessions report them as ``sasl_tokens`` Problems, which
   carry sizes and never bytes.

2. Every other ``bytes`` field (and each element of ``[]bytes``) is redacted by default:
   group protocol metadata and assignments (which carry user data), Envelope's wrapped
   requests and principals, PushTelemetry's metrics, and any bytes field of a user's
   custom spec. A field may be allowed explicitly (`allow_bytes`), then it is rendered
   in base64 like the decode command does.

3. ``records`` fields are replaced by the batch summary (offsets, counts, codecs,
   producer ids, timestamps): keys, values and headers are never read, let alone logged.

4. Unknown tagged fields (tags no spec names) and trailing bytes are reported by tag and
   size only; fields a spec does not name are redacted if they hold bytes.

A redacted bytes value becomes ``"[redacted N bytes]"``, a redacted string ``"[redacted]"``;
null stays null (absence is not a secret).
"""

from __future__ import annotations

import base64
import math
from collections.abc import Iterable
from uuid import UUID

from kinspect.protocol.codec.codegen import UNKNOWN_TAGS
from kinspect.protocol.codec.rendering import render_records
from kinspect.protocol.specs.model import StructSpec

# (api name, direction) -> field paths (struct field names joined by ".", array indices left out).
SECRET_FIELDS: dict[tuple[str, str], frozenset[str]] = {
    ("SaslAuthenticate", "request"): frozenset({"AuthBytes"}),
    ("SaslAuthenticate", "response"): frozenset({"AuthBytes"}),
    ("AlterUserScramCredentials", "request"): frozenset({"Upsertions.Salt", "Upsertions.SaltedPassword"}),
    ("CreateDelegationToken", "response"): frozenset({"Hmac", "TokenId"}),
    ("DescribeDelegationToken", "response"): frozenset({"Tokens.Hmac", "Tokens.TokenId"}),
    ("RenewDelegationToken", "request"): frozenset({"Hmac"}),
    ("ExpireDelegationToken", "request"): frozenset({"Hmac"}),
    ("AlterConfigs", "request"): frozenset({"Resources.Configs.Value"}),
    ("IncrementalAlterConfigs", "request"): frozenset({"Resources.Configs.Value"}),
}

_BYTES_TYPES = (bytes, bytearray, memoryview)


def redacted_bytes(size: int) -> str:
    return f"[redacted {size} bytes]"


REDACTED_STRING = "[redacted]"


class Redactor:
    """Renders decoded messages as JSON-friendly values, with the policy above applied.

    allow_bytes: (api name, direction, field path) of bytes fields to show in base64;
    never overrides a SECRET_FIELDS rule.
    """

    def __init__(self, allow_bytes: Iterable[tuple[str, str, str]] = ()) -> None:
        allowed: dict[tuple[str, str], set[str]] = {}
        for api, direction, path in allow_bytes:
            allowed.setdefault((api, direction), set()).add(path)
        self.allow_bytes = {k: frozenset(v) for k, v in allowed.items()}

    def render(self, value: dict, spec: StructSpec, api: str, direction: str) -> tuple[dict, list]:
        """(the redacted body, its unknown tagged fields as {"path", "tag", "size"})."""
        key = (api, direction)
        secrets = SECRET_FIELDS.get(key, frozenset())
        allowed = self.allow_bytes.get(key, frozenset()) - secrets
        unknown: list = []
        body = _struct(value, spec, secrets, allowed, unknown, "", "")
        return body, unknown


def _scalar(value, field_type: str, secret: bool, allowed: bool):
    if value is None:
        return None
    if isinstance(value, _BYTES_TYPES):
        if secret or not allowed:
            return redacted_bytes(len(value))
        return base64.b64encode(bytes(value)).decode("ascii")
    if secret:
        return REDACTED_STRING
    if isinstance(value, UUID):
        return str(value)
    if isinstance(value, float) and not math.isfinite(value):
        return repr(value)
    return value


def _struct(value: dict, spec: StructSpec, secrets, allowed, unknown: list, path: str, where: str) -> dict:
    out = {}
    fields = {f.name: f for f in spec.fields}
    for name, item in value.items():
        if name == UNKNOWN_TAGS:
            unknown.extend({"path": where, "tag": tag, "size": len(data)} for tag, data in item)
            continue
        f = fields.get(name)
        field_path = f"{path}.{name}" if path else name  # the rule key: no indices
        field_where = f"{where}.{name}" if where else name  # for unknown tags: with indices
        if f is None:
            # Not in the spec: never show bytes.
            out[name] = _scalar(item, "", False, False) if not isinstance(item, (list, dict)) else "[redacted]"
            continue
        secret = field_path in secrets
        if item is None:
            out[name] = None
        elif f.type == "records":
            out[name] = render_records(item)
        elif f.struct is not None and f.is_array:
            out[name] = [
                _struct(x, f.struct, secrets, allowed, unknown, field_path, f"{field_where}[{i}]")
                for i, x in enumerate(item)
            ]
        elif f.struct is not None:
            out[name] = _struct(item, f.struct, secrets, allowed, unknown, field_path, field_where)
        elif f.is_array:
            out[name] = [_scalar(x, f.element_type, secret, field_path in allowed) for x in item]
        else:
            out[name] = _scalar(item, f.type, secret, field_path in allowed)
    return out
