"""Read a PEFT LoRA adapter directory (adapter_config.json + adapter_model.safetensors or .bin) and
check it against the served model, before any of it reaches the engine.

What is accepted: plain LoRA (`peft_type` LORA) on the decoder layers' q/k/v/o and gate/up/down
projections, any rank up to the configured limit (per module, so `rank_pattern` works), scaling
`lora_alpha / r`, or `lora_alpha / sqrt(r)` with `use_rslora`. Everything that changes the forward
in another way (DoRA, LoRA biases, per-module alphas, extra trained modules, ...) is refused by
name rather than served wrong.
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file

from worker.lora.errors import AdapterError

CONFIG_FILE = "adapter_config.json"
WEIGHT_FILES = ("adapter_model.safetensors", "adapter_model.bin")
PROJECTIONS = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn",
               "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
# config fields whose non-default value changes what the adapter computes (we do not implement them)
UNSUPPORTED = {"use_dora": "DoRA", "lora_bias": "LoRA bias vectors", "alpha_pattern": "per-module lora_alpha",
               "modules_to_save": "extra trained modules (modules_to_save)", "fan_in_fan_out": "fan_in_fan_out",
               "layer_replication": "layer replication", "target_parameters": "target_parameters",
               "trainable_token_indices": "trainable token embeddings", "use_qalora": "QA-LoRA",
               "alora_invocation_tokens": "activated LoRA (alora_invocation_tokens)", "arrow_config": "Arrow routing",
               "use_bdlora": "block-diagonal LoRA", "kasa_config": "KaSA", "velora_config": "VeLoRA",
               "monteclora_config": "MonteCLoRA", "megatron_config": "Megatron layers"}
# base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight (older PEFT kept ".default" after lora_A)
_KEY = re.compile(r"^base_model\.model\.model\.layers\.(\d+)\.(self_attn|mlp)\.(\w+)"
                  r"\.lora_([AB])(?:\.[\w-]+)?\.weight$")


@dataclass(frozen=True)
class ModelShape:
    """What an adapter must fit: the input and output width of each projection, and the layer count."""

    layers: int
    dims: dict[str, tuple[int, int]]  # projection name -> (in_features, out_features)


@dataclass
class LoraModule:
    down: torch.Tensor  # A: [rank, in_features]
    up: torch.Tensor  # B: [out_features, rank]
    scaling: float

    @property
    def rank(self) -> int:
        return self.down.shape[0]


@dataclass
class AdapterWeights:
    modules: dict[tuple[int, str], LoraModule]  # (layer, projection name) -> its low-rank update


def read_adapter(directory: Path, shape: ModelShape, max_rank: int) -> AdapterWeights:
    config = _config(directory)
    tensors = _tensors(directory)
    pairs: dict[tuple[int, str], dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        match = _KEY.match(key)
        if match is None:
            raise AdapterError(f"unsupported tensor {key!r}: only LoRA A/B weights of the decoder layers' "
                               f"projections ({', '.join(PROJECTIONS)}) are served")
        layer, block, name, side = int(match[1]), match[2], match[3], match[4]
        if PROJECTIONS.get(name) != block or name not in shape.dims:
            raise AdapterError(f"tensor {key!r} targets {block}.{name}, which this model does not have "
                               f"(supported: {', '.join(PROJECTIONS)})")
        if layer >= shape.layers:
            raise AdapterError(f"tensor {key!r} targets layer {layer}; the model has {shape.layers} layers")
        pairs.setdefault((layer, name), {})[side] = tensor
    if not pairs:
        raise AdapterError("the adapter holds no LoRA weights")
    modules = {}
    for (layer, name), sides in sorted(pairs.items()):
        if set(sides) != {"A", "B"}:
            raise AdapterError(f"layer {layer} {name} has lora_{next(iter(sides))} but not its counterpart")
        modules[layer, name] = _module(layer, name, sides["A"], sides["B"], shape, config, max_rank)
    return AdapterWeights(modules)


def _config(directory: Path) -> dict:
    path = directory / CONFIG_FILE
    if not path.exists():
        raise AdapterError(f"{directory} holds no {CONFIG_FILE}: not a PEFT adapter directory", kind="not_found")
    try:
        config = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise AdapterError(f"{CONFIG_FILE} is not valid JSON: {exc}") from None
    if not isinstance(config, dict):
        raise AdapterError(f"{CONFIG_FILE} must hold a JSON object")
    if config.get("peft_type") != "LORA":
        raise AdapterError(f"peft_type {config.get('peft_type')!r} is not served; only LORA adapters are")
    for field, feature in UNSUPPORTED.items():
        if config.get(field):
            raise AdapterError(f"the adapter uses {feature} ({field}), which this worker does not serve")
    if config.get("bias", "none") != "none":
        raise AdapterError(f"bias {config['bias']!r} (trained bias vectors) is not served; only bias 'none' is")
    alpha = config.get("lora_alpha", 8)
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not math.isfinite(alpha) or alpha <= 0:
        raise AdapterError(f"lora_alpha must be a positive number, not {alpha!r}")
    return config


def _tensors(directory: Path) -> dict[str, torch.Tensor]:
    safetensors, pickle = (directory / name for name in WEIGHT_FILES)
    try:
        if safetensors.is_file():
            return load_file(safetensors)
        if pickle.is_file():  # weights only: a pickled adapter cannot run code here
            loaded = torch.load(pickle, map_location="cpu", weights_only=True)
            if not isinstance(loaded, dict) or not all(isinstance(v, torch.Tensor) for v in loaded.values()):
                raise AdapterError(f"{pickle.name} is not a state dict of tensors")
            return loaded
    except (SafetensorError, OSError, RuntimeError, EOFError, ValueError) as exc:  # torch.load's unpickling errors
        raise AdapterError(f"cannot read the adapter weights: {str(exc).splitlines()[0]}") from None
    raise AdapterError(f"{directory} holds neither {' nor '.join(WEIGHT_FILES)}", kind="not_found")


def _module(layer: int, name: str, down: torch.Tensor, up: torch.Tensor, shape: ModelShape, config: dict,
            max_rank: int) -> LoraModule:
    where = f"layer {layer} {name}"
    in_features, out_features = shape.dims[name]
    if down.dim() != 2 or up.dim() != 2 or down.shape[0] != up.shape[1]:
        raise AdapterError(f"{where}: lora_A {list(down.shape)} and lora_B {list(up.shape)} are not a rank-r pair")
    rank = down.shape[0]
    if not 1 <= rank <= max_rank:
        raise AdapterError(f"{where}: rank {rank} is outside 1..{max_rank} (max_adapter_rank)")
    if down.shape[1] != in_features or up.shape[0] != out_features:
        raise AdapterError(f"{where}: the adapter maps {down.shape[1]} -> {up.shape[0]} features, the model's "
                           f"projection {in_features} -> {out_features}: it was trained for another base model")
    if not (down.is_floating_point() and up.is_floating_point()):
        raise AdapterError(f"{where}: LoRA weights must be floating point, not {down.dtype}")
    if not (torch.isfinite(down).all() and torch.isfinite(up).all()):
        raise AdapterError(f"{where}: the weights hold NaN or infinite values")
    alpha = config.get("lora_alpha", 8)
    scaling = alpha / math.sqrt(rank) if config.get("use_rslora") else alpha / rank
    return LoraModule(down, up, scaling)
