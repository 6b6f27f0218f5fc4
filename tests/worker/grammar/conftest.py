"""A real engine on SmolLM2 for the structured-output tests (the `smol` weights come from tests/worker)."""

from __future__ import annotations

import pytest

from tests.worker.engine.runs import running_engine


@pytest.fixture(scope="module")
def grammar_engine(smol):
    # no compile limit can trip here (these tests are not about it), however loaded the machine
    with running_engine(smol, "grammar-test", max_batch_size=16, max_context=768,
                        grammar_compile_timeout_s=3600.0) as running:
        yield running
