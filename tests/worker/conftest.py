"""Worker fixtures: the real SmolLM2 weights (dequantized once per machine) and a running engine."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from testkit.sluice import MODEL_CACHE
from tests.worker.engine.runs import running_engine


@pytest.fixture(scope="session", autouse=True)
def one_torch_thread():
    """As `sluice serve` runs a worker on two cores: one torch thread, so that the shared engines' two
    decode threads (row groups) take a core each instead of spinning four threads on two cores."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def smol(tmp_path_factory):
    """float32 and unquantized, pinned: parity with transformers is exact there. On CUDA `auto` would load
    nf4 in bfloat16, whose kernels differ between a batch and a single row (bench/worker.py measures it)."""
    from common.protocol import ModelConfig
    from worker.loading import load_model

    os.environ["SLUICE_MODEL_CACHE"] = str(MODEL_CACHE)
    return load_model(ModelConfig(dtype="float32", quantization="none"), Path(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="session")
def smol_cpu(smol, tmp_path_factory):
    """The same weights on the CPU, for what runs there alone (W8A8 is FBGEMM's CPU kernels): `smol` itself
    unless a GPU holds it."""
    from common.protocol import ModelConfig
    from worker.loading import load_model

    if smol.device.type == "cpu":
        return smol
    return load_model(ModelConfig(dtype="float32", quantization="none", device="cpu"),
                      Path(tmp_path_factory.mktemp("data")))


@pytest.fixture(scope="module")
def engine(smol):
    # two decode threads: rows split into groups (runner.py) whenever 8+ rows run, as on a 2-core worker
    with running_engine(smol, "test-worker", max_batch_size=16, max_context=2048, decode_threads=2) as running:
        yield running
