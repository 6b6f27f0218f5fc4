"""A tiny random Llama on SmolLM2's tokenizer and PEFT adapters for it, written once per module."""

from __future__ import annotations

import pytest

from testkit.lora_adapters import ATTENTION, EVERY, write_adapter
from testkit.tiny_model import tiny_llama


@pytest.fixture(scope="module")
def tiny(smol):
    return tiny_llama(smol.tokenizer)


@pytest.fixture(scope="module")
def tiny_adapters(tiny, tmp_path_factory) -> dict:
    """Four adapters that differ in what they target, their ranks and their scaling rules."""
    root = tmp_path_factory.mktemp("tiny-adapters")
    model = tiny.model
    return {
        "attention": write_adapter(model, root / "attention", 1, ATTENTION, rank=4, alpha=8),
        "mlp": write_adapter(model, root / "mlp", 2, ["gate_proj", "up_proj", "down_proj"], rank=8, alpha=4,
                             use_rslora=True),
        "every": write_adapter(model, root / "every", 3, EVERY, rank=16, alpha=32),
        "qv": write_adapter(model, root / "qv", 4, ["q_proj", "v_proj"], rank=2, alpha=2, rank_pattern={"v_proj": 6}),
    }
