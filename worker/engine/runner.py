"""A lean forward pass over Llama-family decoders (Llama, Mistral, Qwen2, SmolLM) with our own KV cache.

It reuses the Hugging Face modules for every weight-bearing op (so bitsandbytes layers work unchanged)
and replaces only what costs time per step in the stock forward: cache objects, mask building and
per-call bookkeeping. Decode attends over views of a preallocated cache through SDPA.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

from worker.engine.kv_cache import KVCache


class UnsupportedModel(RuntimeError):
    pass


@dataclass
class StepOutput:
    logits: torch.Tensor  # [rows or positions, vocab] float32
    hidden: torch.Tensor | None  # last-layer (post-norm) hidden states, same leading shape


class ModelRunner:
    def __init__(self, model: torch.nn.Module, max_rows: int, max_context: int):
        config = model.config
        inner = getattr(model, "model", None)
        if inner is None or not hasattr(inner, "layers") or not hasattr(inner, "rotary_emb"):
            raise UnsupportedModel(f"architecture {type(model).__name__} is not a Llama-family decoder")
        self.model = model
        self.layers = list(inner.layers)
        self.embed_tokens = inner.embed_tokens
        self.final_norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        self.heads = config.num_attention_heads
        self.kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.max_context = min(max_context, getattr(config, "max_position_embeddings", max_context))
        parameter = next(model.parameters())
        self.device = parameter.device
        self.dtype = self.embed_tokens.weight.dtype  # compute dtype (bnb layers keep int weights)
        self.cache = KVCache(len(self.layers), self.kv_heads, self.head_dim, max_rows, self.max_context,
                             self.dtype, self.device)

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids)

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int], start: int = 0, embeds: torch.Tensor | None = None,
                all_logits: bool = False, want_hidden: bool = False) -> StepOutput:
        """Run positions start..start+L-1 of the row in `slot`; logits of the last (or every) position."""
        length = len(token_ids)
        end = start + length
        self.cache.ensure(end)
        ids = torch.tensor([token_ids], device=self.device)
        hidden = self.embed(ids) if embeds is None else embeds.to(self.device, self.dtype).unsqueeze(0)
        positions = torch.arange(start, end, device=self.device).unsqueeze(0)
        cos, sin = self.rotary(hidden, positions)
        keys_at = torch.arange(end, device=self.device)
        mask = (keys_at.unsqueeze(0) <= positions[0].unsqueeze(1)).view(1, 1, length, end)
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, cos, sin, mask,
                                 write=lambda k, v, i=index: self._write_prefill(i, slot, start, end, k, v),
                                 read=lambda i=index: self._read(i, slice(slot, slot + 1), end))
        hidden = self.final_norm(hidden)[0]
        if not all_logits:
            hidden = hidden[-1:]
        logits = self.lm_head(hidden).float()
        return StepOutput(logits, hidden.float() if want_hidden else None)

    @torch.inference_mode()
    def decode(self, token_ids: list[int], lengths: list[int], want_hidden: bool = False,
               embeds_override: dict[int, torch.Tensor] | None = None) -> StepOutput:
        """One token for each of rows 0..B-1; row b writes position lengths[b] and attends to 0..lengths[b].

        `embeds_override` feeds a given input embedding instead of the token's for some rows."""
        rows = len(token_ids)
        longest = max(lengths) + 1
        self.cache.ensure(longest)
        ids = torch.tensor(token_ids, device=self.device).unsqueeze(1)
        positions = torch.tensor(lengths, device=self.device).unsqueeze(1)
        hidden = self.embed(ids)
        for row, vector in (embeds_override or {}).items():
            hidden[row, 0] = vector.to(self.device, self.dtype)
        cos, sin = self.rotary(hidden, positions)
        mask = (torch.arange(longest, device=self.device).unsqueeze(0) <= positions).view(rows, 1, 1, longest)
        row_index = torch.arange(rows, device=self.device)
        position_index = positions[:, 0]
        for index, layer in enumerate(self.layers):
            hidden = self._layer(index, layer, hidden, cos, sin, mask,
                                 write=lambda k, v, i=index: self._write_decode(i, row_index, position_index, k, v),
                                 read=lambda i=index: self._read(i, slice(0, rows), longest))
        hidden = self.final_norm(hidden)[:, 0]
        logits = self.lm_head(hidden).float()
        return StepOutput(logits, hidden.float() if want_hidden else None)

    def _layer(self, index, layer, hidden, cos, sin, mask, write, read) -> torch.Tensor:
        attention = layer.self_attn
        batch, length, _ = hidden.shape
        normed = layer.input_layernorm(hidden)
        query = attention.q_proj(normed).view(batch, length, self.heads, self.head_dim).transpose(1, 2)
        key = attention.k_proj(normed).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        value = attention.v_proj(normed).view(batch, length, self.kv_heads, self.head_dim).transpose(1, 2)
        if hasattr(attention, "q_norm"):  # Qwen3-style per-head norms
            query, key = attention.q_norm(query), attention.k_norm(key)
        query, key = apply_rotary_pos_emb(query, key, cos, sin)
        write(key, value)
        keys, values = read()
        out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True,
                                             scale=getattr(attention, "scaling", None))
        out = out.transpose(1, 2).reshape(batch, length, self.heads * self.head_dim)
        hidden = hidden + attention.o_proj(out)
        return hidden + layer.mlp(layer.post_attention_layernorm(hidden))

    def _write_prefill(self, layer: int, slot: int, start: int, end: int, key, value) -> None:
        self.cache.keys[layer][slot, :, start:end] = key[0]
        self.cache.values[layer][slot, :, start:end] = value[0]

    def _write_decode(self, layer: int, rows: torch.Tensor, positions: torch.Tensor, key, value) -> None:
        self.cache.keys[layer][rows, :, positions] = key[:, :, 0]
        self.cache.values[layer][rows, :, positions] = value[:, :, 0]

    def _read(self, layer: int, rows: slice, length: int):
        return self.cache.keys[layer][rows, :, :length], self.cache.values[layer][rows, :, :length]
