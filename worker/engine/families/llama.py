"""Llama (and SmolLM, DeepSeek-R1 Llama distills): the shape every other family varies."""

from worker.engine.families.family import Family

FAMILY = Family("llama")
