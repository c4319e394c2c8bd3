"""Wire primitives shared by the generated codecs: varints, zig-zag, and fixed-width packers.

The generated decoders inline the common one-byte cases and call these helpers only for
the rest, so these are written for clarity first and bounded always: a varint longer than
its type allows is rejected, never looped over.
"""

from __future__ import annotations

import struct


class Malformed(Exception):
    """Raised inside decoders with a human reason; turned into a DecodeError with a path."""


# Fixed-width primitives by spec type: struct format character and size.
FIXED_FORMATS = {
    "bool": ("?", 1),
    "int8": ("b", 1),
    "int16": ("h", 2),
    "uint16": ("H", 2),
    "int32": ("i", 4),
    "uint32": ("I", 4),
    "int64": ("q", 8),
    "float64": ("d", 8),
    "uuid": ("16s", 16),
}

# Longest varint per value width, in bytes (7 bits a byte).
VARINT_MAX_BYTES = {16: 3, 32: 5, 64: 10}
_MASKS = {16: 0xFFFF, 32: 0xFFFFFFFF, 64: 0xFFFFFFFFFFFFFFFF}


def read_uvarint(buf: bytes, pos: int, bits: int = 32) -> tuple[int, int]:
    """Read an unsigned varint of at most `bits` bits; return (value, new position)."""
    limit = VARINT_MAX_BYTES[bits]
    value = 0
    shift = 0
    for i in range(limit):
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if value > _MASKS[bits]:
                raise Malformed(f"varint value {value} does not fit in {bits} bits")
            return value, pos + i + 1
        shift += 7
    raise Malformed(f"varint longer than {limit} bytes")


def write_uvarint(value: int, out: bytearray) -> None:
    """Append an unsigned varint (value must be non-negative)."""
    while value > 0x7F:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)


def uvarint_size(value: int) -> int:
    """Bytes an unsigned varint of this non-negative value takes."""
    size = 1
    while value > 0x7F:
        value >>= 7
        size += 1
    return size


def zigzag_encode(value: int, bits: int) -> int:
    """Map a signed value to the unsigned one a zig-zag varint carries."""
    return ((value << 1) ^ (value >> (bits - 1))) & _MASKS[bits]


def zigzag_decode(value: int) -> int:
    return (value >> 1) ^ -(value & 1)


def to_signed(value: int, bits: int) -> int:
    """Two's complement reading of an unsigned value of `bits` bits."""
    return value - (1 << bits) if value >> (bits - 1) else value


# Readers and writers for the KAFKA-9927 `encoding` property, by encoding name.
def _packed_reader(bits: int):
    def read(buf: bytes, pos: int) -> tuple[int, int]:
        raw, pos = read_uvarint(buf, pos, bits)
        return zigzag_decode(raw), pos

    return read


def _upacked_reader(bits: int):
    def read(buf: bytes, pos: int) -> tuple[int, int]:
        raw, pos = read_uvarint(buf, pos, bits)
        return to_signed(raw, bits), pos

    return read


def _fixed_reader(bits: int):
    s = struct.Struct({16: ">h", 32: ">i", 64: ">q"}[bits])
    size = s.size
    unpack = s.unpack_from

    def read(buf: bytes, pos: int) -> tuple[int, int]:
        return unpack(buf, pos)[0], pos + size

    return read


def _check_range(value: int, bits: int, name: str) -> None:
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    if not low <= value <= high:
        raise struct.error(f"{value} does not fit the {name} encoding")


def _packed_writer(bits: int):
    name = f"packed{bits}"

    def write(value: int, out: bytearray) -> None:
        _check_range(value, bits, name)
        write_uvarint(zigzag_encode(value, bits), out)

    return write


def _upacked_writer(bits: int):
    name = f"upacked{bits}"
    mask = _MASKS[bits]

    def write(value: int, out: bytearray) -> None:
        _check_range(value, bits, name)
        write_uvarint(value & mask, out)

    return write


def _fixed_writer(bits: int):
    s = struct.Struct({16: ">h", 32: ">i", 64: ">q"}[bits])
    pack = s.pack

    def write(value: int, out: bytearray) -> None:
        out += pack(value)

    return write


ENCODING_READERS = {}
ENCODING_WRITERS = {}
for _bits in (16, 32, 64):
    ENCODING_READERS[f"fixed{_bits}"] = _fixed_reader(_bits)
    ENCODING_READERS[f"packed{_bits}"] = _packed_reader(_bits)
    ENCODING_READERS[f"upacked{_bits}"] = _upacked_reader(_bits)
    ENCODING_WRITERS[f"fixed{_bits}"] = _fixed_writer(_bits)
    ENCODING_WRITERS[f"packed{_bits}"] = _packed_writer(_bits)
    ENCODING_WRITERS[f"upacked{_bits}"] = _upacked_writer(_bits)
