"""Torch modules over forward.c's packed weights, for what still runs in torch once q4 drops the float32 ones.

A q4 runner that owns its model keeps one copy of each projection: the packed one forward.c reads (0.625
bytes a weight in 4 bits, 1.0625 in 8). The torch paths that remain (decode steps holding a LoRA row,
prefill chunks forward.c does not take) call `PackedLinear`, which dequantizes its matrix for each call, a
slice of rows at a time: the weights it computes with are exactly the native forward's, and no float32 copy
stays between calls.
Token embeddings are rows of the packed vocabulary matrix where the model ties the two (SmolLM2), else of
the embedding's own packed copy (`PackedEmbedding`). Both modules script (decode_layer.py compiles them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from worker.engine.native.pack import Packed, picked_weights, tiled_weights

# output rows dequantized at a time: the vocabulary matrix whole would be ~3 x 113 MB of float32 temporaries
# in SmolLM2 (a load's worth of peak memory at every long prefill chunk); 4,096 rows are ~10 MB
SLICE_ROWS = 4096  # a multiple of the tile's 16 rows


class PackedLinear(nn.Module):
    """x @ W.T + bias with W dequantized from a Packed matrix at each call."""

    def __init__(self, packed: Packed, bias: torch.Tensor | None = None):
        super().__init__()
        self.tiles, self.halves, self.bits, self.bias = packed.tiles, packed.halves, packed.bits, bias
        self.out_features, self.in_features = packed.rows, packed.cols
        self.slice_rows = SLICE_ROWS  # an attribute: TorchScript does not read module globals

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows, bias = self.out_features, self.bias
        if rows <= self.slice_rows:
            return F.linear(x, tiled_weights(self.tiles, self.halves, self.bits)[:rows], bias)
        parts: list[torch.Tensor] = []
        for first in range(0, rows, self.slice_rows):  # slice_rows: whole tiles of 16 rows
            end = min(first + self.slice_rows, rows)
            blocks = slice(first // 16, (end + 15) // 16)
            weight = tiled_weights(self.tiles[blocks], self.halves[blocks], self.bits)[:end - first]
            parts.append(F.linear(x, weight, None if bias is None else bias[first:end]))
        return torch.cat(parts, dim=-1)


class PackedEmbedding(nn.Module):
    """Token embeddings: the ids' rows of a Packed [vocab, hidden] matrix, dequantized, times `scale` (Gemma's
    sqrt(hidden), in float32 as its embedding module multiplies; 1 elsewhere, which changes no bit)."""

    def __init__(self, packed: Packed, scale: float = 1.0):
        super().__init__()
        self.tiles, self.halves, self.bits, self.scale = packed.tiles, packed.halves, packed.bits, scale

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        rows = picked_weights(self.tiles, self.halves, self.bits, ids.reshape(-1))
        return (rows * self.scale).reshape(list(ids.shape) + [-1])


def embedding_scale(runner) -> float:
    """What the runner's embedding module multiplies by (Gemma 3's sqrt(hidden)), as the float32 its buffer holds
    (read from the module's plain float: a model built on the meta device has no buffer values)."""
    scale = getattr(runner.embed_tokens, "scalar_embed_scale", None)
    return 1.0 if scale is None else float(torch.tensor(scale, dtype=torch.float32))


def release(module: nn.Module) -> None:
    """Every parameter of `module` becomes a shapeless placeholder (meta device): its memory is freed, and a
    call of the Hugging Face forward fails loudly instead of computing with missing weights."""
    for name, parameter in list(module.named_parameters(recurse=False)):
        setattr(module, name, nn.Parameter(parameter.to("meta"), requires_grad=False))


def run_on_packed(runner, matrices: dict[str, Packed]) -> None:
    """The runner's torch paths compute with `matrices` (native/install.py's names) and its model's float32
    projections and embeddings are freed. `matrices["embed"]`: an untied model's packed embedding."""
    for index, (plan, fused) in enumerate(zip(runner.plans, runner.fused)):
        fused.qkv = PackedLinear(matrices[f"{index}.qkv"], fused.qkv.bias)  # the bias: its own small tensor
        fused.o_proj = PackedLinear(matrices[f"{index}.o"])
        fused.gate_up = PackedLinear(matrices[f"{index}.gate_up"])
        fused.down_proj = PackedLinear(matrices[f"{index}.down"])
        for module in plan.projections:
            release(module)
    for module in (runner.embed_tokens, runner.lm_head):
        release(module)
    runner.embed_tokens = PackedEmbedding(matrices.get("embed", matrices["lm_head"]), embedding_scale(runner))
    runner.set_head(PackedLinear(matrices["lm_head"]))
