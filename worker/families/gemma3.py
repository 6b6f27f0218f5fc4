"""Gemma 3 (text: Gemma3ForCausalLM): Gemma 2's layer with per-head (1 + w) q/k norms, and local (sliding) and
global layers, each kind with its own rotary base (config.rope_parameters per layer type)."""

from worker.families.family import Family

FAMILY = Family("gemma3_text", norm="gemma", attention_out_norm="post_attention_layernorm",
                mlp_norm="pre_feedforward_layernorm", mlp_out_norm="post_feedforward_layernorm", qk_norm="head",
                window="layer_types", rope_by_layer_type=True, softcap=True,
                attention_scalar="query_pre_attn_scalar", scaled_embedding=True)
