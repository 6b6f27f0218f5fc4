"""The per-layer pieces of the lean forward: fused projections, the norms (RMS, Gemma's 1 + w, LayerNorm),
the rotary embedding (full or partial) and attention (with or without soft-capping).

Each does what the Hugging Face module does, in the same arithmetic, with fewer dispatched ops:
a step at batch 1 is mostly per-op overhead on CPU, so one matmul instead of three counts.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from worker.families.skeleton import LeanRMSNorm

# RMSNorms that compute weight * (x * rsqrt(mean(x^2) + eps)) in float32, like Llama's
_PLAIN_RMS_NORMS = {"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "MixtralRMSNorm", "Phi3RMSNorm"}


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
    gated: bool = True  # gate_up holds [gate | up]; False: it is the ungated MLP's input projection


def plain_linear(*modules) -> bool:
    """Only exact nn.Linear layers are fused: bitsandbytes and other subclasses keep their own forward."""
    return all(type(m) is nn.Linear for m in modules) and len({m.weight.dtype for m in modules}) == 1


def concat_weights(modules: list[nn.Linear]) -> torch.Tensor:
    """One weight for several Linear layers; each layer's weight becomes a view into it (no extra memory)."""
    weights = [m.weight.data for m in modules]
    if any(w.is_meta for w in weights):  # q4 left them unread: a placeholder (a meta cat imports torch._dynamo)
        fused = torch.empty((sum(w.shape[0] for w in weights), *weights[0].shape[1:]), dtype=weights[0].dtype,
                            device="meta")
    else:
        fused = torch.cat(weights)
    offset = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight = nn.Parameter(fused[offset:offset + rows], requires_grad=False)
        offset += rows
    return fused


def plain_rms_norm(norm: nn.Module) -> bool:
    return type(norm).__name__ in _PLAIN_RMS_NORMS or type(norm) is LeanRMSNorm


def weighted_rms_norm(hidden: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    wide = hidden.float()  # the same tensor in float32
    normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + eps)
    return weight * normed.to(hidden.dtype)


class Norm(nn.Module):
    """A family's norm (worker/families/family.py `norm`) over the Hugging Face module's weight, in its arithmetic."""

    def __init__(self, kind: str, module: nn.Module):
        super().__init__()
        self.kind, self.module, self.weight = kind, module, module.weight
        self.eps = float(getattr(module, "variance_epsilon", getattr(module, "eps", 1e-6)))
        if kind not in ("rms", "rms_wide", "gemma", "layer"):
            raise ValueError(f"unknown norm kind {kind!r}")

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        if self.kind == "rms" and plain_rms_norm(self.module):
            return weighted_rms_norm(hidden, self.weight, self.eps)
        if self.kind == "layer":
            return F.layer_norm(hidden, self.weight.shape, self.weight, self.module.bias, self.eps)
        wide = hidden.float()
        normed = wide * torch.rsqrt(wide.pow(2).mean(-1, keepdim=True) + self.eps)
        if self.kind == "gemma":  # (x * (1 + w)) before the cast, Gemma's order
            return (normed * (1.0 + self.weight.float())).type_as(hidden)
        if self.kind == "rms_wide":  # OLMo 2: the weight applied before the cast
            return (self.weight * normed).to(hidden.dtype)
        return self.module(hidden)  # an RMSNorm class not known to be plain: its own forward


def capped_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, keep: torch.Tensor | None,
                     scale: float, softcap: float | None) -> torch.Tensor:
    """Attention written out, for what SDPA cannot do (soft-capped scores, Gemma 2): query [B, L, heads, D] over
    keys/values [B, kv_heads, T, D], `keep` [B or 1, 1, L, T] -> [B, L, heads * D]. As transformers' eager
    attention: scores x scale, then cap * tanh(scores / cap), masked, softmax in float32."""
    batch, length, heads, dim = query.shape
    kv_heads = keys.shape[1]
    grouped = query.transpose(1, 2).reshape(batch, kv_heads, heads // kv_heads, length, dim)
    scores = torch.matmul(grouped, keys.unsqueeze(2).transpose(-1, -2)) * scale
    if softcap is not None:
        scores = torch.tanh(scores / softcap) * softcap
    if keep is not None:
        scores = scores.masked_fill(~keep.unsqueeze(2), float("-inf"))
    weights = scores.softmax(dim=-1, dtype=torch.float32).to(query.dtype)
    out = torch.matmul(weights, values.unsqueeze(2)).reshape(batch, heads, length, dim)
    return out.transpose(1, 2).reshape(batch, length, heads * dim)


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


def rotate_partial(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """`rotate` of the first cos.shape[-1] dimensions of each head; the rest pass (partial rotary: GPT-NeoX, Phi)."""
    width = cos.shape[-1]
    if width == x.shape[-1]:
        return rotate(x, cos, signed_sin)
    return torch.cat([rotate(x[..., :width], cos, signed_sin), x[..., width:]], dim=-1)
