"""Llama (and SmolLM, DeepSeek-R1 Llama distills): the shape every other family varies."""

from worker.families.family import Family

FAMILY = Family("llama", mlp_bias="mlp_bias")
