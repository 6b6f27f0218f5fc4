"""Gemma 2: (1 + w) RMSNorms before and after both attention and the MLP, GeGLU (the module's own
gelu_pytorch_tanh), embeddings scaled by sqrt(hidden) (its embedding module does it), attention scaled by
query_pre_attn_scalar, soft-capped scores and logits, and a sliding window on alternate layers."""

from worker.families.family import Family

FAMILY = Family("gemma2", norm="gemma", attention_out_norm="post_attention_layernorm",
                mlp_norm="pre_feedforward_layernorm", mlp_out_norm="post_feedforward_layernorm",
                window="layer_types", softcap=True, attention_scalar="query_pre_attn_scalar",
                scaled_embedding=True)
