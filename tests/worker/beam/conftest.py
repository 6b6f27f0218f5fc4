"""Beam tests share one engine with room for several beam requests and ordinary rows at once."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def beam_engine(smol):
    from worker.engine.engine import Engine
    from worker.protocol import ModelConfig

    running = Engine(smol, ModelConfig(max_batch_size=32, max_context=2048), "beam-test-worker")
    running.start()
    yield running
    running.stop()
