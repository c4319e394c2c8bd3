"""The capture facts' encoding for the writer process: C and Python write the same bytes, both decoders give the
rows back (shared objects shared), the C encoder lets other threads run, and what it cannot encode is pickled."""

from __future__ import annotations

import os
import random
import sys
import threading
import time

import pytest

from kinspect.capture import facts_wire, writer_process
from kinspect.capture.facts import FIELDS, share_alike_sides
from kinspect.capture.facts_wire import MAGIC, MAX_DEPTH, Unencodable, decode_python, encode_python
from kinspect.protocol.codec import Codec
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV
from tests.capture.test_capture import recorded_facts

REQ, RESP = FIELDS.index("request_side"), FIELDS.index("response_side")


@pytest.fixture(scope="module")
def native():
    """capture._facts_wire: the tests fail (never skip) where it is not built, but under KINSPECT_PURE_PYTHON=1."""
    if os.environ.get(PURE_PYTHON_ENV) == "1":
        assert facts_wire.native() is None and not facts_wire.write_batch(1, [])
        pytest.skip(f"{PURE_PYTHON_ENV}=1 chooses the Python")
    module = facts_wire.native()
    assert module is not None, "kinspect.capture._facts_wire is not built; reinstall with a C compiler"
    return module


@pytest.fixture(scope="module")
def batch(codec_module) -> list:
    rows = [f for f, _ in recorded_facts(codec_module)]
    return share_alike_sides((rows * 3)[:512])


@pytest.fixture(scope="module")
def codec_module() -> Codec:
    return Codec()


ODD_VALUES = (
    None, True, False, 0, 1, -1, (1 << 63) - 1, -(1 << 63), 1 << 30, -(1 << 30), (1 << 60) + 12345,
    -(1 << 62) - 7, 0.0, -0.0, 1.5, float("inf"), float("-inf"), 1e-310,
    "", "a", "plain ascii", "café", "ÿ", "Ωmega", "\ud800 lone surrogate", "emoji \U0001f600", "\x00nul",
    b"", b"\x00\xff bytes", (), ((),), (1, (2, (3, ("deep",)))),
)


def test_the_recorded_batch_encodes_alike_in_c_and_python_and_decodes_back(native, batch):
    payload = encode_python(batch)
    assert payload.startswith(MAGIC)
    assert native.encode(batch) == payload
    for decode in (native.decode, decode_python):
        rows = decode(payload)
        assert rows == batch
        # a side shared by rows before is shared after: the row builder works each out once
        pairs = [(a[REQ], b[REQ]) for a, b in zip(batch, batch[1:])] + [(a[RESP], b[RESP])
                                                                        for a, b in zip(batch, batch[1:])]
        got = [(a[REQ], b[REQ]) for a, b in zip(rows, rows[1:])] + [(a[RESP], b[RESP]) for a, b in zip(rows, rows[1:])]
        shared = [x is y for x, y in pairs]
        assert [x is y for x, y in got] == shared and sum(shared) > 100


def test_the_python_reference_round_trips_every_kind_of_value():
    rows = [ODD_VALUES, (ODD_VALUES, ODD_VALUES[-1])]
    got = decode_python(encode_python(rows))
    assert repr(got) == repr(rows) and got[1][0] is got[0] and got[1][1] is got[0][-1]


def test_every_kind_of_value_encodes_alike_and_round_trips(native):
    rng = random.Random(7)
    shared_str, shared_tuple = "shared" * 3, (1, "x", None)
    rows = []
    for _ in range(200):
        row = tuple(rng.choice(ODD_VALUES) for _ in range(rng.randrange(0, 12)))
        rows.append(row + (shared_str, shared_tuple, (shared_tuple, shared_str)))
    rows += [ODD_VALUES, 5, "a row need not be a tuple"]
    payload = encode_python(rows)
    assert native.encode(rows) == payload
    for decode in (native.decode, decode_python):
        got = decode(payload)
        assert repr(got) == repr(rows)  # repr: -0.0 and nan compare as they print
        assert got[0][-1][0] is got[0][-2] and got[0][-3] is got[1][-3]
    nan = [float("nan")]
    assert repr(native.decode(native.encode(nan))) == "[nan]"


def test_ints_of_every_width_encode_alike(native):
    """An int's digits are read without the GIL (one, two or three 30-bit digits make 64 bits): every width, both
    signs, and the limits."""
    rng = random.Random(11)
    ints = [0, 1, -1, (1 << 30) - 1, 1 << 30, -(1 << 30), (1 << 60) - 1, 1 << 60, -(1 << 60), (1 << 63) - 1, -(1 << 63)]
    ints += [rng.randrange(-(1 << bits), 1 << bits) for bits in range(1, 64) for _ in range(20)]
    rows = [tuple(ints[i:i + 10]) for i in range(0, len(ints), 10)]
    payload = encode_python(rows)
    assert native.encode(rows) == payload and native.decode(payload) == rows


@pytest.mark.parametrize("value", [1 << 63, -(1 << 63) - 1, 1 << 200, [1], {"a": 1}, {1}, bytearray(b"x"),
                                   type("Text", (str,), {})("a str subclass"), type("Pair", (tuple,), {})((1,)),
                                   1j, object()],
                         ids=lambda v: type(v).__name__ if not isinstance(v, int) else str(v)[:12])
def test_what_the_encoding_has_no_tag_for_is_declined_and_nothing_is_written(native, value):
    rows = [(1, "a"), (2, ("nested", value))]
    with pytest.raises(Unencodable):
        encode_python(rows)
    assert native.encode(rows) is None
    read_fd, write_fd = os.pipe()
    try:
        assert native.write(write_fd, rows) is False
        os.set_blocking(read_fd, False)
        with pytest.raises(BlockingIOError):
            os.read(read_fd, 1)  # nothing written
    finally:
        os.close(read_fd)
        os.close(write_fd)


def test_tuples_deeper_than_the_limit_are_declined(native):
    deep = "bottom"
    for _ in range(MAX_DEPTH):
        deep = (deep,)
    assert native.encode([deep]) == encode_python([deep])  # MAX_DEPTH tuples, the row's own counted
    with pytest.raises(Unencodable):
        encode_python([(deep,)])
    assert native.encode([(deep,)]) is None


def test_a_bad_payload_is_a_one_line_error_wherever_it_is_cut_or_changed(native, batch):
    payload = encode_python(batch[:40])
    cuts = sorted({0, 3, 4, 7, 8, 9, len(payload) - 1} | set(random.Random(1).sample(range(len(payload)), 200)))
    for decode in (native.decode, decode_python):
        for cut in cuts:
            with pytest.raises(ValueError) as caught:
                decode(payload[:cut])
            assert "\n" not in str(caught.value) and str(caught.value).startswith("capture facts:")
        for bad, says in ((b"XXXX" + payload[4:], "not a facts payload"), (payload + b"N", "after the last row"),
                          (MAGIC + b"\x01\x00\x00\x00?", "unknown tag"),
                          (MAGIC + b"\x01\x00\x00\x00r\x00\x00\x00\x00", "not yet decoded"),
                          (MAGIC + b"\x01\x00\x00\x00t\x01\x00\x00\x00r\x00\x00\x00\x00", "not yet decoded"),
                          (MAGIC + b"\x01\x00\x00\x00a\x01\x00\x00\x00\xff", "ascii")):
            with pytest.raises(ValueError, match=says):
                decode(bad)
    rng = random.Random(3)
    for _ in range(300):  # changed bytes: an error or some rows, never a crash
        changed = bytearray(payload)
        for _ in range(rng.randrange(1, 4)):
            changed[rng.randrange(8, len(changed))] = rng.randrange(256)
        for decode in (native.decode, decode_python):
            try:
                rows = decode(bytes(changed))
            except ValueError:
                continue
            assert type(rows) is list


def test_a_batch_written_by_the_c_encoder_is_read_as_one_message(native, batch):
    """Larger than the pipe holds (64 KiB), so the write waits for the reader, with the GIL released."""
    read_fd, write_fd = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.extend(writer_process.read_message(read_fd) for _ in range(2)))
    reader.start()
    try:
        assert native.write(write_fd, batch) is True
        assert native.write(write_fd, []) is True
        reader.join(30)
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert len(got[0]) > 64 * 1024 and got[0] == encode_python(batch)
    assert [writer_process.read_batch(m) for m in got] == [batch, []]


def test_a_write_that_fails_raises_and_a_closed_reader_is_an_os_error(native, batch):
    read_fd, write_fd = os.pipe()
    os.close(read_fd)
    try:
        with pytest.raises(BrokenPipeError):
            native.write(write_fd, batch)
    finally:
        os.close(write_fd)
    with pytest.raises(OSError):
        native.write(write_fd, batch)  # closed
    with pytest.raises(TypeError):
        native.write(write_fd, tuple(batch))


def test_other_threads_run_while_the_c_encoder_works(native, batch):
    """The point of the encoder: pickle.dumps holds the GIL for its whole call, this gives it up. This thread notes
    the time over and over while another encodes a large batch in one call: with the GIL held it could note nothing
    from the call's start to its end, one gap as long as the call."""
    big = batch * 2000  # a million rows (most of them references): tens of ms to encode
    done = threading.Event()
    spans, encoded = [], []

    def encode():
        started = time.perf_counter()
        encoded.append(native.encode(big))
        spans.append((started, time.perf_counter()))
        done.set()

    notes = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(0.0001)  # the worker gets the GIL at once to start, and back at once to return
    try:
        worker = threading.Thread(target=encode)
        worker.start()
        while not done.is_set():
            notes.append(time.perf_counter())
        worker.join()
    finally:
        sys.setswitchinterval(switch)
    (started, ended), = spans
    assert encoded[0] is not None and ended - started > 0.01
    inside = [t for t in notes if started < t < ended]
    # the part of the call this thread ran through: gaps under 1 ms between its notes (the machine's other
    # processes may take its core now and then). Measured: 54% on a quiet machine, 19% in a full suite run on
    # two busy cores (which failed the 20% this asked before); with the GIL held (pickle.dumps) 0.6%.
    ran = sum(b - a for a, b in zip(inside, inside[1:]) if b - a < 0.001)
    assert ran > 0.05 * (ended - started), \
        f"this thread ran {ran * 1e3:.1f} ms of the {(ended - started) * 1e3:.1f} ms the batch took to encode"


def test_send_batch_encodes_a_batch_and_pickles_one_the_encoder_declines(native, batch):
    at = FIELDS.index("correlation_id")
    declined = batch[:5] + [batch[5][:at] + (1 << 70,) + batch[5][at + 1:]]
    read_fd, write_fd = os.pipe()
    got = []
    reader = threading.Thread(target=lambda: got.extend(writer_process.read_message(read_fd) for _ in range(2)))
    reader.start()
    try:
        writer_process.send_batch(write_fd, batch)
        writer_process.send_batch(write_fd, declined)
        reader.join(30)
    finally:
        os.close(write_fd)
        os.close(read_fd)
    assert got[0].startswith(MAGIC) and got[1].startswith(b"\x80")  # encoded; pickled
    assert [writer_process.read_batch(m) for m in got] == [batch, declined]
