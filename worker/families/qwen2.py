"""Qwen2 / Qwen2.5 (and the DeepSeek-R1 Qwen distills): Llama with q/k/v biases (read from the modules) and,
where config.use_sliding_window, a window on the layers its layer_types name."""

from worker.families.family import Family

FAMILY = Family("qwen2", window="layer_types", qkv_bias=True, out_bias=False)
