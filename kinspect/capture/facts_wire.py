"""How a batch of capture facts crosses the pipe to the writer process: bytes the C encoder writes off the GIL.

Why not pickle: pickle.dumps holds the GIL for its whole call, about 1 µs a row of the recorded
traffic. The event loop that wakes meanwhile waits for the writer thread: at 10,000 exchanges a
second, a thread sleeping 1 ms in the proxy woke 0.41 ms late at p99 instead of 0.22-0.23
(docs/performance.md, "fifteenth"). The facts are immutable tuples of None, bools, ints, floats, strs and bytes
that the writer thread's batch keeps alive, so the C encoder (kinspect.capture._facts_wire) reads
them with the GIL released; the event loop may change only their reference counts, which it never
reads. This module is its reference (encode_python, byte for byte) and the decoder's.

A payload: MAGIC, the number of rows (u32), then each row as a value. A value is a tag byte and:

    N None   T True   F False
    i int, 8 bytes signed              d float, 8 bytes IEEE 754
    a str of ASCII: u32 length, bytes  1/2/4 any other str: u32 length in characters, then its
                                       characters at 1, 2 or 4 bytes each (CPython's own kinds)
    b bytes: u32 length, bytes         t tuple: u32 length, then its values
    r the object numbered u32 again

Every tuple, str and bytes is numbered in the order its tag is written; its second appearance
(the same object: the sides share_alike_sides shared, a connection's strs) is an `r`. Integers
are little-endian. A value outside this (another type, an int beyond 64 bits, nesting deeper
than MAX_DEPTH) makes the batch unencodable: the writer thread pickles it instead.
"""

from __future__ import annotations

import struct

from kinspect.protocol.codec.wire_program import optional_extension

MAGIC = b"KFW1"  # never the start of a pickle (b"\x80")
MAX_DEPTH = 32  # the facts nest five deep

_U32, _I64, _F64 = struct.Struct("<I"), struct.Struct("<q"), struct.Struct("<d")
_KINDS = ((0xFF, b"1", "latin-1", 1), (0xFFFF, b"2", "utf-16-le", 2), (0x10FFFF, b"4", "utf-32-le", 4))


class Unencodable(ValueError):
    """A batch holds a value the encoding has no tag for."""


def encode_python(rows: list) -> bytes:
    """The payload of a batch of EXCHANGE tuples (the reference of _facts_wire.encode); Unencodable if it cannot."""
    out = [MAGIC, _U32.pack(len(rows))]
    memo: dict[int, int] = {}  # id() -> number; the batch keeps every object alive, so ids stay unique
    put = out.append

    def value(v, depth: int) -> None:
        t = type(v)
        if v is None:
            put(b"N")
        elif t is bool:
            put(b"T" if v else b"F")
        elif t is int:
            if not -(1 << 63) <= v < (1 << 63):
                raise Unencodable(f"an int beyond 64 bits: {v}")
            put(b"i" + _I64.pack(v))
        elif t is float:
            put(b"d" + _F64.pack(v))
        elif t is str or t is bytes or t is tuple:
            number = memo.get(id(v))
            if number is not None:
                put(b"r" + _U32.pack(number))
                return
            memo[id(v)] = len(memo)
            if t is bytes:
                put(b"b" + _U32.pack(len(v)) + v)
            elif t is str:
                put(_str(v))
            else:
                if depth >= MAX_DEPTH:
                    raise Unencodable(f"tuples nested deeper than {MAX_DEPTH}")
                put(b"t" + _U32.pack(len(v)))
                for item in v:
                    value(item, depth + 1)
        else:
            raise Unencodable(f"a value of type {t.__name__}")

    for row in rows:
        value(row, 0)
    return b"".join(out)


def _str(s: str) -> bytes:
    if s.isascii():
        return b"a" + _U32.pack(len(s)) + s.encode("ascii")
    widest = max(map(ord, s))
    for limit, tag, codec, _ in _KINDS:
        if widest <= limit:  # CPython stores a str in the narrowest kind that holds its widest character
            return tag + _U32.pack(len(s)) + s.encode(codec, "surrogatepass")
    raise AssertionError("no character is beyond U+10FFFF")


def decode_python(payload: bytes) -> list:
    """The rows of a payload (the reference of _facts_wire.decode); ValueError, one line, if it is not one."""
    view = memoryview(payload)
    if bytes(view[:4]) != MAGIC or len(view) < 8:
        raise ValueError("capture facts: not a facts payload")
    memo: list = []
    pos = 8

    def take(n: int) -> memoryview:
        nonlocal pos
        if pos + n > len(view):
            raise ValueError(f"capture facts: the payload ends inside a value at byte {pos}")
        pos += n
        return view[pos - n:pos]

    def u32() -> int:
        return _U32.unpack(take(4))[0]

    def value(depth: int):
        tag = bytes(take(1))
        if tag == b"N":
            return None
        if tag == b"T":
            return True
        if tag == b"F":
            return False
        if tag == b"i":
            return _I64.unpack(take(8))[0]
        if tag == b"d":
            return _F64.unpack(take(8))[0]
        if tag == b"r":
            number = u32()
            if number >= len(memo) or memo[number] is _UNFINISHED:
                raise ValueError(f"capture facts: a reference to object {number}, not yet decoded")
            return memo[number]
        number = len(memo)
        memo.append(_UNFINISHED)
        if tag == b"a":
            got = str(take(u32()), "ascii")
        elif tag in (b"1", b"2", b"4"):
            width = int(tag)
            got = str(take(u32() * width), _KINDS[(1, 2, 4).index(width)][2], "surrogatepass")
        elif tag == b"b":
            got = bytes(take(u32()))
        elif tag == b"t":
            if depth >= MAX_DEPTH:
                raise ValueError(f"capture facts: tuples nested deeper than {MAX_DEPTH}")
            got = tuple([value(depth + 1) for _ in range(u32())])
        else:
            raise ValueError(f"capture facts: an unknown tag {tag!r} at byte {pos - 1}")
        memo[number] = got
        return got

    rows = [value(0) for _ in range(_U32.unpack(view[4:8])[0])]
    if pos != len(view):
        raise ValueError(f"capture facts: {len(view) - pos} bytes after the last row")
    return rows


_UNFINISHED = object()
_NATIVE: list = []  # [kinspect.capture._facts_wire or None], looked for once


def native():
    """kinspect.capture._facts_wire, or None where it is not built (or KINSPECT_PURE_PYTHON=1)."""
    if not _NATIVE:
        _NATIVE.append(optional_extension("kinspect.capture._facts_wire"))
    return _NATIVE[0]


def write_batch(fd: int, rows: list) -> bool:
    """Write rows to fd as one message (a 4-byte big-endian length, then the payload), encoded in C with the GIL
    released; False, nothing written, where the C encoder is not built or cannot encode them (OSError if fd fails)."""
    module = native()
    return module is not None and type(rows) is list and module.write(fd, rows)


def decode(payload: bytes) -> list:
    """The rows of a payload: in C where built."""
    module = native()
    return module.decode(payload) if module is not None else decode_python(payload)
