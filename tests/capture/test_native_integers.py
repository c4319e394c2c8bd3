"""A capture batch's integer and time columns made in C (capture._columns.integers and micros) against numpy's
conversion, the reference.

capture.batch._integers gives the same Arrow array either way (values, nulls, type): for every width, at
its bounds, with nulls first, last, everywhere or nowhere, at every length around a byte of the validity
bitmap. Where a value is not an int, or does not fit, the C declines and numpy decides as before (an
out-of-range value raises, a bool converts). capture.batch._times likewise: microseconds rounded half to
even on the same float64 operations, times far from and near the epoch, halves of a microsecond, nulls;
a value that is not a finite float is left to numpy (a NaN becomes a null there).
"""

from __future__ import annotations

import os
import random

import numpy as np
import pyarrow as pa
import pytest

from kinspect.capture.batch import _integers, _times
from kinspect.protocol.codec.wire_program import PURE_PYTHON_ENV, optional_extension

# CI builds the extension: these tests fail (never skip) where it is missing, unless pure Python is chosen.
pytestmark = pytest.mark.skipif(os.environ.get(PURE_PYTHON_ENV) == "1",
                                reason="KINSPECT_PURE_PYTHON=1: no C to compare with the numpy path")
WIDTHS = {"int8": (8, pa.int8()), "int16": (16, pa.int16()), "int32": (32, pa.int32()), "int64": (64, pa.int64())}


@pytest.fixture(scope="module")
def native():
    module = optional_extension("kinspect.capture._columns")
    assert module is not None and hasattr(module, "integers"), "capture._columns.integers is not built"
    return module.integers


def _both(native, values, dtype):
    arrow_type = WIDTHS[dtype][1]
    made = _integers(pa, np, values, dtype, arrow_type, native)
    reference = _integers(pa, np, values, dtype, arrow_type)
    made.validate(full=True)
    assert made.type == reference.type == arrow_type
    assert made.null_count == reference.null_count
    assert made.to_pylist() == reference.to_pylist() == list(values)
    assert made.equals(reference)
    _same_bitmap(made, reference, len(values))
    return made


def _same_bitmap(made, reference, n: int) -> None:
    """The validity bitmap byte for byte, the bits past the last value cleared as Arrow clears them."""
    if reference.null_count:
        size = (n + 7) // 8
        assert made.buffers()[0].to_pybytes()[:size] == reference.buffers()[0].to_pybytes()[:size]


@pytest.mark.parametrize("dtype", list(WIDTHS))
@pytest.mark.parametrize("nulls", ["none", "first", "last", "every third", "all"])
def test_every_width_and_null_pattern(native, dtype, nulls):
    bits = WIDTHS[dtype][0]
    low, high = -(1 << (bits - 1)), (1 << (bits - 1)) - 1
    rng = random.Random(f"{dtype}-{nulls}")
    for n in (0, 1, 7, 8, 9, 15, 16, 17, 64, 513):
        values = [rng.choice([low, high, 0, -1, 1, rng.randint(low, high)]) for _ in range(n)]
        if nulls == "first" and n:
            values[0] = None
        elif nulls == "last" and n:
            values[-1] = None
        elif nulls == "every third":
            values = [None if i % 3 == 0 else v for i, v in enumerate(values)]
        elif nulls == "all":
            values = [None] * n
        made = _both(native, tuple(values), dtype)
        assert native(tuple(values), bits // 8) is not None  # the C made it
        if None not in values:
            assert made.buffers()[0] is None  # no validity bitmap where nothing is null


@pytest.mark.parametrize("dtype", list(WIDTHS))
def test_values_that_do_not_fit_are_left_to_numpy(native, dtype):
    bits = WIDTHS[dtype][0]
    for outside in ((1 << (bits - 1)), -(1 << (bits - 1)) - 1, 1 << 70):
        values = (1, None, outside) if dtype != "int64" or abs(outside) > 1 << 64 else (1, outside)
        assert native(values, bits // 8) is None
        with pytest.raises((OverflowError, ValueError, pa.ArrowInvalid)):
            _integers(pa, np, values, dtype, WIDTHS[dtype][1], native)


def test_other_values_are_left_to_numpy(native):
    for values in ((1, True), (1, 2.0), (1, "3")):
        assert native(values, 4) is None
    # numpy converts a bool as it did
    assert _integers(pa, np, (1, True), "int32", pa.int32(), native).to_pylist() == [1, 1]


def test_a_list_is_read_as_a_tuple_is(native):
    assert native([1, None, 3], 2) == native((1, None, 3), 2)
    with pytest.raises(ValueError):
        native((1,), 3)


TIMESTAMP = pa.timestamp("us", tz="UTC")


def _both_times(native, values, offset):
    made = _times(pa, np, values, offset, TIMESTAMP, native)
    reference = _times(pa, np, values, offset, TIMESTAMP)
    made.validate(full=True)
    assert made.type == reference.type
    assert made.null_count == reference.null_count
    assert made.cast(pa.int64()).to_pylist() == reference.cast(pa.int64()).to_pylist()
    assert made.equals(reference)
    _same_bitmap(made, reference, len(values))
    return made


@pytest.fixture(scope="module")
def micros():
    module = optional_extension("kinspect.capture._columns")
    assert module is not None and hasattr(module, "micros"), "capture._columns.micros is not built"
    return module.micros


@pytest.mark.parametrize("offset", [0.0, 1_764_500_000.123456, -3.5])
@pytest.mark.parametrize("nulls", [False, True])
def test_times_in_microseconds(micros, offset, nulls):
    rng = random.Random(f"{offset}-{nulls}")
    for n in (0, 1, 8, 9, 517):
        values = [rng.choice([rng.uniform(0, 1e6), rng.uniform(0, 1e-3), rng.randrange(1, 10**7, 2) / 2e6,
                              12345.0000005, 0.0, 1e-7]) for _ in range(n)]
        if nulls:
            values = [None if rng.random() < 0.3 else v for v in values]
        assert micros(tuple(values), offset) is not None  # the C made it
        _both_times(micros, tuple(values), offset)


def test_halves_of_a_microsecond_round_to_even(micros):
    values = (0.0000005, 0.0000015, 0.0000025, 2.5e-6 + 1.0)
    made = _both_times(micros, values, 0.0).cast(pa.int64()).to_pylist()
    assert made == [round(v * 1_000_000) for v in values]


def test_times_that_are_not_finite_floats_are_left_to_numpy(micros):
    for values in ((1.0, 2), (1.0, float("nan")), (1.0, float("inf")), (1e14,)):
        assert micros(values, 0.0) is None
    assert _both_times(micros, (1.0, float("nan"), None), 0.0).null_count == 2
