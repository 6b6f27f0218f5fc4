"""A real SmolLM2 engine and its worker app, shared by the tool-calling tests of a module."""

from __future__ import annotations

import pytest

from common.protocol import ModelInfo
from tests.worker.engine.runs import running_engine
from tests.worker.tools.helpers import serving
from worker.server import create_worker_app

# Room for every prompt of a module (20 tool prompts of ~340 tokens: ~320 MB of float32 KV): its tests send the
# same prompts again (each tool_choice, each parametrization), and prefill is their cost. The 128 MiB default held
# a third of them, so most were prefilled again. float32 answers are the same from the cache (worker/engine/README.md).
PREFIX_CACHE_BYTES = 512 * 2**20


@pytest.fixture(scope="module")
def tools_engine(smol):
    with running_engine(smol, "tools-test", max_batch_size=16, max_context=1024,
                        prefix_cache_bytes=PREFIX_CACHE_BYTES) as running:
        yield running


@pytest.fixture(scope="module")
def worker_url(tools_engine):
    """The worker's HTTP API over the shared engine, served by uvicorn (concurrent requests share the batch)."""
    info = ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none", max_context=1024,
                     max_rows=16, vocab_size=tools_engine.vocab_size, eos_token_ids=tools_engine.model_eos)
    with serving(create_worker_app(tools_engine, info)) as url:
        yield url
