"""Worker fixtures: the real SmolLM2 weights (dequantized once per machine) and a running engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.fixtures.sluice import MODEL_CACHE


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    from worker.loading import load_model
    from worker.protocol import ModelConfig

    os.environ["SLUICE_MODEL_CACHE"] = str(MODEL_CACHE)
    return load_model(ModelConfig(), Path(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def engine(smol):
    from worker.engine.engine import Engine
    from worker.protocol import ModelConfig

    running = Engine(smol, ModelConfig(max_batch_size=16, max_context=2048), "test-worker")
    running.start()
    yield running
    running.stop()
