"""q4 set up on a runner: its matrices packed (or read back from the pack cache), the native forward over
them, and torch's float32 copies of those weights dropped where the runner owns its model.

Packing SmolLM2 reads its float32 projections (~540 MB with the embedding) and measures each matrix twice
(`pick`); the result (~100 MB) is kept with worker/tensor_cache.py under the model cache, keyed by the
weights' id, so a later start reads only it. A model loaded for an engine alone (loading.py `engine_only`)
leaves those float32 tensors unread: the cache hit never touches them, a miss reads them one matrix at a time.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from worker.engine.native.huge_pages import in_huge_pages
from worker.engine.native.model import NativeForward, check_supported, matrix_sources, packed_matrices
from worker.engine.native.pack import EXACT_4BIT, Packed
from worker.engine.native.packed_torch import run_on_packed
from worker.tensor_cache import cached_tensors

PACKED_DIR = "q4-packed"  # under the model cache
PACKED_FORMAT = 3  # pack.py's layout and the names below


def install_native(runner, threads: int | None = None, *, release: bool = False, cache: Path | None = None,
                   weights_id: str | None = None, read: Callable[[str], torch.Tensor] | None = None) -> NativeForward:
    """Set `runner.native`. `release`: the runner is its model's only user, so its float32 projections and
    embedding are freed and the torch paths run on the packed weights (packed_torch.py); a model whose
    weights were left unread is always released. `cache` (a model cache directory) and `weights_id`: where
    the packed matrices are kept; either None: packed at each start. `read`: a weight left unread, by name."""
    check_supported(runner)  # before anything is read or packed: matrix_sources names Llama's modules
    deferred = any(m.weight.is_meta for modules in matrix_sources(runner).values() for m in modules)
    if cache is None or weights_id is None:
        matrices = packed_matrices(runner, read)
    else:
        # packed from the file's 4-bit blocks (a GGUF read for an engine alone) or from float weights: not
        # always the same bytes, so not one entry
        blocks = "\0blocks" if deferred and hasattr(read, "four_bit") else ""
        vocab = "" if runner.family.vocab_bits is None else f"\0vocabulary {runner.family.vocab_bits}"
        recipe = (f"q4 {PACKED_FORMAT}\0{weights_id}\0{EXACT_4BIT}\0{sorted(matrix_sources(runner))}{blocks}"
                  f"{vocab}")
        matrices = _unflatten(cached_tensors(cache / PACKED_DIR, recipe,
                                             lambda: _flatten(packed_matrices(runner, read))))
    matrices, regions = in_huge_pages(matrices)  # collapsed into 2 MiB pages later (NativeForward.collapse_pages)
    runner.native = NativeForward(runner, threads, matrices, regions)
    if release or deferred:
        run_on_packed(runner, matrices)
    return runner.native


def _flatten(matrices: dict[str, Packed]) -> dict[str, torch.Tensor]:
    return {f"{name}.{part}": value for name, packed in matrices.items()
            for part, value in (("tiles", packed.tiles), ("shape", torch.tensor([packed.rows, packed.bits])))}


def _unflatten(flat: dict[str, torch.Tensor]) -> dict[str, Packed]:
    names = {key.rsplit(".", 1)[0] for key in flat}
    return {name: Packed(flat[f"{name}.tiles"], *(int(v) for v in flat[f"{name}.shape"])) for name in names}
