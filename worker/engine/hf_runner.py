"""Any causal LM through transformers' own forward, inside the same continuous batcher (`ModelRunner`'s
interface as the engine uses it).

The lean runner (runner.py) serves the families it has a fast path for. Every other causal LM runs here:
the model's own `forward`, one call per prompt chunk and per group of decode rows, with a transformers
`Cache` whose layers read and write the engine's `KVCache` (slot = row). So rows start, finish, are copied
(`n`, beams), parked and restored from the prefix cache exactly as on the lean path, and every decoding
feature that acts on logits works unchanged. Positions, masks, rotary variants, ALiBi, sliding windows and
soft-capping are the model's own business: its forward sees what `generate()` shows it for one sequence (a
cache holding positions 0..start-1, an all-ones mask), so greedy output equals `generate()`'s.

Decode rows of unequal length share one forward, padded and masked, where the model takes per-row position
ids and has no sliding window; otherwise only rows side by side at the same length do (a request's `n`
candidates or beams). No native q4, no w8a8, no LoRA (the engine refuses those or falls back, see
runner_choice.py).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

import torch
from transformers.cache_utils import Cache, CacheLayerMixin, DynamicCache

from worker.engine.kv_cache import KVCache, widened
from worker.engine.runner import StepOutput, UnsupportedModel
from worker.threads import intra_op_threads

if TYPE_CHECKING:
    from transformers import PreTrainedModel

T = TypeVar("T")
_CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


class _SlotLayer(CacheLayerMixin):
    """One layer of a forward's cache: slots first..first+rows-1 of the engine's KVCache, holding `start`
    positions already; the forward's new keys and values go to start.. of each."""
    is_sliding = False  # every position is kept: the model's mask applies its window (kv offset 0)

    def __init__(self, cache: KVCache, index: int, first: int, rows: int, start: int,
                 positions: torch.Tensor | None = None):
        """`positions`: one decode token per row, row b written at positions[b] <= start (rows of unequal
        length in one forward, the shorter ones' padding masked by the caller)."""
        super().__init__()
        self.cache, self.index, self.first, self.rows, self.start = cache, index, first, rows, start
        self.positions = positions
        self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        pass

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        end = self.start + key_states.shape[-2]
        rows = slice(self.first, self.first + self.rows)
        keys, values = self.cache.keys[self.index], self.cache.values[self.index]
        if self.positions is None:
            keys[rows, :, self.start:end] = key_states  # copy_ converts to the cache's dtype
            values[rows, :, self.start:end] = value_states
        else:
            slots = torch.arange(self.first, self.first + self.rows, device=keys.device)
            keys[slots, :, self.positions] = key_states[:, :, 0].to(keys.dtype)
            values[slots, :, self.positions] = value_states[:, :, 0].to(values.dtype)
        return widened(keys[rows, :, :end], key_states.dtype), widened(values[rows, :, :end], value_states.dtype)

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.start + query_length, 0

    def get_seq_length(self) -> int:
        return self.start

    def get_max_length(self) -> int:
        return -1


class TransformersRunner:
    """The engine's runner over `model.forward` (see the module's docstring)."""

    native = None  # no native forward: the executor's per-row paths
    fused: list = []

    def __init__(self, model: torch.nn.Module, max_rows: int, max_context: int, decode_threads: int = 1,
                 kv_dtype: torch.dtype | None = None):
        self.model = model
        model = cast("PreTrainedModel", model)  # what loading.py loads: a transformers causal LM
        config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
        # an nn.Embedding or a subclass (its `embedding_dim` is read below)
        embeddings = cast(torch.nn.Embedding | None, model.get_input_embeddings())
        if embeddings is None or not hasattr(model, "forward"):
            raise UnsupportedModel(f"{type(model).__name__} has no input embeddings to decode from")
        self._embeddings = embeddings
        parameter = next((p for p in model.parameters() if not p.is_meta), None)
        if parameter is None:
            raise UnsupportedModel(f"{type(model).__name__} has no loaded weights")
        self.device = parameter.device
        self.dtype = embeddings.weight.dtype if embeddings.weight.is_floating_point() else parameter.dtype
        self.layers: list[torch.nn.Module] = []  # no LoRA here (engine.py refuses adapter requests)
        self.hidden_size = embeddings.embedding_dim
        limit = next((getattr(config, f) for f in _CONTEXT_FIELDS if isinstance(getattr(config, f, None), int)),
                     max_context)
        self.max_context = min(max_context, limit)
        parameters = inspect.signature(model.forward).parameters
        self._logits_to_keep = "logits_to_keep" in parameters
        self._positions = "position_ids" in parameters  # some (Bloom: ALiBi) take positions from the mask
        self._cache_arg = "cache" if "cache" in parameters else "past_key_values"  # transformers renamed it
        # rows of unequal length share a forward where the model takes each row's position and no window is
        # placed by the one query offset a forward has (a sliding window would sit at the longest row's)
        sliding = getattr(config, "sliding_window", None) is not None or \
            any("sliding" in str(kind) for kind in getattr(config, "layer_types", None) or [])
        self.pads_rows = self._positions and not sliding
        layers, kv_heads, head_dim, cache_dtype, self.vocab_size = self._probe()
        self.cache = KVCache(layers, kv_heads, head_dim, max_rows, self.max_context, kv_dtype or cache_dtype,
                             self.device)
        self.prefill_threads = torch.get_num_threads() * max(decode_threads, 1)
        self._hidden: list[torch.Tensor] = []
        self._want = False
        head = model.get_output_embeddings()
        if head is not None:  # its input is the last (post-norm) hidden state, whatever the family calls it
            head.register_forward_hook(lambda module, args, out: self._hidden.append(args[0]) if self._want else None)
        self._has_head = head is not None

    @torch.inference_mode()
    def _probe(self) -> tuple[int, int, int, torch.dtype, int]:
        """One token through the model with transformers' own cache: the shape of what each layer caches
        (the engine's KVCache holds one [kv_heads, positions, head_dim] per layer, the same for every layer)."""
        probe = DynamicCache()
        try:
            out = self.model(input_ids=torch.zeros((1, 1), dtype=torch.long, device=self.device),
                             use_cache=True, **{self._cache_arg: probe})
        except Exception as error:
            raise UnsupportedModel(f"{type(self.model).__name__}'s forward failed on one token: "
                                   f"{type(error).__name__}: {error}") from error
        logits = getattr(out, "logits", None)
        if logits is None:
            raise UnsupportedModel(f"{type(self.model).__name__} returns no logits: not a causal LM")
        layers = getattr(probe, "layers", [])
        shapes = {(tuple(layer.keys.shape), tuple(layer.values.shape))
                  for layer in layers if getattr(layer, "keys", None) is not None}
        if not layers or len(shapes) != 1 or any(getattr(layer, "keys", None) is None for layer in layers):
            raise UnsupportedModel(f"{type(self.model).__name__} caches no plain keys and values of one shape per "
                                   "layer (recurrent state, shared or mixed-shape layers)")
        (key_shape, value_shape), = shapes
        if key_shape != value_shape or len(key_shape) != 4:
            raise UnsupportedModel(f"{type(self.model).__name__}'s keys {list(key_shape)} and values "
                                   f"{list(value_shape)} differ in shape")
        return len(layers), key_shape[1], key_shape[3], layers[0].keys.dtype, logits.shape[-1]

    def embed(self, token_ids: torch.Tensor) -> torch.Tensor:
        return self._embeddings(token_ids.to(self.device))

    def _forward(self, first: int, rows: int, start: int, ids: torch.Tensor | None, embeds: torch.Tensor | None,
                 keep: int, want_hidden: bool, lengths: list[int] | None = None) -> StepOutput:
        """Slots first..first+rows-1, each holding `start` positions, run their next len(ids) tokens; the
        logits (and hidden states) of the last `keep` positions of each (0 = all), as [rows * kept, ...].
        `lengths`: a decode step of rows holding lengths[b] <= start positions each (start = the longest)."""
        given = ids if ids is not None else embeds
        assert given is not None  # every caller passes ids or embeds
        length = given.shape[1]
        self.cache.ensure(start + length, first + rows)
        written = None if lengths is None else torch.tensor(lengths, device=self.device)
        cache = Cache(layers=[_SlotLayer(self.cache, index, first, rows, start, written)
                              for index in range(self.cache.layers)])
        extra: dict[str, Any] = {self._cache_arg: cache}
        if self._logits_to_keep and keep:
            extra["logits_to_keep"] = keep
        mask = torch.ones((rows, start + length), dtype=torch.long, device=self.device)
        if written is not None:  # each row sees its own positions 0..lengths[b]; the rest is padding
            mask = (torch.arange(start + 1, device=self.device) <= written[:, None]).long()
            extra["position_ids"] = written[:, None]
        elif self._positions:
            extra["position_ids"] = torch.arange(start, start + length, device=self.device).expand(rows, -1)
        self._hidden.clear()
        self._want = want_hidden and self._has_head
        try:
            out = self.model(input_ids=ids, inputs_embeds=embeds, use_cache=True, attention_mask=mask, **extra)
        finally:
            self._want = False
        logits = out.logits if not keep else out.logits[:, -keep:]
        hidden = None
        if want_hidden:
            hidden = self._hidden[-1] if self._hidden else out.hidden_states[-1]
            hidden = hidden[:, -logits.shape[1]:].reshape(-1, hidden.shape[-1]).float()
        return StepOutput(logits.reshape(-1, logits.shape[-1]).float(), hidden)

    @torch.inference_mode()
    def prefill(self, slot: int, token_ids: list[int], start: int = 0, embeds: torch.Tensor | None = None,
                all_logits: bool = False, want_hidden: bool = False, adapter=None,
                threads: int | None = None) -> StepOutput:
        """Positions start..start+L-1 of the row in `slot`; logits of the last (or every) position."""
        if adapter is not None:
            raise UnsupportedModel("LoRA adapters need a model family with a fast path")
        ids = None if embeds is not None else torch.tensor([token_ids], device=self.device)
        inputs = None if embeds is None else embeds.to(self.device, self.dtype).unsqueeze(0)
        with intra_op_threads(threads or self.prefill_threads):
            return self._forward(slot, 1, start, ids, inputs, 0 if all_logits else 1, want_hidden)

    def decode(self, token_ids: list[int], lengths: list[int], want_hidden: bool = False,
               embeds_override: dict[int, torch.Tensor] | None = None, adapters=None) -> StepOutput:
        return StepOutput.concat(self.decode_groups(token_ids, lengths, want_hidden, embeds_override,
                                                    adapters=adapters))

    @torch.inference_mode()
    def decode_groups(self, token_ids: list[int], lengths: list[int], want_hidden: bool = False,
                      embeds_override: dict[int, torch.Tensor] | None = None,
                      then: Callable[[int, int, StepOutput], T] | None = None, adapters=None,
                      threads: int | None = None, first_slot: int = 0) -> list[T]:
        """One token for each of rows 0..B-1 (row b, in slot first_slot + b, writes position lengths[b]): one
        forward for all of them (`pads_rows`), else one per run of neighbouring rows of the same length;
        `then(first, end, output)` after each, in row order."""
        if adapters is not None and any(adapter is not None for adapter in adapters):
            raise UnsupportedModel("LoRA adapters need a model family with a fast path")
        self.cache.ensure(max(lengths) + 1, first_slot + len(token_ids))
        overrides = embeds_override or {}
        results: list[T] = []
        ids: torch.Tensor | None  # a group's tokens, None where embeddings replace them
        first = 0
        while first < len(token_ids):
            end = first + 1
            while end < len(token_ids) and (self.pads_rows or lengths[end] == lengths[first]):
                end += 1
            longest = max(lengths[first:end])
            ids = torch.tensor(token_ids[first:end], device=self.device).unsqueeze(1)
            embeds = None
            if any(first <= row < end for row in overrides):
                embeds = self.embed(ids)
                for row, vector in overrides.items():
                    if first <= row < end:
                        embeds[row - first, 0] = vector.to(self.device, self.dtype)
                ids = None
            padded = None if min(lengths[first:end]) == longest else lengths[first:end]
            out = self._forward(first_slot + first, end - first, longest, ids, embeds, 1, want_hidden, padded)
            results.append(cast(T, out) if then is None else then(first, end, out))  # no `then`: T is StepOutput
            first = end
        return results

    def scripted_layers(self) -> None:
        return None

    def defer_scripting(self) -> None:
        pass

    def script_now(self) -> None:
        pass
