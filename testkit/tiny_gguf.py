"""GGUF files written with the `gguf` package for tests and benches: random blocks of the K-quant types
(gguf-py dequantizes them but cannot quantize to them), and tiny files of any tensor types."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFWriter
from gguf.quants import quantize

# where each K-quant keeps its fp16 super-block scales (bytes), and a value small enough for |w| < ~0.05
_K_SCALES = {GGMLQuantizationType.Q4_K: (slice(0, 4), [2e-5, 2e-5]),
             GGMLQuantizationType.Q5_K: (slice(0, 4), [2e-5, 2e-5]),
             GGMLQuantizationType.Q6_K: (slice(208, 210), [5e-6]),
             GGMLQuantizationType.Q2_K: (slice(80, 84), [2e-4, 2e-4])}


def random_blocks(kind: GGMLQuantizationType, rows: int, columns: int, rng: np.random.Generator) -> np.ndarray:
    """[rows, bytes] of random `kind` blocks (a K-quant): random codes and sub-scales, small fixed scales."""
    block, size = GGML_QUANT_SIZES[kind]
    raw = rng.integers(0, 256, size=(rows, columns // block, size), dtype=np.uint8)
    where, scales = _K_SCALES[kind]
    raw[..., where] = np.array(scales, dtype=np.float16).view(np.uint8)
    return raw.reshape(rows, -1)


def encoded(kind: GGMLQuantizationType, values: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """`values` ([rows, columns] float32) in `kind`; K-quants are random blocks of that shape instead."""
    if kind in _K_SCALES:
        return random_blocks(kind, values.shape[0], values.shape[1], rng)
    if kind == GGMLQuantizationType.F32:
        return values.astype(np.float32)
    if kind == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return quantize(values, kind)


def write_gguf(path: Path, architecture: str, tensors: dict[str, tuple[GGMLQuantizationType, tuple[int, int]]],
               metadata: dict[str, int] | None = None, seed: int = 0) -> Path:
    """A GGUF file of `architecture` with the named tensors ([rows, columns], random values of that type) and
    `metadata` (integers under the architecture's keys, e.g. {"block_count": 2})."""
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), architecture)
    for key, value in (metadata or {}).items():
        writer.add_uint32(f"{architecture}.{key}", value)
    for name, (kind, (rows, columns)) in tensors.items():
        values = (rng.standard_normal((rows, columns)) * 0.05).astype(np.float32)
        raw = encoded(kind, values, rng)
        writer.add_tensor(name, raw, raw_dtype=None if kind in (GGMLQuantizationType.F32,
                                                                GGMLQuantizationType.F16) else kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
