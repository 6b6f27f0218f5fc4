"""The decoder families the lean runner runs, by the config's `model_type` (as vLLM's model registry): one
short module each, a `Family` (family.py) on the shared layers. Adding a family is a module here and a line
in FAMILIES, plus its parity test in tests/worker/engine/test_families.py."""

from __future__ import annotations

from worker.families import (
    gemma2,
    gemma3,
    gpt_neox,
    llama,
    mistral,
    mixtral,
    olmo2,
    phi3,
    qwen2,
    qwen3,
    qwen3_moe,
)
from worker.families.family import Family, UnsupportedModel

FAMILIES: dict[str, Family] = {module.FAMILY.name: module.FAMILY for module in (
    llama, mistral, qwen2, qwen3, gemma2, gemma3, phi3, olmo2, gpt_neox, mixtral, qwen3_moe)}


def family_of(model) -> Family:
    """The model's family, or UnsupportedModel naming its model_type."""
    model_type = getattr(model.config, "model_type", None)
    family = FAMILIES.get(model_type or "")  # no family is named ""
    if family is None:
        raise UnsupportedModel(f"{model_type or type(model).__name__}: no family description for the lean path "
                               f"(it runs {', '.join(sorted(FAMILIES))})")
    return family
