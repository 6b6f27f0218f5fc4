"""A real engine on SmolLM2 for the structured-output tests (the `smol` weights come from tests/worker)."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def grammar_engine(smol):
    from worker.engine.engine import Engine
    from worker.protocol import ModelConfig

    running = Engine(smol, ModelConfig(max_batch_size=16, max_context=768), "grammar-test")
    running.start()
    yield running
    running.stop()
