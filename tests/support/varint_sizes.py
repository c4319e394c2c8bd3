"""Bytes an integer would take as an unsigned or a zig-zag varint (the encoding analysis' arithmetic)."""

from __future__ import annotations

# _LENGTH[n]: bytes of a varint whose value has bit length n (7 bits a byte; 0 still takes one byte).
_LENGTH = tuple(max(1, (n + 6) // 7) for n in range(65))
_WIDTH_BYTES = {16: 3, 32: 5, 64: 10}  # a negative value's two's complement fills every bit of its type


def uvarint_size(value: int, bits: int) -> int:
    """Bytes of `value` as an unsigned varint, negatives read as the `bits`-wide two's complement."""
    if value < 0:
        if value < -(1 << (bits - 1)):
            raise ValueError(f"{value} does not fit in int{bits}")
        return _WIDTH_BYTES[bits]
    if value >> bits:
        raise ValueError(f"{value} does not fit in {bits} bits")
    return _LENGTH[value.bit_length()]


def zigzag_size(value: int) -> int:
    """Bytes of `value` as a zig-zag signed varint (0, -1, 1, -2... map to 0, 1, 2, 3...)."""
    return _LENGTH[((value << 1) if value >= 0 else ((-value << 1) - 1)).bit_length()]
