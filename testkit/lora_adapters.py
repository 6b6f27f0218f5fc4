"""Random LoRA adapters written by PEFT itself, for the LoRA tests and bench/lora.py."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import LoraConfig, get_peft_model
from torch import nn

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVERY = ATTENTION + ["gate_proj", "up_proj", "down_proj"]


def write_adapter(base: nn.Module, directory: Path, seed: int, targets: list[str] = EVERY, rank: int = 8,
                  alpha: float = 16, strength: float = 0.5, **options) -> Path:
    """A PEFT LoRA adapter with random A and B, saved by PEFT. Each module's update B @ A * scaling gets
    `strength` times the norm of the weight it adapts: large enough to change the greedy output, not
    so large that the model only babbles."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, **options)
    model = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                down, up = module.lora_A["default"].weight, module.lora_B["default"].weight
                update = (up @ down) * module.scaling["default"]
                up.mul_(strength * module.base_layer.weight.float().norm() / update.norm())
    model.save_pretrained(directory)
    return directory


def edit_config(directory: Path, **changes) -> Path:
    path = directory / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return directory
