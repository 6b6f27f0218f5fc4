"""A lean forward pass over the decoder families of worker/families/ (Llama, Mistral, Qwen2/3, Gemma 2/3, Phi-3, OLMo 2,
GPT-NeoX, Mixtral, Qwen3-MoE) with our own KV cache; a model of another family raises UnsupportedModel.

It reuses the Hugging Face weights (bitsandbytes layers run through their own modules unchanged) and
replaces what costs time per step in the stock forward: cache objects, mask building, per-call
bookkeeping, three q/k/v and two gate/up matmuls where one does (plain Linear layers only), the
rotary cos/sin recomputed every step, and indexed KV writes. Decode attends over views of a
preallocated cache through SDPA. Every op keeps transformers' arithmetic, so greedy output matches
`generate()` (see README.md for the numbers).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from typing import TypeVar

import torch
import torch.nn.functional as F

from worker.engine.decode_layer import script_decode_layers
from worker.engine.helper_threads import HelperThreads
from worker.engine.kv_cache import KVCache, widened
from worker.engine.layer_plan import LayerPlan, fuse_layer, plan_layer
from worker.engine.layers import FusedLayer, Norm, capped_attention, decode_attention, rotate_partial
from worker.engine.native.bounds import check_tokens
from worker.families import family_of
from worker.families.family import UnsupportedModel
from worker.lora.adapter import LoraAdapter
from worker.lora.delta import NO_LORA, LoraRows, add_lora, lora_rows
from worker.threads import intra_op_threads

_DYNAMIC_ROPE = ("dynamic", "longrope")  # their inv_freq depends on the longest position seen
_HEAD_CHUNK = 2048  # vocabulary rows per slice of the output projection (bench: 1024-2048 best)
MIN_GROUP_ROWS = 4  # fewer rows per decode thread gain nothing (2 rows in two threads ran slower than in one)
_NOT_BUILT = object()
T = TypeVar("T")
__all__ = ["ModelRunner", "PromptChunk", "StepOutput", "UnsupportedModel"]


@dataclass
class StepOutput:
    logits: torch.Tensor  # [rows or positions, vocab] float32
    hidden: torch.Tensor | None  # last-layer (post-norm) hidden states, same leading shape

    @staticmethod
    def concat(parts: list[StepOutput]) -> StepOutput:
        """The outputs of consecutive row groups as one."""
        if len(parts) == 1:
            return parts[0]
        hidden = None if parts[0].hidden is None else torch.cat([p.hidden for p in parts])
        return StepOutput(torch.cat([p.logits for p in parts]), hidden)


@dataclass
class PromptChunk:
    """Positions start..start+len(token_ids)-1 of the prompt in `slot` (`embeds`: its input embeddings instead)."""
    slot: int
    token_ids: list[int]
    start: int
    embeds: torch.Tensor | None = None


class ModelRunner:
    def __init__(self, model: torch.nn.Module, max_rows: int, max_context: int, decode_threads: int = 1,
                 kv_dtype: torch.dtype | None = None):
        """`kv_dtype`: the KV cache's storage, if not the compute dtype (q4: native/model.py's KV_DTYPE)."""
        config = model.config
        self.family = family_of(model)
        family = self.family
        inner = getattr(model, family.decoder, None)
        missing = [name for name, owner in ((family.decoder, model), (family.head, model)) if owner is None or
                   not hasattr(owner, name)] + [name for name in ("layers", family.embed, family.final_norm,
                                                                  "rotary_emb") if not hasattr(inner, name)]
        if missing:
            raise UnsupportedModel(f"{family.name}: {type(model).__name__} has no {', '.join(missing)} "
                                   f"where the lean path reads it")
        if getattr(config, "use_bidirectional_attention", False):
            raise UnsupportedModel(f"{family.name}: bidirectional attention is not supported by the lean path")
        self.model = model
        self.layers = list(inner.layers)
        self.embed_tokens = getattr(inner, family.embed)
        self.final_norm = getattr(inner, family.final_norm)
        self.rotary = inner.rotary_emb
        self.lm_head = getattr(model, family.head)
        self.heads = config.num_attention_heads
        self.kv_heads = getattr(config, "num_key_value_heads", None) or self.heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.heads
        self.vocab_size = config.vocab_size
        self.hidden_size = config.hidden_size
        self.max_context = min(max_context, getattr(config, "max_position_embeddings", max_context))
        # q4 may leave the projections unread (meta): the device is where the loaded ones are
        parameter = next((p for p in model.parameters() if not p.is_meta), next(model.parameters()))
        self.device = parameter.device
        self.dtype = self.embed_tokens.weight.dtype  # compute dtype (bnb layers keep int weights)
        self.cache = KVCache(len(self.layers), self.kv_heads, self.head_dim, max_rows, self.max_context,
                             kv_dtype or self.dtype, self.device)
        self.plans: list[LayerPlan] = [plan_layer(family, config, layer, index, self.max_context)
                                       for index, layer in enumerate(self.layers)]
        self.fused: list[FusedLayer] = [fuse_layer(family, plan, self.heads) for plan in self.plans]
        self.norm = Norm(family.norm, self.final_norm)
        self.logit_softcap = getattr(config, "final_logit_softcapping", None) if family.softcap else None
        # the scripted decode stack and the native forward run Llama's layer only
        self.plain = self.logit_softcap is None and all(plan.plain for plan in self.plans)
        self._positions = torch.arange(self.max_context, device=self.device)
        plain_head = type(self.lm_head) is torch.nn.Linear and self.lm_head.bias is None
        self._head_chunks = self.lm_head.weight.split(_HEAD_CHUNK) if plain_head else None
        rope_types = getattr(self.rotary, "rope_type", "default")
        rope_types = set(rope_types.values()) if isinstance(rope_types, dict) else {rope_types}
        self._rope_tables = None if rope_types & set(_DYNAMIC_ROPE) else self._rotary_tables()
        probe = torch.zeros(1, 1, dtype=self.dtype, device=self.device)
        self.rotary_dim = next(iter(self._rope(probe, self._positions[:1].unsqueeze(0)).values()))[0].shape[-1]
        self.plain = self.plain and self.rotary_dim == self.head_dim
        self._helpers = HelperThreads(max(decode_threads, 1) - 1, name="sluice-decode")
        # each torch row group's team, set by each group itself: the engine's step runs its own torch work on one
        # thread under the native forward (executor.py `run`), adapter rows still decode in torch
        self.group_threads = torch.get_num_threads()
        self.prefill_threads = self.group_threads * max(decode_threads, 1)
        self._decode_layers = _NOT_BUILT
        self._no_lora: list[list[torch.Tensor]] = [[] for _ in self.layers]  # the stack's LoRA weights
        self.native = None  # a NativeForward (native/model.py, `quantization = "q4"`): rows without an adapter

    def _rotary_tables(self) -> dict[str | None, tuple[torch.Tensor, torch.Tensor]]:
        """cos and sign-folded sin of every position, from the model's own rotary module (one outer product per
        position, so a row of a table equals what the module computes for it): one table, or one per layer
        type whose rotary base differs (Gemma 3)."""
        probe = torch.zeros(1, dtype=self.dtype, device=self.device)
        keys = sorted({plan.rope for plan in self.plans}, key=str)
        return {key: _signed(*self._rotary(probe, self._positions.unsqueeze(0), key), squeeze=True) for key in keys}

    def _rotary(self, hidden: torch.Tensor, positions: torch.Tensor, key: str | None):
        return self.rotary(hidden, positions) if key is None else self.rotary(hidden, positions, key)

    def _rope(self, hidden: torch.Tensor, positions: torch.Tensor) -> dict:
        """Per rotary key: cos / signed sin for `positions` [B, L], shaped [B, L, 1, rotary_dim] to broadcast over
        heads. A dynamic table (longrope, dynamic NTK) is the module's for each row alone, as `generate()`
        computes it for that request."""
        if self._rope_tables is None:
            keys = {plan.rope for plan in self.plans}
            rows = [[_signed(*self._rotary(hidden, positions[row:row + 1], key)) for row in range(len(positions))]
                    for key in keys]
            return {key: tuple(torch.cat(parts).unsqueeze(2) for parts in zip(*row_parts))
                    for key, row_parts in zip(keys, rows)}
        return {key: (cos[positions].unsqueeze(2), sin[positions].unsqueeze(2))
                for key, (cos, sin) in self._rope_tables.items()}

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(token_ids.to(self.device))

    def prefill(self, slot: int, token_ids: list[int], start: int = 0, embeds: torch.Tensor | None = None,
                all_logits: bool = False, want_hidden: bool = False, adapter: LoraAdapter | None = None,
                threads: int | None = None) -> StepOutput:
        """Run positions start..start+L-1 of the row in `slot` (with a LoRA `adapter`); logits of the
        last (or every) position.

        The decode threads' cores are idle meanwhile, so prefill's large matmuls get them as torch
        threads (512 prompt tokens on two cores: 1.5 -> 1.05 s in w8a8, 1.8 -> 1.2 s in float32), unless
        `threads` says fewer (host_load.py: on a busy host the team collapses)."""
        if self.native is not None and adapter is None:  # any chunk length (bench/native_forward.py)
            return self._native_prefill(slot, token_ids, start, embeds, all_logits, want_hidden,
                                        threads or self.prefill_threads)
        with intra_op_threads(threads or self.prefill_threads):
            return self._prefill(slot, token_ids, start, embeds, all_logits, want_hidden,
                                 lora_rows([adapter], self.device))

    @torch.inference_mode()
    def _prefill(self, slot: int, token_ids: list[int], start: int, embeds: torch.Tensor | None,
                 all_logits: bool, want_hidden: bool, lora: LoraRows) -> StepOutput:
        length = len(token_ids)
        end = start + length
        self.cache.ensure(end, slot + 1)
        ids = torch.tensor([token_ids], device=self.device)
        hidden = self.embed(ids) if embeds is None else embeds.to(self.device, self.dtype).unsqueeze(0)
        positions = self._positions[start:end].unsqueeze(0)
        rope = self._rope(hidden, positions)
        keep = (self._positions[:end].unsqueeze(0) <= positions[0].unsqueeze(1)).view(1, 1, length, end)
        masks = _Masks(keep, self._positions[:end].view(1, 1, 1, end), positions[0].view(1, 1, length, 1))
        for index in range(len(self.layers)):
            keys, values = self.cache.keys[index], self.cache.values[index]

            def write(k, v, keys=keys, values=values):  # k, v: [1, L, kv_heads, head_dim] (copy_ converts)
                keys[slot, :, start:end] = k[0].transpose(0, 1)
                values[slot, :, start:end] = v[0].transpose(0, 1)

            hidden = self._layer(index, hidden, rope, masks, write,
                                 keys[slot:slot + 1, :, :end], values[slot:slot + 1, :, :end],
                                 lora.rows, lora.weights(index))
        hidden = self.norm(hidden)[0]
        if not all_logits:
            hidden = hidden[-1:]
        logits = self._capped(self.lm_head(hidden)).float()
        return StepOutput(logits, hidden.float() if want_hidden else None)

    @torch.inference_mode()
    def _native_prefill(self, slot: int, token_ids: list[int], start: int, embeds: torch.Tensor | None,
                        all_logits: bool, want_hidden: bool, threads: int) -> StepOutput:
        """`_prefill` through the native forward: the chunk's positions in one call."""
        length = len(token_ids)
        if embeds is None:  # the packed embedding would wrap a negative id (native/bounds.py)
            check_tokens(token_ids, self.vocab_size)
        self.cache.ensure(start + length, slot + 1)
        hidden = self.embed(torch.tensor(token_ids)) if embeds is None else embeds.to(self.device, self.dtype)
        out_rows = list(range(length)) if all_logits else [length - 1]
        logits, normed = self.native.run(hidden.float().clone(), [slot] * length, list(range(start, start + length)),
                                         self.cache.keys, self.cache.values, out_rows, want_hidden=want_hidden,
                                         threads=threads)
        return StepOutput(logits, normed)

    @torch.inference_mode()
    def prefill_together(self, chunks: list[PromptChunk], threads: int | None = None) -> None:
        """Several prompts' chunks, each in its own slot, in one native forward: every weight is read once for
        all of them, not once per prompt (a burst of short or mostly cached prompts). Writes their keys and
        values only: no logits (a prompt's last token is its first decode step's input). A token's bits are
        those of its own prefill (forward.c is batch-invariant)."""
        for chunk in chunks:
            if chunk.embeds is None:
                check_tokens(chunk.token_ids, self.vocab_size)
        for chunk in chunks:
            self.cache.ensure(chunk.start + len(chunk.token_ids), chunk.slot + 1)
        hidden = torch.cat([self.embed(torch.tensor(c.token_ids)) if c.embeds is None
                            else c.embeds.to(self.device, self.dtype) for c in chunks]).float()
        slots = [c.slot for c in chunks for _ in c.token_ids]
        positions = [p for c in chunks for p in range(c.start, c.start + len(c.token_ids))]
        self.native.run(hidden, slots, positions, self.cache.keys, self.cache.values, [], want_logits=False,
                        threads=threads or self.prefill_threads)

    @torch.inference_mode()
    def _native_decode(self, token_ids: list[int], lengths: list[int], want_hidden: bool,
                       overrides: dict[int, torch.Tensor], threads: int | None, first_slot: int = 0) -> StepOutput:
        """`_decode_rows` of every row (slots first_slot..first_slot+B-1) through the native forward: one call,
        its own threads."""
        check_tokens([t for row, t in enumerate(token_ids) if row not in overrides], self.vocab_size)
        hidden = self.embed(torch.tensor(token_ids)).float().clone()
        for row, vector in overrides.items():
            hidden[row] = vector.to(self.device, torch.float32)
        rows = list(range(len(token_ids)))
        logits, normed = self.native.run(hidden, [first_slot + row for row in rows], lengths, self.cache.keys,
                                         self.cache.values, rows, want_hidden=want_hidden, threads=threads)
        return StepOutput(logits, normed)

    @torch.inference_mode()
    def decode_with_drafts(self, token_ids: list[int], lengths: list[int], drafts: dict[int, list[int]],
                           want_hidden: bool, overrides: dict[int, torch.Tensor],
                           threads: int | None) -> tuple[StepOutput, dict[int, torch.Tensor]]:
        """`_native_decode` where some rows carry draft tokens (speculation.py): row b feeds token_ids[b] at
        lengths[b], then drafts[b] at the positions after it, every token of every row in one native call. Each
        position's logits are those a step of it alone gives (forward.c is batch-invariant). Returns the rows'
        output at their first position, and each drafting row's logits at its draft positions."""
        fed, slots, positions, firsts = [], [], [], []
        for row, (token, length) in enumerate(zip(token_ids, lengths)):
            chain = [token, *drafts.get(row, ())]
            firsts.append(len(fed))
            fed += chain
            slots += [row] * len(chain)
            positions += range(length, length + len(chain))
        self.cache.ensure(max(positions) + 1, len(token_ids))
        replaced = {firsts[row] for row in overrides}
        check_tokens([t for index, t in enumerate(fed) if index not in replaced], self.vocab_size)
        hidden = self.embed(torch.tensor(fed)).float().clone()
        for row, vector in overrides.items():
            hidden[firsts[row]] = vector.to(self.device, torch.float32)
        logits, normed = self.native.run(hidden, slots, positions, self.cache.keys, self.cache.values,
                                         list(range(len(fed))), want_hidden=want_hidden, threads=threads)
        first = torch.tensor(firsts)
        out = StepOutput(logits[first], None if normed is None else normed[first])
        return out, {row: logits[firsts[row] + 1:firsts[row] + 1 + len(draft)] for row, draft in drafts.items()}

    def decode(self, token_ids: list[int], lengths: list[int], want_hidden: bool = False,
               embeds_override: dict[int, torch.Tensor] | None = None,
               adapters: list[LoraAdapter | None] | None = None) -> StepOutput:
        """One token for each of rows 0..B-1; row b writes position lengths[b] and attends to 0..lengths[b].

        `embeds_override` feeds a given input embedding instead of the token's for some rows;
        `adapters` names each row's LoRA adapter (None = the base model)."""
        return StepOutput.concat(self.decode_groups(token_ids, lengths, want_hidden, embeds_override,
                                                    adapters=adapters))

    def decode_groups(self, token_ids: list[int], lengths: list[int], want_hidden: bool = False,
                      embeds_override: dict[int, torch.Tensor] | None = None,
                      then: Callable[[int, int, StepOutput], T] | None = None,
                      adapters: list[LoraAdapter | None] | None = None, threads: int | None = None,
                      first_slot: int = 0) -> list[T]:
        """`decode`, by row group: with `decode_threads` > 1 and enough rows, contiguous groups of rows
        run their whole forward in parallel threads (decode_layer.py says why that needs the scripted
        layers). `then(first, end, output)` runs in the group's thread right after its forward (the
        engine chooses the group's tokens there); its results, or the groups' outputs, in row order.
        With `native` set and no row adapted, one native call (one group) runs every row on `threads`
        threads (None: the native forward's own count). The rows sit in slots from `first_slot` on (a step
        of some rows only: executor.py)."""
        self.cache.ensure(max(lengths) + 1, first_slot + len(token_ids))
        overrides = embeds_override or {}
        if self.native is not None and (adapters is None or all(adapter is None for adapter in adapters)):
            out = self._native_decode(token_ids, lengths, want_hidden, overrides, threads, first_slot)
            return [out if then is None else then(0, len(token_ids), out)]

        def group(first: int, end: int):
            lora = NO_LORA if adapters is None else lora_rows(adapters[first:end], self.device)
            with intra_op_threads(self.group_threads):
                out = self._decode_rows(first_slot + first, token_ids[first:end], lengths[first:end], want_hidden,
                                        {row - first: vector for row, vector in overrides.items()
                                         if first <= row < end}, lora)
                return out if then is None else then(first, end, out)

        return self._helpers.run([partial(group, first, end) for first, end in self._row_groups(len(token_ids))])

    def _row_groups(self, rows: int) -> list[tuple[int, int]]:
        """Contiguous [first, end) row ranges, one per thread, each of at least MIN_GROUP_ROWS rows."""
        count = max(1, min(self._helpers.count + 1, rows // MIN_GROUP_ROWS)) \
            if self.scripted_layers() is not None else 1
        return list(pairwise(rows * group // count for group in range(count + 1)))

    @torch.inference_mode()  # per thread: the helpers run this too
    def _decode_rows(self, first: int, token_ids: list[int], lengths: list[int], want_hidden: bool,
                     overrides: dict[int, torch.Tensor], lora: LoraRows = NO_LORA) -> StepOutput:
        """The forward of slots first..first+B-1 (rows of the batch at those slots)."""
        rows = len(token_ids)
        longest = max(lengths) + 1
        ids = torch.tensor(token_ids, device=self.device).unsqueeze(1)
        positions = torch.tensor(lengths, device=self.device).unsqueeze(1)
        hidden = self.embed(ids)
        for row, vector in overrides.items():
            hidden[row, 0] = vector.to(self.device, self.dtype)
        rope = self._rope(hidden, positions)
        # one row attends to all it has; rows of unequal length mask the padding of the shorter ones
        mask = None if min(lengths) == longest - 1 else \
            (self._positions[:longest].unsqueeze(0) <= positions).view(rows, 1, 1, longest)
        slots = self.cache.decode_slots(first, rows, positions[:, 0])
        stack = self.scripted_layers()
        if stack is not None:  # every layer in one call, the GIL released
            weights = [lora.weights(index) for index in range(len(self.layers))] if lora.rows else self._no_lora
            with torch.jit.optimized_execution(False):  # the graph as compiled: decode_layer.py says why
                hidden = stack(hidden, *rope[None], mask, slots, self.cache.keys, self.cache.values, first, longest,
                               lora.rows, weights)
        else:
            masks = _Masks(mask, self._positions[:longest].view(1, 1, 1, longest), positions.view(rows, 1, 1, 1))
            for index in range(len(self.layers)):
                keys, values = self.cache.keys[index], self.cache.values[index]

                def write(k, v, keys=keys, values=values, slots=slots[index]):  # k, v: [B, 1, kv_heads, head_dim]
                    self.cache.write_decode(keys, values, slots, k, v)

                hidden = self._layer(index, hidden, rope, masks, write,
                                     keys[first:first + rows, :, :longest], values[first:first + rows, :, :longest],
                                     lora.rows, lora.weights(index))
        hidden = self.norm(hidden)[:, 0]
        logits = self._capped(self._head(hidden)).float()
        return StepOutput(logits, hidden.float() if want_hidden else None)

    def scripted_layers(self) -> torch.jit.ScriptModule | None:
        """The layers' decode step compiled as one stack (decode_layer.py; ~0.7 s for SmolLM2's 30 layers),
        built on first use, or by `script_now`; None = the Python path."""
        if self._decode_layers is _NOT_BUILT:
            self._decode_layers = script_decode_layers(self)
        return self._decode_layers

    def defer_scripting(self) -> None:
        """Decode on the Python path until `script_now`: it computes bitwise the same logits
        (tests/worker/engine/test_row_groups.py), in one row group."""
        self._decode_layers = None

    def script_now(self) -> None:
        """Compile the scripted layers in the caller's thread while no decode step runs: a compile beside
        running steps holds the GIL between each of their torch calls (a step took seconds meanwhile)."""
        self._decode_layers = _NOT_BUILT
        self.scripted_layers()

    def projections_changed(self) -> None:
        """Called after a projection was swapped (w8a8.py): the scripted layers are built again."""
        self._decode_layers = _NOT_BUILT

    def set_head(self, projection) -> None:
        """Replace the vocabulary projection (w8a8.py); it is then called as one piece."""
        self.lm_head, self._head_chunks = projection, None
        self.projections_changed()

    def _head(self, hidden: torch.Tensor) -> torch.Tensor:
        """The vocabulary projection of decode rows. Its weight (vocab x hidden) is the largest matrix;
        at 4+ rows, slices of it that stay in cache run ~20% faster than one GEMM, with identical
        results (each logit is still one dot product over the hidden size)."""
        if self._head_chunks is None or hidden.shape[0] < 4:
            return self.lm_head(hidden)
        logits = torch.empty(hidden.shape[0], self.lm_head.weight.shape[0], dtype=hidden.dtype, device=hidden.device)
        for index, chunk in enumerate(self._head_chunks):
            torch.mm(hidden, chunk.t(), out=logits[:, index * _HEAD_CHUNK:index * _HEAD_CHUNK + chunk.shape[0]])
        return logits

    def _capped(self, logits: torch.Tensor) -> torch.Tensor:
        """Gemma 2's final soft-capping: cap * tanh(logits / cap)."""
        cap = self.logit_softcap
        return logits if cap is None else torch.tanh(logits / cap) * cap

    def _layer(self, index: int, hidden, rope: dict, masks: _Masks, write, keys, values,
               lora_rows: list[torch.Tensor], lora: list[torch.Tensor]) -> torch.Tensor:
        """One decoder layer as its plan says; `lora_rows` / `lora`: the LoRA segments of the rows (delta.py)."""
        plan, fused = self.plans[index], self.fused[index]
        batch, length, _ = hidden.shape
        heads, kv_heads, head_dim = self.heads, self.kv_heads, self.head_dim
        normed = hidden if plan.input_norm is None else plan.input_norm(hidden)
        if fused.qkv is not None:
            qkv = fused.qkv(normed)
        else:
            qkv = torch.cat([projection(normed) for projection in plan.qkv_modules], dim=-1)
        _add_lora(normed, qkv, lora_rows, lora, 0)
        if plan.qk_norm == "full":  # OLMo 2: over all of q and all of k, before the heads are split
            query, key, value = qkv.split([heads * head_dim, kv_heads * head_dim, kv_heads * head_dim], dim=-1)
            qkv = torch.cat([plan.q_norm(query), plan.k_norm(key), value], dim=-1)
        qkv = qkv.view(batch, length, heads + 2 * kv_heads, head_dim)
        query_key, value = qkv[:, :, : heads + kv_heads], qkv[:, :, heads + kv_heads:]
        if plan.qk_norm == "head":  # Qwen3, Gemma 3: per head, before the rotation
            query_key = torch.cat([plan.q_norm(query_key[:, :, :heads]), plan.k_norm(query_key[:, :, heads:])], dim=2)
        query_key = rotate_partial(query_key, *rope[plan.rope])  # q and k together: [B, L, heads + kv_heads, D]
        write(query_key[:, :, heads:], value)
        keys, values = widened(keys, hidden.dtype), widened(values, hidden.dtype)  # read after the write
        mask, scale = masks.get(plan.window), plan.scale
        if plan.softcap is not None:
            out = capped_attention(query_key[:, :, :heads], keys, values, mask, scale or head_dim ** -0.5, plan.softcap)
        elif length == 1 and batch > 1:
            out = decode_attention(query_key[:, :, :heads], keys, values, mask, scale or head_dim ** -0.5)
        else:
            query = query_key[:, :, :heads].transpose(1, 2)
            out = F.scaled_dot_product_attention(query, keys, values, attn_mask=mask, enable_gqa=True, scale=scale)
            out = out.transpose(1, 2).reshape(batch, length, heads * head_dim)
        projected = fused.o_proj(out)
        _add_lora(out, projected, lora_rows, lora, 1)
        if plan.attention_out_norm is not None:
            projected = plan.attention_out_norm(projected)
        if plan.parallel:  # GPT-NeoX: the MLP reads the layer's input, not attention's output
            return (self._mlp(plan, fused, hidden, lora_rows, lora) + projected) + hidden
        hidden = hidden + projected
        return hidden + self._mlp(plan, fused, hidden, lora_rows, lora)

    def _mlp(self, plan: LayerPlan, fused: FusedLayer, hidden: torch.Tensor, lora_rows: list[torch.Tensor],
             lora: list[torch.Tensor]) -> torch.Tensor:
        """The layer's MLP of `hidden` (normed before and after as its plan says), to add to the residual."""
        normed = hidden if plan.mlp_norm is None else plan.mlp_norm(hidden)
        if fused.gate_up is not None:
            gate_up, act, down_proj = fused.gate_up(normed), fused.act, fused.down_proj
        elif lora_rows and len(plan.gate_up_modules) == 2:  # bitsandbytes: one by one, so the adapter reaches each
            gate_up, act, down_proj = torch.cat([m(normed) for m in plan.gate_up_modules], dim=-1), \
                plan.mlp.act_fn, plan.mlp.down_proj
        else:
            out = plan.mlp(normed)
            return out if plan.mlp_out_norm is None else plan.mlp_out_norm(out)
        _add_lora(normed, gate_up, lora_rows, lora, 2)
        if fused.gated:
            gate, up = gate_up.chunk(2, dim=-1)
            inner = act(gate) * up
        else:
            inner = act(gate_up)
        out = down_proj(inner)
        _add_lora(inner, out, lora_rows, lora, 3)
        return out if plan.mlp_out_norm is None else plan.mlp_out_norm(out)


class _Masks:
    """The attention masks of one forward, per sliding window (None: causal only), built when first asked.
    `keep`: the causal mask (None: nothing to mask); `key_positions` / `query_positions` broadcast against it."""

    def __init__(self, keep: torch.Tensor | None, key_positions: torch.Tensor, query_positions: torch.Tensor):
        self._masks = {None: keep}
        self._keys, self._queries = key_positions, query_positions

    def get(self, window: int | None) -> torch.Tensor | None:
        if window not in self._masks:
            inside = self._keys > self._queries - window  # transformers' sliding_window_overlay
            causal = self._masks[None]
            self._masks[window] = inside if causal is None else causal & inside
        return self._masks[window]


def _signed(cos: torch.Tensor, sin: torch.Tensor, squeeze: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """A rotary module's cos / sin with rotate_half's sign folded into sin (layers.py `rotate`)."""
    half = cos.shape[-1] // 2
    sin = torch.cat([-sin[..., :half], sin[..., half:]], dim=-1)
    return (cos[0].contiguous(), sin[0].contiguous()) if squeeze else (cos, sin)


def _add_lora(x: torch.Tensor, out: torch.Tensor, rows: list[torch.Tensor], weights: list[torch.Tensor],
              group: int) -> None:
    """delta.add_lora on the flattened rows of a projection's input and output (any leading shape)."""
    if rows:
        add_lora(x.reshape(-1, x.shape[-1]), out.view(-1, out.shape[-1]), rows, weights, group)
