"""LoRA adapters served beside the base model: PEFT directories in, per-row batched updates out."""
