"""Mistral: Llama with a sliding window over every layer (config.sliding_window; None in v0.2 and later)."""

from worker.families.family import Family

FAMILY = Family("mistral", window="config", qkv_bias=False, out_bias=False)
