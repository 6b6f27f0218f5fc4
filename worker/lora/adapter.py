"""An adapter laid out for the runner's fused projections, ready to be applied to batch rows.

The runner computes q/k/v as one matmul and gate/up as one (layers.py), so an adapter's updates are
fused the same way: per layer and projection group, one A for all members (their A matrices stacked:
[in, r_q + r_k + r_v]) and one block-diagonal B ([r_q + r_k + r_v, out_q + out_k + out_v], the
scaling folded in). A row's update of the whole group is then two small matmuls, x @ A @ B.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from worker.lora.peft_format import AdapterWeights, LoraModule, ModelShape

# the runner's projection groups, in the order of its fused outputs (and of delta.py's group index)
GROUPS = (("q_proj", "k_proj", "v_proj"), ("o_proj",), ("gate_proj", "up_proj"), ("down_proj",))
_NONE = torch.empty(0)  # a group the adapter leaves alone


@dataclass
class LoraAdapter:
    name: str
    source: str
    layers: list[list[torch.Tensor]]  # per layer: A and B of each group in GROUPS order (8 tensors)
    rank: int  # the largest rank of its modules
    nbytes: int

    @property
    def key(self) -> tuple[str, str]:
        return self.name, self.source


def model_shape(decoder_layers: list[torch.nn.Module]) -> ModelShape:
    """In and out widths of every projection an adapter may target (Linear and bitsandbytes layers
    both carry in_features / out_features); a family without them (GPT-NeoX, Phi-3's fused ones) has none."""
    if not decoder_layers:  # a runner without LoRA (hf_runner.py): nothing an adapter may target
        return ModelShape(0, {})
    first = decoder_layers[0]
    dims = {}
    for block in (getattr(first, "self_attn", None), getattr(first, "mlp", None)):
        for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"):
            module = getattr(block, name, None)
            if module is not None:
                dims[name] = (module.in_features, module.out_features)
    return ModelShape(len(decoder_layers), dims)


def lay_out(name: str, source: str, weights: AdapterWeights, shape: ModelShape, dtype: torch.dtype,
            device: torch.device) -> LoraAdapter:
    layers = []
    for layer in range(shape.layers):
        tensors: list[torch.Tensor] = []
        for members in GROUPS:
            tensors += _fused_group([weights.modules.get((layer, m)) for m in members],
                                    [shape.dims.get(m, (0, 0))[1] for m in members], dtype, device)
        layers.append(tensors)
    nbytes = sum(t.numel() * t.element_size() for tensors in layers for t in tensors)
    return LoraAdapter(name, source, layers, max(m.rank for m in weights.modules.values()), nbytes)


def _fused_group(modules: list[LoraModule | None], widths: list[int], dtype: torch.dtype,
                 device: torch.device) -> list[torch.Tensor]:
    """A [in, R] and block-diagonal B [R, sum(widths)] for one group; member i's block maps its rank
    slice to its output columns (untargeted members keep zero columns)."""
    present = [m for m in modules if m is not None]
    if not present:
        return [_NONE, _NONE]
    down = torch.cat([m.down.double() for m in present]).t()
    up = torch.zeros(down.shape[1], sum(widths), dtype=torch.float64)
    rank_at = column = 0
    for module, width in zip(modules, widths):
        if module is not None:
            up[rank_at:rank_at + module.rank, column:column + width] = (module.up.double() * module.scaling).t()
            rank_at += module.rank
        column += width
    return [down.to(device, dtype).contiguous(), up.to(device, dtype).contiguous()]
