"""Limiter fixtures: every behavioural test runs against both backends with the same manual clock."""

from __future__ import annotations

import uuid

import pytest

from gateway.limits import open_limiter

from .manual_clock import START, ManualClock


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock(START)


@pytest.fixture(params=["memory", "redis"])
def backend(request) -> str | None:
    """The Redis URL for the redis backend, None for in-process."""
    return request.getfixturevalue("redis").url if request.param == "redis" else None


@pytest.fixture
async def limiter(backend, clock):
    lim = open_limiter(backend, clock=clock, key_prefix=f"t:{uuid.uuid4().hex}", concurrency_lease=300.0)
    yield lim
    await lim.close()
