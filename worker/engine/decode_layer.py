"""The decode step (one new position per row) of every decoder layer as one TorchScript call.

Why scripted: a layer's decode step is ~25 small torch calls (~60 in w8a8). From Python each call
takes and drops the GIL, so two threads that decode different rows (runner.py's row groups) spend
their time waiting for each other: measured 1.2x for two threads instead of 2x. The TorchScript
interpreter runs the whole stack without the GIL, and two row groups run at 1.8x on two cores. A
single stream gains too: the per-call cost of Python dispatch is most of a 1-row step on a small
model, and the stack is one call from Python instead of 30 layers of small ones. The arithmetic is
the Python path's (`ModelRunner._layer`: the same functions from layers.py, compiled; one row
attends through SDPA there as here), and the logits are bitwise equal
(tests/worker/engine/test_row_groups.py).

`torch.jit.script` is deprecated in favour of `torch.compile`, but compile's generated wrapper is
Python that holds the GIL between kernels and recompiles as batch and length change every step;
TorchScript runs in pinned torch 2.13 and is the tool that does this job. The runner calls the stack with
the graph executor's optimizations off (`torch.jit.optimized_execution(False)`): the profiling executor
would record the stack's first call and run its optimization passes over the 30 inlined layers at the
second, ~2.5 s of a core in all, which were the first decode steps of a burst that woke a worker; the
interpreted graph it leaves runs no faster on CPU (no fuser runs there). Layers it cannot compile
(bitsandbytes projections, norms other than plain RMSNorm, any family variant beyond Llama's layer:
per-head norms, windows, soft-caps, experts; an activation that does not script) keep the Python path.
"""

from __future__ import annotations

import warnings

import structlog
import torch
import torch.nn.functional as F
from torch import nn

from worker.engine.layers import FusedLayer, decode_attention, plain_rms_norm, rotate, weighted_rms_norm
from worker.lora.delta import add_lora

log = structlog.get_logger(__name__)


class DecodeLayer(nn.Module):
    def __init__(self, layer: nn.Module, fused: FusedLayer, heads: int, kv_heads: int, head_dim: int):
        super().__init__()
        self.input_norm, self.input_eps = layer.input_layernorm.weight, float(layer.input_layernorm.variance_epsilon)
        self.post_norm = layer.post_attention_layernorm.weight
        self.post_eps = float(layer.post_attention_layernorm.variance_epsilon)
        self.qkv, self.o_proj, self.gate_up, self.down_proj, self.act = \
            fused.qkv, fused.o_proj, fused.gate_up, fused.down_proj, fused.act
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, head_dim
        scaling = getattr(layer.self_attn, "scaling", None)
        self.scale = scaling or head_dim ** -0.5
        self.sdpa_default_scale = scaling is None  # the Python path passes the module's own scale, or none

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, keep: torch.Tensor | None,
                slots: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, first: int,
                longest: int, lora_rows: list[torch.Tensor], lora: list[torch.Tensor]) -> torch.Tensor:
        """hidden [B, 1, hidden] of slots first..first+B-1; writes their new key/value at `slots`
        (KVCache.decode_slots) into this layer's cache tensors and attends over positions 0..longest-1.
        `lora_rows` / `lora`: the rows' LoRA segments (worker/lora/delta.py; empty = base model only)."""
        batch = hidden.shape[0]
        heads, kv_heads, dim = self.heads, self.kv_heads, self.head_dim
        adapted = len(lora_rows) > 0
        normed = weighted_rms_norm(hidden, self.input_norm, self.input_eps)
        qkv = self.qkv(normed)
        if adapted:
            add_lora(normed.view(batch, -1), qkv.view(batch, -1), lora_rows, lora, 0)
        qkv = qkv.view(batch, 1, heads + 2 * kv_heads, dim)
        query_key = rotate(qkv[:, :, : heads + kv_heads], cos, signed_sin)
        # a float16 cache (q4, kv_cache.py) is written converted and read widened
        keys.view(-1, dim).index_copy_(0, slots, query_key[:, :, heads:].reshape(-1, dim).to(keys.dtype))
        values.view(-1, dim).index_copy_(0, slots, qkv[:, :, heads + kv_heads:].reshape(-1, dim).to(values.dtype))
        keys = keys[first:first + batch, :, :longest].to(hidden.dtype)
        values = values[first:first + batch, :, :longest].to(hidden.dtype)
        if batch == 1:  # as the Python path: SDPA, transformers' own attention for one row
            query = query_key[:, :, :heads].transpose(1, 2)
            if self.sdpa_default_scale:
                out = F.scaled_dot_product_attention(query, keys, values, attn_mask=keep, enable_gqa=True)
            else:
                out = F.scaled_dot_product_attention(query, keys, values, attn_mask=keep, enable_gqa=True,
                                                     scale=self.scale)
            out = out.transpose(1, 2).reshape(batch, 1, heads * dim)
        else:
            out = decode_attention(query_key[:, :, :heads], keys, values, keep, self.scale)
        projected = self.o_proj(out)
        if adapted:
            add_lora(out.view(batch, -1), projected.view(batch, -1), lora_rows, lora, 1)
        hidden = hidden + projected
        normed = weighted_rms_norm(hidden, self.post_norm, self.post_eps)
        gate_up = self.gate_up(normed)
        if adapted:
            add_lora(normed.view(batch, -1), gate_up.view(batch, -1), lora_rows, lora, 2)
        gate, up = gate_up.chunk(2, dim=-1)
        inner = self.act(gate) * up
        projected = self.down_proj(inner)
        if adapted:
            add_lora(inner.view(batch, -1), projected.view(batch, -1), lora_rows, lora, 3)
        return hidden + projected


class DecodeStack(nn.Module):
    """Every layer's DecodeLayer in order, so a decode step crosses from Python into TorchScript once."""

    def __init__(self, layers: list[DecodeLayer]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, hidden: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor, keep: torch.Tensor | None,
                slots: list[torch.Tensor], keys: list[torch.Tensor], values: list[torch.Tensor], first: int,
                longest: int, lora_rows: list[torch.Tensor], lora: list[list[torch.Tensor]]) -> torch.Tensor:
        """DecodeLayer.forward through every layer; `slots` / `keys` / `values`: each layer's write positions
        (KVCache.decode_slots) and cache tensors, `lora`: each layer's LoRA weights (LoraRows.weights)."""
        for index, layer in enumerate(self.layers):
            hidden = layer(hidden, cos, signed_sin, keep, slots[index], keys[index], values[index], first, longest,
                           lora_rows, lora[index])
        return hidden


def script_decode_layers(runner) -> torch.jit.ScriptModule | None:
    """The runner's layers as one scripted DecodeStack, or None where any layer keeps the Python path."""
    if not runner.plain:  # a family's variants (worker/families/): the Python path runs them
        return None
    for layer, fused in zip(runner.layers, runner.fused):
        if fused.qkv is None or fused.gate_up is None or hasattr(layer.self_attn, "q_norm") or not (
                plain_rms_norm(layer.input_layernorm) and plain_rms_norm(layer.post_attention_layernorm)):
            return None
    try:
        with warnings.catch_warnings():  # torch.jit's deprecation notice (see the module docstring)
            warnings.simplefilter("ignore")
            return torch.jit.script(DecodeStack([DecodeLayer(layer, fused, runner.heads, runner.kv_heads,
                                                             runner.head_dim)
                                                 for layer, fused in zip(runner.layers, runner.fused)]))
    except (RuntimeError, TypeError, ValueError, OSError) as error:  # torch.jit's frontend errors
        log.warning("decode_layers_not_scripted", reason=str(error).strip().split("\n", 1)[0])
        return None
