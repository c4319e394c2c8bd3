"""Builds the seed corpus of fuzz/fuzz_codec.py from the recorded traffic in tests/data/traffic.

Usage: python fuzz/make_corpus.py [OUT_DIR]   (default fuzz/corpus/, ignored by git)

Each seed is one input of fuzz_codec.py: a mode byte, then the mode's payload (see
fuzz_codec.py): request frames, response frames with the api key and version of their
request, the records fields of Produce requests and Fetch responses, and raw streams.
"""

from __future__ import annotations

import hashlib
import struct
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kinspect.protocol.codec import Codec, correlation_id_of_response
from kinspect.protocol.errors import DecodeError
from kinspect.protocol.framing.framer import split_frames

TRAFFIC = ROOT / "tests" / "data" / "traffic"
MODE_REQUEST, MODE_RESPONSE, MODE_RECORDS, MODE_STREAM = 0, 1, 2, 3
MAX_SEED_BYTES = 64 * 1024  # libFuzzer's -max_len is set well below; larger seeds only slow it down


def seeds(codec: Codec):
    """(mode, payload) for every recorded frame, records field and stream head."""
    for requests_path in sorted(TRAFFIC.glob("*/*.requests.bin")):
        requests = requests_path.read_bytes()
        responses_path = requests_path.with_name(requests_path.name.replace("requests", "responses"))
        responses = responses_path.read_bytes() if responses_path.exists() else b""
        yield MODE_STREAM, requests[:4096]
        yield MODE_STREAM, responses[:4096]
        pending = {}
        for _, frame in split_frames(requests)[0]:
            yield MODE_REQUEST, frame
            header = codec.decode_request_header(frame)
            pending[header.correlation_id] = (header.api_key, header.api_version)
            for summary_source in _records_of(codec.scan_request(frame, header)):
                yield MODE_RECORDS, frame[summary_source[0]:summary_source[0] + summary_source[1]]
        for _, frame in split_frames(responses)[0]:
            key_version = pending.pop(correlation_id_of_response(frame), None)
            if key_version is None:
                continue
            yield MODE_RESPONSE, struct.pack(">hh", *key_version) + frame
            try:
                result = codec.scan_response(frame, *key_version)
            except DecodeError:
                continue
            for start, length in _records_of(result):
                yield MODE_RECORDS, frame[start:start + length]


def _records_of(result):
    return [span for span in result.spans if span[1]]


def main(argv: list[str]) -> int:
    out = Path(argv[1]) if len(argv) > 1 else Path(__file__).resolve().parent / "corpus"
    out.mkdir(parents=True, exist_ok=True)
    written = 0
    seen = set()
    for mode, payload in seeds(Codec()):
        data = bytes([mode]) + payload[:MAX_SEED_BYTES]
        digest = hashlib.sha1(data).hexdigest()
        if digest in seen:
            continue
        seen.add(digest)
        (out / digest).write_bytes(data)
        written += 1
    print(f"{written} seeds in {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv))
