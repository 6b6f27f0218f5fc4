"""One decoder layer as the runner runs it: its family's description (family.py) resolved against the
Hugging Face layer and config into modules and per-layer values (window, rotary table, scale, soft-cap)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

import torch
from torch import nn

from worker.engine.layers import FusedLayer, Norm, Projection, concat_weights, plain_linear
from worker.engine.moe import TopKExperts
from worker.families.family import Family, UnsupportedModel


@dataclass
class LayerPlan:
    attention: nn.Module
    mlp: nn.Module  # the MLP as the runner calls it whole (a TopKExperts for a mixture of experts)
    qkv_modules: list[nn.Module]  # the Hugging Face q/k/v projection(s), in the family's order
    out: nn.Module  # attention's output projection
    gate_up_modules: list[nn.Module]  # gate and up (or the fused one, or the ungated input projection); [] for experts
    down: nn.Module | None  # the MLP's output projection; None for experts
    input_norm: Norm | None
    attention_out_norm: Norm | None
    mlp_norm: Norm | None
    mlp_out_norm: Norm | None
    q_norm: Norm | None
    k_norm: Norm | None
    qk_norm: str | None  # "head" | "full" (family.py)
    parallel: bool
    window: int | None  # sliding window in positions, None: full attention (or a window the context never exceeds)
    rope: str | None  # the key of this layer's rotary table (a layer type), None: the one table
    scale: float | None  # attention's score scale, None: 1 / sqrt(head_dim)
    softcap: float | None
    moe: bool

    @property
    def projections(self) -> list[nn.Module]:
        """The Hugging Face projections the fused ones (FusedLayer) stand for: what a quantized path frees."""
        return [*self.qkv_modules, self.out, *self.gate_up_modules, *([self.down] if self.down is not None else [])]

    @property
    def plain(self) -> bool:
        """A Llama layer: what the scripted decode stack (decode_layer.py) and the native forward compute."""
        return (self.input_norm is not None and self.input_norm.kind == "rms" and self.mlp_norm is not None
                and self.mlp_norm.kind == "rms" and self.attention_out_norm is None and self.mlp_out_norm is None
                and self.qk_norm is None and not self.parallel and self.window is None and self.rope is None
                and self.softcap is None and not self.moe)


def _norm(family: Family, owner: nn.Module, name: str | None) -> Norm | None:
    if name is None:
        return None
    module = getattr(owner, name, None)
    if module is None:
        raise UnsupportedModel(f"{family.name}: the layer has no {name}")
    return Norm(family.norm, module)


def _window(family: Family, config, index: int, max_context: int) -> int | None:
    window = getattr(config, "sliding_window", None)
    if family.window is None or window is None:
        return None
    if family.window == "layer_types" and config.layer_types[index] != "sliding_attention":
        return None
    return int(window) if window < max_context else None  # a window no row can exceed changes nothing


def plan_layer(family: Family, config, layer: nn.Module, index: int, max_context: int) -> LayerPlan:
    attention, mlp = getattr(layer, family.attention), getattr(layer, family.mlp)
    moe = family.moe and hasattr(mlp, "experts")  # Qwen3-MoE may keep some layers dense
    if moe:
        normalised = True if family.moe_normalised is None else bool(getattr(config, family.moe_normalised))
        runs, gate_up, down = TopKExperts(mlp, config.num_experts_per_tok, normalised), [], None
    else:
        runs, down = mlp, getattr(mlp, family.down)
        gate_up = [getattr(mlp, name) for name in (family.gate_up or (family.up,))]
    q_norm = k_norm = None
    if family.qk_norm is not None:
        q_norm, k_norm = Norm(family.norm, attention.q_norm), Norm(family.norm, attention.k_norm)
    softcap = getattr(config, "attn_logit_softcapping", None) if family.softcap else None
    return LayerPlan(attention, runs, [getattr(attention, name) for name in family.qkv], getattr(attention, family.out),
                     gate_up, down,
                     _norm(family, layer, family.input_norm), _norm(family, layer, family.attention_out_norm),
                     _norm(family, layer, family.mlp_norm), _norm(family, layer, family.mlp_out_norm),
                     q_norm, k_norm, family.qk_norm,
                     bool(getattr(config, family.parallel_residual)) if family.parallel_residual else False,
                     _window(family, config, index, max_context),
                     config.layer_types[index] if family.rope_by_layer_type else None,
                     getattr(attention, "scaling", None), softcap, moe)


def _by_head(module: nn.Linear, heads: int) -> Projection:
    """A fused projection whose rows run q, k, v per head, reordered to [all q | all k | all v] (a copy)."""
    def order(t: torch.Tensor) -> torch.Tensor:
        return t.reshape(heads, 3, -1, *t.shape[1:]).transpose(0, 1).reshape(t.shape)

    return Projection(order(module.weight.detach()),
                      None if module.bias is None else order(module.bias.detach()))


def _plain(modules: list[nn.Module]) -> list[nn.Linear] | None:
    """The modules as the exact nn.Linear layers they are (plain_linear), else None."""
    return cast(list[nn.Linear], modules) if plain_linear(*modules) else None


def fuse_layer(family: Family, plan: LayerPlan, heads: int) -> FusedLayer:
    """The layer's projections as the runner calls them: q/k/v as one matmul and gate/up as one, where the
    modules are plain Linear layers (bitsandbytes and other subclasses keep their own forward)."""
    qkv = gate_up = None
    projections = plan.qkv_modules
    linears = _plain(projections)
    if len(projections) == 1 and linears is not None:
        only = linears[0]
        qkv = _by_head(only, heads) if family.qkv_by_head else Projection(only.weight, only.bias)
    elif not family.qkv_by_head:
        biases = [p.bias is not None for p in projections]
        if linears is not None and len(set(biases)) == 1:
            qkv = Projection(concat_weights(linears),
                             torch.cat([p.bias.data for p in linears]) if biases[0] else None)
    out = plan.out
    if plan.moe:
        return FusedLayer(qkv, None, out, None)
    mlp, members = plan.mlp, plan.gate_up_modules
    if not family.gated:
        if plain_linear(*members):
            return FusedLayer(qkv, members[0], out, plan.down, getattr(mlp, family.act), gated=False)
        return FusedLayer(qkv, None, out, None)
    plain_members = _plain(members)
    if plain_members is not None and all(m.bias is None for m in plain_members):
        gate_up = (Projection(plain_members[0].weight) if len(plain_members) == 1
                   else Projection(concat_weights(plain_members)))
    if gate_up is None:
        return FusedLayer(qkv, None, out, None)
    return FusedLayer(qkv, gate_up, out, plan.down, getattr(mlp, family.act))
