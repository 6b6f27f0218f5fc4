"""The quality rule of `quantization = "auto"` (worker/cpu_features.py): a quantized mode keeps a model's quality
where, teacher-forced on float32's greedy continuations, its argmax is float32's token at >= MIN_TOP1 of the
positions and its perplexity is <= MAX_PERPLEXITY_RATIO x float32's. bench/default_config.py and
bench/family_quality.py measure it; tests hold the native forward's families to it."""

MIN_TOP1, MAX_PERPLEXITY_RATIO = 0.90, 1.05
