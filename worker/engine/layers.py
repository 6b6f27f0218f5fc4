"""The per-layer pieces of the lean forward: fused projections, RMSNorm and the rotary embedding.

Each does what the Hugging Face module does, in the same arithmetic, with fewer dispatched ops:
a step at batch 1 is mostly per-op overhead on CPU, so one matmul instead of three counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

# RMSNorms that compute weight * (x * rsqrt(mean(x^2) + eps)) in float32, like Llama's
_PLAIN_RMS_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


class Projection(nn.Module):
    """A plain linear map over a (fused) weight: what the runner calls for each projection. A module
    (holding the tensors, not copies) so that decode_layer.py can script it."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None):
        super().__init__()
        self.weight, self.bias = weight, bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)


@dataclass
class FusedLayer:
    """The projections of one decoder layer as the runner calls them (w8a8.py swaps in int8 ones)."""

    qkv: nn.Module | None  # hidden -> [q + k + v]; None = run the three modules
    gate_up: nn.Module | None  # hidden -> [gate, up]; None = run layer.mlp
    o_proj: nn.Module
    down_proj: nn.Module | None
    act: nn.Module | None = None


def _plain(*modules) -> bool:
    """Only exact nn.Linear layers are fused: bitsandbytes and other subclasses keep their own forward."""
    return all(type(m) is nn.Linear for m in modules) and len({m.weight.dtype for m in modules}) == 1


def _concat(modules: list[nn.Linear]) -> torch.Tensor:
    """One weight for several Linear layers; each layer's weight becomes a view into it (no extra memory)."""
    fused = torch.cat([m.weight.data for m in modules])
    offset = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[offset:offset + rows], requires_grad=False)
        offset += rows
    return fused


def fuse_layer(layer: nn.Module, heads: int, kv_heads: int, head_dim: int) -> FusedLayer:
    attention, mlp = layer.self_attn, layer.mlp
    qkv = gate_up = None
    projections = [attention.q_proj, attention.k_proj, attention.v_proj]
    biases = [p.bias is not None for p in projections]
    if _plain(*projections) and len(set(biases)) == 1:
        qkv = Projection(_concat(projections), torch.cat([p.bias.data for p in projections]) if biases[0] else None)
    gated = all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    if gated and _plain(mlp.gate_proj, mlp.up_proj) and mlp.gate_proj.bias is None and mlp.up_proj.bias is None:
        gate_up = Projection(_concat([mlp.gate_proj, mlp.up_proj]))
    if gate_up is None:
        return FusedLayer(qkv, None, attention.o_proj, None)
    return FusedLayer(qkv, gate_up, attention.o_proj, mlp.down_proj, mlp.act_fn)


def plain_rms_norm(norm: nn.Module) -> bool:
    return type(norm).__name__ in _PLAIN_RMS_NORMS


def rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if not plain_rms_norm(norm):
        return norm(hidden)
    return weighted_rms_norm(hidden, norm.weight, norm.variance_epsilon)


def weighted_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    wide = hidden.float()  # the same tensor in float32
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(hidden.dtype)


def decode_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None,
                     scale: float) -> torch.Tensor:
    """One new position per row: query [B, 1, heads, D] over keys/values [B, kv_heads, L, D] -> [B, 1, heads * D].

    Query head h reads kv head h // (heads / kv_heads), as transformers' repeat_kv does; the heads of a
    group go through one batched matmul. SDPA's CPU kernel works per (row, head) and spent ~18% of a
    16-row decode step here; this is the same math (scores, -inf where `keep` is False, softmax)."""
    batch, _, heads, dim = query.shape
    grouped = query.reshape(batch, keys.shape[1], heads // keys.shape[1], dim)
    scores = torch.matmul(grouped, keys.transpose(-1, -2)).mul_(scale)
    if keep is not None:
        scores.masked_fill_(~keep, float("-inf"))
    return torch.matmul(scores.softmax(dim=-1), values).reshape(batch, 1, heads * dim)


def rotate(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """x * cos + rotate_half(x) * sin, with rotate_half(x) = cat(-x2, x1) = roll(x) * sign folded
    into `signed_sin` (negating is exact, so this is transformers' arithmetic)."""
    return x * cos + torch.roll(x, x.shape[-1] // 2, dims=-1) * signed_sin
