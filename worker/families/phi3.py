"""Phi-3 / Phi-4: fused q/k/v and gate/up projections, partial rotary where configured, long-rope scaling
(its rotary module picks the short or long factors per forward), a window where config.sliding_window."""

from worker.families.family import Family

FAMILY = Family("phi3", qkv=("qkv_proj",), gate_up=("gate_up_proj",), act="activation_fn", window="config",
                qkv_bias=False, out_bias=False)
