"""The per-layer pieces of the lean forward: fused projections, RMSNorm and the rotary embedding.

Each does what the Hugging Face module does, in the same arithmetic, with fewer dispatched ops:
a step at batch 1 is mostly per-op overhead on CPU, so one matmul instead of three counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

# RMSNorms that compute weight * (x * rsqrt(mean(x^2) + eps)) in float32, like Llama's
_PLAIN_RMS_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm"}


@dataclass
class FusedLayer:
    qkv: torch.Tensor | None  # [q + k + v rows, hidden]; None = run the three modules
    qkv_bias: torch.Tensor | None
    gate_up: torch.Tensor | None  # [2 * intermediate, hidden]; None = run layer.mlp
    act: object = None


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
    qkv = qkv_bias = gate_up = None
    projections = [attention.q_proj, attention.k_proj, attention.v_proj]
    biases = [p.bias is not None for p in projections]
    if _plain(*projections) and len(set(biases)) == 1:
        qkv = _concat(projections)
        if biases[0]:
            qkv_bias = torch.cat([p.bias.data for p in projections])
    gated = all(hasattr(mlp, name) for name in ("gate_proj", "up_proj", "down_proj", "act_fn"))
    if gated and _plain(mlp.gate_proj, mlp.up_proj) and mlp.gate_proj.bias is None and mlp.up_proj.bias is None:
        gate_up = _concat([mlp.gate_proj, mlp.up_proj])
    return FusedLayer(qkv, qkv_bias, gate_up, mlp.act_fn if gate_up is not None else None)


def rms_norm(norm: nn.Module, hidden: torch.Tensor) -> torch.Tensor:
    if type(norm).__name__ not in _PLAIN_RMS_NORMS:
        return norm(hidden)
    wide = hidden.float()  # the same tensor in float32
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + norm.variance_epsilon)
    return norm.weight * normed.to(hidden.dtype)


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
