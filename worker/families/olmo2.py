"""OLMo 2: norms after attention and after the MLP (none before), and RMSNorms over all of q and all of k."""

from worker.families.family import Family

FAMILY = Family("olmo2", norm="rms_wide", input_norm=None, attention_out_norm="post_attention_layernorm",
                mlp_norm=None, mlp_out_norm="post_feedforward_layernorm", qk_norm="full")
