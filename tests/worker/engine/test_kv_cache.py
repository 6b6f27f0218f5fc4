"""The KV cache holds only the slots in use: the slot axis grows as slots are first written, and every
operation keeps what the slots hold across a growth."""

from __future__ import annotations

import torch

from worker.engine.kv_cache import ROW_STEP, KVCache, widened


def _cache(max_rows: int = 32) -> KVCache:
    return KVCache(layers=2, kv_heads=2, head_dim=4, max_rows=max_rows, max_context=64, dtype=torch.float32,
                   device=torch.device("cpu"), initial_context=8)


def _fill(cache: KVCache, slot: int, length: int, value: float) -> None:
    cache.copy_in(slot, torch.full((cache.layers, 2, cache.kv_heads, length, cache.head_dim), value))


def test_slots_are_allocated_as_they_are_used_and_keep_their_contents():
    cache = _cache()
    assert cache.rows == ROW_STEP and cache.keys[0].shape[0] == ROW_STEP  # not max_rows
    _fill(cache, 0, 5, 1.0)
    _fill(cache, 9, 5, 2.0)  # past the allocated slots: they grow, in whole steps, slot 0 intact
    assert cache.rows == 12 and all(layer.shape[0] == 12 for layer in cache.keys + cache.values)
    assert torch.equal(cache.copy_out(0, 0, 5), torch.full((2, 2, 2, 5, 4), 1.0))
    assert torch.equal(cache.copy_out(9, 0, 5), torch.full((2, 2, 2, 5, 4), 2.0))
    cache.ensure(20, rows=13)  # the time axis and the slot axis at once
    assert (cache.rows, cache.capacity) == (16, 20)
    assert torch.equal(cache.copy_out(9, 0, 5), torch.full((2, 2, 2, 5, 4), 2.0))
    assert not cache.copy_out(12, 0, 20).any()  # a new slot is zeros
    cache.ensure(1, rows=40)  # never fewer slots than asked for, beyond the configured rows only if asked
    assert cache.rows == 40


def test_operations_on_unallocated_slots_grow_the_cache_first():
    cache = _cache(max_rows=6)
    _fill(cache, 1, 4, 3.0)
    cache.move(1, 5, 4)
    assert cache.rows == 6 and torch.equal(cache.copy_out(5, 0, 4), cache.copy_out(1, 0, 4))
    _fill(cache, 0, 4, 7.0)
    cache.swap(0, 5, 4)  # no spare slot: the two trade places directly
    assert float(cache.copy_out(0, 0, 4).max()) == 3.0 and float(cache.copy_out(5, 0, 4).min()) == 7.0
    cache.clear(5)
    assert not cache.copy_out(5, 0, 4).any()
    cache.gather([5, 0, 0], 4)
    assert not cache.copy_out(0, 0, 4).any() and float(cache.copy_out(2, 0, 4).min()) == 3.0
    fresh = _cache(max_rows=6)
    fresh.clear(5)  # never written: nothing to allocate
    assert fresh.rows == ROW_STEP


def test_a_float16_store_keeps_its_contents_and_converts_writes_and_reads():
    """q4's store (native/model.py): half the bytes; float32 writes land rounded, torch reads get float32."""
    cache = _cache()
    _fill(cache, 1, 5, 1.5)
    before = cache.bytes_per_token()
    cache.store_as(torch.float16)
    assert all(t.dtype == torch.float16 for t in cache.keys + cache.values)
    assert cache.bytes_per_token() * 2 == before
    assert torch.equal(cache.copy_out(1, 0, 5), torch.full((2, 2, 2, 5, 4), 1.5, dtype=torch.float16))
    key = torch.full((1, 1, 2, 4), 1 / 3)  # one row, one position, float32
    slots = cache.decode_slots(1, 1, torch.tensor([5]))
    cache.write_decode(cache.keys[0], cache.values[0], slots[0], key, -key)
    read = widened(cache.keys[0], torch.float32)[1, :, 5]
    assert read.dtype == torch.float32 and torch.equal(read, torch.full((2, 4), 1 / 3).half().float())
    assert widened(cache.keys[0], torch.float16) is cache.keys[0]  # no copy where the dtypes agree
