"""The proxy's malloc settings: set on glibc unless the operator chose their own, and the proxy says which."""

from __future__ import annotations

import platform

import pytest

from kinspect.proxy.allocator import MMAP_THRESHOLD, keep_read_buffers


@pytest.mark.parametrize("name", ["MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"])
def test_an_operator_setting_is_left_alone(name):
    assert keep_read_buffers({name: "1"}) == f"malloc settings left as the environment sets them ({name})"


def test_glibc_serves_large_reads_from_the_heap():
    said = keep_read_buffers({})
    if platform.libc_ver()[0] == "glibc":
        assert said.startswith(f"malloc: blocks under {MMAP_THRESHOLD >> 20} MiB from the heap")
    else:
        assert said == "malloc settings left alone (not glibc)"
