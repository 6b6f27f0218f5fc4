"""Prefix caching: the KV of prompt prefixes kept for later requests, in blocks keyed by their token ids.

A prompt's KV depends only on its token ids, the model and the LoRA adapter its rows run with. Once a
prompt is prefilled, its full blocks of BLOCK tokens are copied out of its cache slot; a later prompt that
begins with the same blocks (a system prompt, a tool list, a few-shot block, a chat's earlier turns) gets
them copied into its slot and prefills only the rest. Blocks form chains: a block's key is its parent and
its own tokens, compared as exact tuples (no hash that could collide and hand one prompt another's KV),
and every chain starts at the root of a partition.

Partitions are (tenant, adapter):
- tenant (`GenerateRequest.tenant`, the billed team): a team's cached prefix never shortens another team's
  prefill, so no team can learn from timings or from `cached_tokens` which prompts another team sent. Teams
  share only the memory budget: one team's traffic may evict another's blocks, which tells about load, never
  about content. The price: a prefix common to every team (the chat template's default system prompt) is
  cached once per team.
- adapter: an adapted request's KV differs from the base model's. A partition remembers the adapter object
  it was filled with; an adapter loaded again (its files read anew) starts a fresh partition.

Not read from the cache: prompts given as embeddings (their KV does not follow from ids) and requests for
prompt logprobs (they need every prompt position's logits); the second kind still fills it. Memory is
`ModelConfig.prefix_cache_bytes` (0: off); the least recently used blocks go first, a chain's tail before
its head, and a block with children stays until they are gone.
"""

from __future__ import annotations

import itertools
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field

import torch

from common.protocol import PrefixCacheStats
from worker.engine.kv_cache import KVCache
from worker.engine.sequence import RequestState

BLOCK = 16  # tokens per block: a prompt reuses its longest cached prefix of whole blocks


@dataclass(eq=False)
class _Root:
    """The start of a partition's chains."""
    key: tuple
    id: int
    adapter: weakref.ref | None  # the adapter object the partition's KV was computed with
    children: int = 0


@dataclass(eq=False)
class Block:
    key: tuple  # (parent's id, this block's token ids)
    id: int
    parent: Block | _Root
    kv: torch.Tensor  # [layers, 2 (keys, values), kv_heads, BLOCK, head_dim], as KVCache.copy_out gives
    children: int = 0


@dataclass
class PrefixHit:
    """The cached blocks a prompt starts with, to be copied into its slot."""
    blocks: list[Block] = field(default_factory=list)

    @property
    def tokens(self) -> int:
        return len(self.blocks) * BLOCK


class PrefixCache:
    """Owned by the engine thread: the scheduler looks prompts up, the executor restores and stores them."""

    def __init__(self, cache: KVCache, capacity_bytes: int):
        self.cache = cache
        self.block_bytes = cache.bytes_per_token() * BLOCK
        self.max_blocks = capacity_bytes // self.block_bytes
        self._blocks: OrderedDict[int, Block] = OrderedDict()  # least recently used first
        self._index: dict[tuple, Block] = {}
        self._roots: dict[tuple, _Root] = {}
        self._ids = itertools.count(1)
        self.lookups = self.hits = self.tokens_reused = self.evicted = 0

    @property
    def enabled(self) -> bool:
        return self.max_blocks > 0

    def stats(self) -> PrefixCacheStats:
        return PrefixCacheStats(enabled=self.enabled, lookups=self.lookups, hits=self.hits,
                                tokens_reused=self.tokens_reused, blocks=len(self._blocks),
                                bytes=len(self._blocks) * self.block_bytes,
                                capacity_bytes=self.max_blocks * self.block_bytes, evicted_blocks=self.evicted)

    def lookup(self, state: RequestState) -> PrefixHit | None:
        """The longest cached prefix of whole blocks that leaves the prompt's last token to the first decode
        step (that token is never prefilled), or None."""
        if not self.enabled or not _readable(state):
            return None
        self.lookups += 1
        ids = state.prepared.prompt_ids
        parent = self._root(state, create=False)
        chain: list[Block] = []
        while parent is not None and (len(chain) + 1) * BLOCK <= len(ids) - 1:
            start = len(chain) * BLOCK
            parent = self._index.get((parent.id, tuple(ids[start:start + BLOCK])))
            if parent is not None:
                chain.append(parent)
        if not chain:
            return None
        self._touch(chain)
        self.hits += 1
        self.tokens_reused += len(chain) * BLOCK
        return PrefixHit(chain)

    def restore(self, hit: PrefixHit, slot: int) -> None:
        """Copy the hit's blocks into positions 0..hit.tokens-1 of `slot`."""
        # one concatenation, then one copy per layer and tensor: ~60 copies, not one per block and layer
        self.cache.copy_in(slot, torch.cat([block.kv for block in hit.blocks], dim=3) if len(hit.blocks) > 1
                           else hit.blocks[0].kv)

    def store(self, state: RequestState, slot: int) -> None:
        """Keep the whole blocks of the prompt prefilled in `slot` (positions 0..state.prefilled-1), those
        not cached yet copied out, as far as the budget allows."""
        if not self.enabled or state.prepared.prompt_embeds is not None or state.prefilled < BLOCK:
            return
        ids = state.prepared.prompt_ids
        root = self._root(state, create=True)
        parent: Block | _Root = root
        chain: list[Block] = []
        starts = range(0, state.prefilled - BLOCK + 1, BLOCK)
        for start in starts:  # the blocks cached already; the first one missing has no cached descendants
            block = self._index.get((parent.id, tuple(ids[start:start + BLOCK])))
            if block is None:
                break
            chain.append(block)
            parent = block
        first = len(chain) * BLOCK
        new = 0
        while new < len(starts) - len(chain) and self._make_room(root, chain[-1:], pending=new):
            new += 1
        for number, kv in enumerate(self._copy_out(slot, first, new)):
            start = first + number * BLOCK
            key = (parent.id, tuple(ids[start:start + BLOCK]))
            block = Block(key, next(self._ids), parent, kv)
            parent.children += 1
            self._index[key] = block
            self._blocks[block.id] = block
            chain.append(block)
            parent = block
        self._touch(chain)
        if root.children == 0:  # nothing fitted: no empty partition is kept
            del self._roots[root.key]

    # ---- inside ----

    def _root(self, state: RequestState, create: bool) -> _Root | None:
        adapter = state.adapter
        key = (state.prepared.request.tenant, None if adapter is None else adapter.key)
        root = self._roots.get(key)
        if root is not None and adapter is not None and root.adapter() is not adapter:
            del self._roots[key]  # the adapter was loaded again: its old blocks are unreachable and age out
            root = None
        if root is None and create:
            root = _Root(key, next(self._ids), None if adapter is None else weakref.ref(adapter))
            self._roots[key] = root
        return root

    def _copy_out(self, slot: int, start: int, count: int) -> list[torch.Tensor]:
        """`count` blocks of `slot` from position `start`, each its own tensor (evicting one frees it)."""
        if count == 0:
            return []
        span = self.cache.copy_out(slot, start, start + count * BLOCK)
        return [part.clone() for part in span.split(BLOCK, dim=3)]

    def _touch(self, chain: list[Block]) -> None:
        """Most recently used, the chain's head last: a chain is evicted from its tail."""
        for block in reversed(chain):
            self._blocks.move_to_end(block.id)

    def _make_room(self, root: _Root, keep: list[Block], pending: int) -> bool:
        """Evict least recently used leaves until one more block fits beside `pending` ones about to be added;
        False when none can go."""
        while len(self._blocks) + pending >= self.max_blocks:
            victim = next((b for b in self._blocks.values() if b.children == 0 and b not in keep), None)
            if victim is None:
                return False
            del self._blocks[victim.id]
            del self._index[victim.key]
            self.evicted += 1
            parent = victim.parent
            parent.children -= 1
            if isinstance(parent, _Root) and parent.children == 0 and parent is not root \
                    and self._roots.get(parent.key) is parent:
                del self._roots[parent.key]
        return True


def _readable(state: RequestState) -> bool:
    prepared = state.prepared
    return prepared.prompt_embeds is None and not prepared.request.params.prompt_logprobs
