"""A top-k mixture-of-experts MLP (Mixtral, Qwen3-MoE) over the Hugging Face block's own tensors: the
router's softmax in float32, the k largest, optionally renormalised to sum to one, then each expert hit by
some token runs its gated MLP on those tokens and adds its weighted output. The same arithmetic, in the
same expert order, as transformers' eager experts, so greedy output matches `generate()`."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn


class TopKExperts(nn.Module):
    # declared: nn.Module's __getattr__ would type each of these as a Tensor or a Module
    router: torch.Tensor
    gate_up: torch.Tensor
    down: torch.Tensor
    act: Callable[[torch.Tensor], torch.Tensor]

    def __init__(self, block: Any, top_k: int, normalised: bool):  # a transformers MoE block (its own names)
        super().__init__()
        self.router = block.gate.weight  # [experts, hidden]
        self.gate_up = block.experts.gate_up_proj  # [experts, 2 x inner, hidden]
        self.down = block.experts.down_proj  # [experts, hidden, inner]
        self.act = block.experts.act_fn
        self.top_k, self.normalised = top_k, normalised

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        shape = hidden.shape
        flat = hidden.reshape(-1, shape[-1])
        probabilities = F.linear(flat, self.router).softmax(dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probabilities, self.top_k, dim=-1)  # [tokens, k]
        if self.normalised:
            weights = weights / weights.sum(dim=-1, keepdim=True)
        weights = weights.to(flat.dtype)
        out = torch.zeros_like(flat)
        for expert in torch.unique(chosen).tolist():  # ascending, as transformers visits them
            token, slot = torch.where(chosen == expert)
            gate, up = F.linear(flat[token], self.gate_up[expert]).chunk(2, dim=-1)
            expert_out = F.linear(self.act(gate) * up, self.down[expert]) * weights[token, slot, None]
            out.index_add_(0, token, expert_out)
        return out.view(shape)
