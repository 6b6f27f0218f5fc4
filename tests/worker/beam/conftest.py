"""Beam tests share one engine with room for several beam requests and ordinary rows at once."""

from __future__ import annotations

import pytest

from tests.worker.engine.runs import running_engine


@pytest.fixture(scope="module")
def beam_engine(smol):
    with running_engine(smol, "beam-test-worker", max_batch_size=32, max_context=2048, decode_threads=2) as running:
        yield running
