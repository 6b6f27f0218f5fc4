"""A GGUF file's header (its metadata and tensor table), parsed once, in one pass over its bytes.

gguf's GGUFReader makes two numpy views of every element of every metadata array: Gemma 3's 262,144-token
vocabulary (tokens, scores and types) took it ~11 s of a core, and transformers' GGUF config read parses it so
again. Here every value is read with `struct` from one read-only mapping of the header, closed once parsed
(a few MB, never the tensor data), and the large arrays the config never reads (`SKIPPED`, the tokenizer's)
are walked over and kept as their length only. The format (v2 and v3): magic, version, tensor count,
metadata count, the metadata (key, type, value), then each tensor's name, dimensions, type and offset in a
data section that starts at the next `general.alignment` boundary.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Container
from dataclasses import dataclass
from pathlib import Path

STRING, ARRAY = 8, 9  # GGUF's metadata value types that are not fixed-size
SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
MAX_NESTING = 8  # arrays of arrays: no file nests deeper; a crafted one would exhaust the stack
VERSIONS = (2, 3)  # v1 counted in 32 bits; no file this reader meets writes it
# the metadata arrays kept as their length: the vocabulary's tables, which only the tokenizer reads
SKIPPED = frozenset({"tokenizer.ggml.tokens", "tokenizer.ggml.scores", "tokenizer.ggml.token_type",
                     "tokenizer.ggml.merges"})


class HeaderError(ValueError):
    """The header cannot be parsed: the message says where."""


@dataclass(frozen=True)
class Value:
    kind: int  # GGUF's value type
    value: object  # a number, str, or list; a skipped array: its length
    element: int | None = None  # an array's element type
    skipped: bool = False


@dataclass(frozen=True)
class TensorInfo:
    name: str
    shape: tuple[int, ...]  # numpy order: (..., rows, columns)
    type_id: int  # the GGML type id, unchecked
    offset: int  # from the start of the file


@dataclass(frozen=True)
class Header:
    version: int
    metadata: dict[str, Value]
    tensors: list[TensorInfo]


class _Cursor:
    def __init__(self, data: mmap.mmap | bytes):
        self.data, self.at = data, 0

    def take(self, form: str) -> tuple:
        values = struct.unpack_from("<" + form, self.data, self.at)
        self.at += struct.calcsize("<" + form)
        return values

    def string(self) -> str:
        (length,) = self.take("Q")
        end = self.at + length
        if end > len(self.data):
            raise HeaderError(f"a string of {length} bytes at byte {self.at} runs past the end")
        text = self.data[self.at:end].decode("utf-8", "replace")
        self.at = end
        return text

    def skip_strings(self, count: int) -> None:
        data, at, size = self.data, self.at, len(self.data)
        unpack = struct.Struct("<Q").unpack_from
        for _ in range(count):
            at += 8 + unpack(data, at)[0]
            if at > size:
                raise HeaderError(f"a string array runs past the end (at byte {at})")
        self.at = at

    def value(self, kind: int, skip: bool, depth: int = 0) -> Value:
        if kind in SCALARS:
            return Value(kind, self.take(SCALARS[kind])[0])
        if kind == STRING:
            return Value(kind, self.string())
        if kind != ARRAY:
            raise HeaderError(f"metadata value type {kind} at byte {self.at} is not one GGUF defines")
        element, count = self.take("IQ")
        if element in SCALARS:
            width = struct.calcsize(SCALARS[element])
            if skip:
                self.at += width * count
                if self.at > len(self.data):
                    raise HeaderError("a metadata array runs past the end")
                return Value(kind, count, element, skipped=True)
            return Value(kind, list(self.take(f"{count}{SCALARS[element]}")), element)
        if element == STRING:
            if skip:
                self.skip_strings(count)
                return Value(kind, count, element, skipped=True)
            return Value(kind, [self.string() for _ in range(count)], element)
        if element == ARRAY:
            if depth >= MAX_NESTING:
                raise HeaderError(f"metadata arrays nested more than {MAX_NESTING} deep at byte {self.at}")
            return Value(kind, [self.value(ARRAY, False, depth + 1).value for _ in range(count)], element)
        raise HeaderError(f"metadata array element type {element} is not one GGUF defines")


def read_header(path: Path, skipped: Container[str] = SKIPPED) -> Header:
    """The header of a GGUF file (whose magic the caller checked); HeaderError (or struct.error where it
    ends early) when it cannot be parsed."""
    with path.open("rb") as handle, mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_READ) as data:
        cursor = _Cursor(data)
        _, version, tensor_count, metadata_count = cursor.take("4sIQQ")
        if version not in VERSIONS:
            raise HeaderError(f"GGUF version {version} (this reader reads {' and '.join(map(str, VERSIONS))})")
        metadata = {}
        for _ in range(metadata_count):
            key = cursor.string()
            (kind,) = cursor.take("I")
            metadata[key] = cursor.value(kind, key in skipped)
        infos = []
        for _ in range(tensor_count):
            name = cursor.string()
            (dimensions,) = cursor.take("I")
            shape = cursor.take(f"{dimensions}Q")
            type_id, offset = cursor.take("IQ")
            infos.append((name, tuple(int(d) for d in reversed(shape)), type_id, offset))
        alignment = metadata.get("general.alignment", Value(4, 32)).value
        if not isinstance(alignment, int) or alignment <= 0:
            raise HeaderError(f"general.alignment is {alignment!r}")
        start = -(-cursor.at // alignment) * alignment
    return Header(version, metadata, [TensorInfo(name, shape, kind, start + offset)
                                      for name, shape, kind, offset in infos])
