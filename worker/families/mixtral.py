"""Mixtral: Mistral with a top-k mixture of experts for the MLP (router weights renormalised)."""

from worker.families.family import Family

FAMILY = Family("mixtral", window="config", moe=True)
