"""GPT-NeoX (Pythia): LayerNorms, one q/k/v projection laid out per head, partial rotary, an ungated GELU MLP,
biases everywhere, and (config.use_parallel_residual) attention and MLP side by side on the same input."""

from worker.families.family import Family

FAMILY = Family("gpt_neox", decoder="gpt_neox", embed="embed_in", final_norm="final_layer_norm",
                attention="attention", qkv=("query_key_value",), qkv_by_head=True, out="dense", gate_up=(),
                up="dense_h_to_4h", down="dense_4h_to_h", act="act", norm="layer",
                parallel_residual="use_parallel_residual")
