"""Qwen3-MoE: Qwen3 with a top-k mixture of experts (renormalised where config.norm_topk_prob) on the
layers config.decoder_sparse_step picks, dense MLPs on the rest."""

from worker.families.family import Family

FAMILY = Family("qwen3_moe", qk_norm="head", window="config", moe=True, moe_normalised="norm_topk_prob")
