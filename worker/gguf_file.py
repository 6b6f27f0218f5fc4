"""A GGUF file's tensors, read one at a time and dequantized to float32 a few rows at a time (gguf's numpy
dequantizers, so the values are gguf's to the bit). The file is read with pread, never memory-mapped: a
mapping keeps every page it touched in the process's RSS, a whole model's worth by the end of a load.

`read_index` parses the header once (gguf_header.py) and checks it: the magic, every tensor's type is
one this module reads (READABLE), every tensor's bytes lie inside the file. The index it returns is plain
data, kept as JSON in the model cache (worker/gguf_load.py), so a later start parses no GGUF header.
"""

from __future__ import annotations

import math
import os
import struct
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import Q4_K, dequantize

from worker.gguf_header import Header, HeaderError, read_header
from worker.load_errors import ModelLoadError

READABLE = frozenset(GGMLQuantizationType[name] for name in (
    "F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"))
CHUNK_BYTES = 16 << 20  # float32 output per dequantization step: bounds the temporaries, not the result
MAGIC = b"GGUF"


@dataclass(frozen=True)
class TensorEntry:
    name: str
    kind: str  # the GGML type's name
    shape: tuple[int, ...]  # numpy order: (..., rows, columns)
    offset: int  # of its first byte in the file
    size: int  # bytes

    def as_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, value: dict) -> TensorEntry:
        return cls(value["name"], value["kind"], tuple(value["shape"]), value["offset"], value["size"])


def _readable_names() -> str:
    return ", ".join(sorted(kind.name for kind in READABLE))


def checked_header(path: Path) -> Header:
    """The parsed header of a GGUF file; ModelLoadError where it is not one, or cannot be parsed."""
    with path.open("rb") as handle:
        magic = handle.read(4)
    if magic != MAGIC:
        raise ModelLoadError(f"{path.name} is not a GGUF file: it starts with {magic!r}, not {MAGIC!r}")
    try:
        return read_header(path)
    except (HeaderError, struct.error, UnicodeDecodeError, ValueError, OverflowError) as error:
        detail = " ".join(str(error).split()) or type(error).__name__
        raise ModelLoadError(f"{path.name} is truncated or corrupt ({path.stat().st_size} bytes): {detail}") from None


def read_index(path: Path, header: Header | None = None) -> tuple[str, list[TensorEntry]]:
    """(general.architecture, the tensors) of a GGUF file, checked; ModelLoadError names what is wrong.
    `header`: its checked_header, where the caller has it."""
    header = checked_header(path) if header is None else header
    file_size = path.stat().st_size
    field = header.metadata.get("general.architecture")
    if field is None or not isinstance(field.value, str) or not field.value:
        raise ModelLoadError(f"{path.name} has no general.architecture in its metadata")
    architecture = field.value
    entries = []
    for tensor in header.tensors:
        try:
            kind = GGMLQuantizationType(tensor.type_id)
        except ValueError:
            raise ModelLoadError(f"{path.name} has a tensor of unknown GGUF tensor type id {tensor.type_id} "
                                 f"(Sluice reads {_readable_names()})") from None
        if kind not in READABLE:
            raise ModelLoadError(f"{path.name}: tensor {tensor.name} has GGUF type {kind.name}, which Sluice does "
                                 f"not read (it reads {_readable_names()})")
        shape = tensor.shape
        block, type_size = GGML_QUANT_SIZES[kind]
        if not shape or shape[-1] % block:
            raise ModelLoadError(f"{path.name}: tensor {tensor.name}'s rows ({shape[-1:]}) are not whole "
                                 f"{kind.name} blocks of {block}")
        size = math.prod(shape) // block * type_size
        end = tensor.offset + size
        if end > file_size:
            raise ModelLoadError(f"{path.name} is truncated: tensor {tensor.name} ends at byte {end}, "
                                 f"the file at {file_size}")
        entries.append(TensorEntry(tensor.name, kind.name, shape, tensor.offset, size))
    return architecture, entries


def read_tensor(path: Path, entry: TensorEntry) -> torch.Tensor:
    """The tensor's values, float32, in its numpy shape."""
    rows, columns = math.prod(entry.shape[:-1]), entry.shape[-1]
    out = torch.empty(rows, columns, dtype=torch.float32)
    target, start = out.numpy(), 0
    for values in read_rows(path, entry, max(1, CHUNK_BYTES // (columns * 4))):
        target[start:start + len(values)] = values
        start += len(values)
    return out.reshape(entry.shape)


def read_rows(path: Path, entry: TensorEntry, step: int) -> Iterator[np.ndarray]:
    """The tensor's rows (its last dimension's runs) dequantized to float32, `step` rows at a time: a reader
    that packs a slice at a time holds no float32 copy of the whole tensor."""
    kind = GGMLQuantizationType[entry.kind]
    block, type_size = GGML_QUANT_SIZES[kind]
    rows = math.prod(entry.shape[:-1])
    row_bytes = entry.shape[-1] // block * type_size
    with path.open("rb", buffering=0) as handle:
        for start in range(0, rows, step):
            count = min(step, rows - start)
            raw = np.empty((count, row_bytes), dtype=np.uint8)
            _read_into(handle.fileno(), raw, entry.offset + start * row_bytes, path, entry)
            yield dequantize(raw, kind)


def _read_into(descriptor: int, buffer: np.ndarray, offset: int, path: Path, entry: TensorEntry) -> None:
    view, done = buffer.data.cast("B"), 0
    while done < len(view):
        got = os.preadv(descriptor, [view[done:]], offset + done)
        if got == 0:
            raise ModelLoadError(f"{path.name} is truncated: tensor {entry.name} ends past the file's end")
        done += got


FOUR_BIT = frozenset({"Q4_0", "Q4_1", "Q4_K"})  # groups of 32 whose weights are scale * code + minimum


def read_four_bit(path: Path, entry: TensorEntry) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A Q4_0 / Q4_1 / Q4_K matrix as its blocks hold it: (codes uint8 [rows, columns], scale and minimum
    float32 [rows, columns / 32]) with w = scale * code + minimum in each group of 32 inputs; computed in
    float32, that is gguf's dequantization to the bit."""
    rows, columns = math.prod(entry.shape[:-1]), entry.shape[-1]
    block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType[entry.kind]]
    raw = np.empty((rows * columns // block, type_size), dtype=np.uint8)
    with path.open("rb", buffering=0) as handle:
        _read_into(handle.fileno(), raw, entry.offset, path, entry)
    halves = raw[:, :4].copy().view(np.float16).astype(np.float32)  # d (and m / dmin) of each block
    if entry.kind == "Q4_K":
        sub_scales, sub_minimums = Q4_K.get_scale_min(raw[:, 4:16])
        nibbles = raw[:, 16:].reshape(-1, 4, 1, 32) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        scale = halves[:, :1] * sub_scales.astype(np.float32)
        minimum = -(halves[:, 1:2] * sub_minimums.astype(np.float32))
    else:  # Q4_0: w = d * (q - 8); Q4_1: w = d * q + m
        first = 2 if entry.kind == "Q4_0" else 4
        nibbles = raw[:, first:].reshape(-1, 1, 1, 16) >> np.array([0, 4], dtype=np.uint8).reshape(1, 1, 2, 1)
        scale = halves[:, :1]
        minimum = -8 * scale if entry.kind == "Q4_0" else halves[:, 1:2]
    codes = (nibbles & np.uint8(15)).reshape(rows, columns)
    groups = columns // 32
    return (torch.from_numpy(codes), torch.from_numpy(np.ascontiguousarray(scale).reshape(rows, groups)),
            torch.from_numpy(np.ascontiguousarray(minimum).reshape(rows, groups)))
