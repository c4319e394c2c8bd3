"""Single-fact peeks read what the codec decodes: a Produce's Acks, whatever its TransactionalId."""

from __future__ import annotations

import pytest

from kinspect.protocol.codec import Codec
from kinspect.protocol.wire.peek import produce_acks


# (version, TransactionalId): versions before 3 have no TransactionalId
CASES = [(0, None), (2, None)] + [(version, transactional_id) for version in (3, 8, 9, 10)
                                  for transactional_id in (None, "", "t", "x" * 126, "x" * 127, "y" * 300)]


@pytest.mark.parametrize(("version", "transactional_id"), CASES)
@pytest.mark.parametrize("acks", [0, 1, -1])
def test_produce_acks_is_the_decoded_acks(codec: Codec, version, transactional_id, acks):
    body = {"Acks": acks, "TimeoutMs": 1000, "TopicData": []}
    if version >= 3:
        body["TransactionalId"] = transactional_id
    frame = codec.encode_request({"RequestApiKey": 0, "RequestApiVersion": version, "CorrelationId": 1,
                                  "ClientId": "c"}, body)
    header = codec.decode_request_header(frame)
    flexible = codec.is_flexible(0, "request", version)
    assert produce_acks(frame, header.size, version, flexible) == codec.decode_request(frame).body["Acks"] == acks
    # Cut anywhere: the Acks, or None when the bytes end before it; never another value, never an exception.
    outcomes = {produce_acks(frame[:cut], header.size, version, flexible) for cut in range(header.size, len(frame))}
    assert outcomes <= {None, acks} and None in outcomes
