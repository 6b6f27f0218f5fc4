"""The packed matrices in 2 MiB pages: the small ones moved into one mapping advised for them (the same bytes, each
on a cache line, the old memory released as they move), the large ones collapsed where they lie."""

from __future__ import annotations

import gc
import re
import weakref
from pathlib import Path

import pytest
import torch

from worker.engine.native.huge_pages import HUGE_PAGE, IN_PLACE, LINE, collapse, collapse_all, gathered, in_huge_pages
from worker.engine.native.pack import Packed

THP = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def _matrices() -> dict[str, Packed]:
    generator = torch.Generator().manual_seed(5)
    shapes = {"lm_head": (300, 20, 576), "0.qkv": (7, 20, 320), "0.down": (3, 64, 320), "odd": (1, 1, 33)}
    return {name: Packed(torch.randint(0, 256, shape, dtype=torch.uint8, generator=generator), shape[0] * 16 - 3,
                         8 if shape[2] == 576 else 4) for name, shape in shapes.items()}


def test_the_matrices_keep_their_bytes_and_shapes_each_on_a_cache_line():
    matrices = _matrices()
    expected = {name: (p.tiles.clone(), p.rows, p.bits) for name, p in matrices.items()}
    moved, memory = gathered(matrices)
    assert not matrices and set(moved) == set(expected)
    for name, (tiles, rows, bits) in expected.items():
        packed = moved[name]
        assert torch.equal(packed.tiles, tiles) and (packed.rows, packed.bits) == (rows, bits)
        assert packed.tiles.is_contiguous() and packed.tiles.data_ptr() % LINE == 0
    largest = max(moved.values(), key=lambda p: p.tiles.numel())
    assert largest.tiles.data_ptr() % HUGE_PAGE == 0 == memory.data_ptr() % HUGE_PAGE  # the first, on a boundary
    for packed in moved.values():  # the memory returned (for the collapse) holds every matrix
        assert memory.data_ptr() <= packed.tiles.data_ptr()
        assert packed.tiles.data_ptr() + packed.tiles.numel() <= memory.data_ptr() + memory.numel()


def test_each_matrix_s_old_memory_is_released_as_it_moves():
    matrices = _matrices()
    old = [weakref.ref(p.tiles) for p in matrices.values()]
    moved, _ = gathered(matrices)
    gc.collect()
    assert all(ref() is None for ref in old) and len(moved) == 4


def _smaps_block(address: int) -> str:
    for block in re.split(r"\n(?=[0-9a-f]+-[0-9a-f]+ )", Path("/proc/self/smaps").read_text()):
        low, high = (int(part, 16) for part in block.split()[0].split("-"))
        if low <= address < high:
            return block
    raise AssertionError("the address is in no mapping")


def test_a_large_matrix_is_collapsed_where_it_lies_with_its_bytes():
    if not THP.exists() or "[never]" in THP.read_text():
        pytest.skip("no transparent huge pages on this host")
    big = torch.randint(0, 256, (IN_PLACE + 3 * HUGE_PAGE + 5,), dtype=torch.uint8,
                        generator=torch.Generator().manual_seed(1))
    before, address = big.clone(), big.data_ptr()
    moved = collapse(big)
    assert big.data_ptr() == address and torch.equal(big, before)  # in place, the same bytes
    if moved == 0:
        pytest.skip("this kernel does not collapse on request (MADV_COLLAPSE, Linux 6.1)")
    assert moved >= IN_PLACE and moved % HUGE_PAGE == 0
    inside = -(-address // HUGE_PAGE) * HUGE_PAGE
    assert re.search(r"^AnonHugePages:\s+[1-9]", _smaps_block(inside), re.MULTILINE)
    block = _smaps_block(inside)
    assert re.search(r"^VmFlags:.*\bhg\b", block, re.MULTILINE), block  # advised MADV_HUGEPAGE first


def test_large_matrices_stay_and_the_others_are_gathered():
    small = _matrices()
    big = Packed(torch.zeros(IN_PLACE // 576 + 1, 1, 576, dtype=torch.uint8), 16, 8)
    address = big.tiles.data_ptr()
    matrices = {**small, "lm_head": big}
    everything, regions = in_huge_pages(matrices)
    assert not matrices and set(everything) == set(small) | {"lm_head"}
    assert everything["lm_head"].tiles.data_ptr() == address  # never copied: a load would hold it twice
    assert all(everything[name].tiles.data_ptr() != small[name].tiles.data_ptr() for name in small)
    # what is left to collapse: the large matrix where it lies, and the mapping the others moved into
    assert regions[0].data_ptr() == address and regions[1].data_ptr() % HUGE_PAGE == 0
    before = {name: packed.tiles.clone() for name, packed in everything.items()}
    collapse_all(regions)  # whatever the kernel grants, the bytes stay
    assert all(torch.equal(everything[name].tiles, tiles) for name, tiles in before.items())


def test_a_collapse_that_cannot_happen_changes_nothing():
    tiny = torch.arange(100, dtype=torch.uint8)
    assert collapse(tiny) == 0 and torch.equal(tiny, torch.arange(100, dtype=torch.uint8))
    assert collapse(torch.zeros(4 * HUGE_PAGE, dtype=torch.uint8)[::2]) == 0  # not contiguous


def test_nothing_to_move_is_nothing():
    moved, memory = gathered({})
    assert moved == {} and memory.numel() == 0 and collapse_all([memory]) == 0
