"""Qwen3: Qwen2 with an RMSNorm over each head of q and k before the rotation."""

from worker.families.family import Family

FAMILY = Family("qwen3", qk_norm="head", window="layer_types")
