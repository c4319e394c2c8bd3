"""Shared fixtures: one codec (specs compiled on demand) for the whole test run."""

from __future__ import annotations

import pytest

from kinspect.protocol.codec import Codec
from tests.support.spark import spark  # noqa: F401  (the session-wide SparkSession fixture)


@pytest.fixture(scope="session")
def codec() -> Codec:
    return Codec()
