"""Named tensors derived from a model's weights (w8a8's int8 projections, another packed format's blocks),
built once and kept on disk, so that a worker's later starts read them instead of computing them again.

An entry is one directory under the cache, named by the sha256 of its full key: the caller's recipe (the
weights' id and every parameter of the derivation, with a format version) plus what can change the result
underneath it: the torch version, and the CPU (its architecture, torch's capability level and the
instruction sets of worker/cpu_features.py). It holds `tensors.safetensors` and `check.json`: the full key
and the file's size and CRC-32. A read checks all three, so a truncated or corrupted file, or one another
recipe wrote under this name, is never used: it is discarded and built again. Workers that start together
build an entry once between them (worker/build_once.py). A cache that cannot be written (read-only disk)
only costs the build at each start.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import platform
import shutil
import zlib
from collections.abc import Callable
from pathlib import Path

import structlog
import torch
from safetensors.torch import load_file, save_file

from worker.build_once import build_once, exclusive
from worker.cpu_features import cpu_features

log = structlog.get_logger(__name__)

TENSORS, CHECK = "tensors.safetensors", "check.json"


def environment_key() -> str:
    """What, besides the recipe, can change a derived tensor: the torch version and the CPU."""
    features = ",".join(sorted(cpu_features()))
    return f"torch={torch.__version__}\0cpu={platform.machine()}/{torch.backends.cpu.get_cpu_capability()}/{features}"


def cached_tensors(directory: Path, recipe: str,
                   build: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The tensors `build()` returns for `recipe`, read from `directory` when a sound entry is there, else
    built and written there. `recipe` must name everything the tensors depend on (weights, parameters)."""
    key = f"{recipe}\0{environment_key()}"
    target = directory / hashlib.sha256(key.encode()).hexdigest()
    built: dict[str, torch.Tensor] = {}

    def write(staging: Path) -> None:
        built.update(build())
        save_file({name: tensor.contiguous() for name, tensor in built.items()}, staging / TENSORS)
        size, crc = _size_and_crc(staging / TENSORS)
        (staging / CHECK).write_text(json.dumps({"key": key, "size": size, "crc32": crc}))

    try:
        for _ in range(2):  # a bad entry is discarded once and built again
            build_once(target, CHECK, write)
            if built:
                return built
            tensors = _read(target, key)
            if tensors is not None:
                return tensors
            log.warning("tensor_cache_discarded", entry=str(target), reason="size, checksum or key mismatch")
            discard(target)
    except OSError as error:  # a cache that cannot be written or read: computed each time
        log.warning("tensor_cache_unavailable", entry=str(target), error=str(error))
    return built or build()


def _read(target: Path, key: str) -> dict[str, torch.Tensor] | None:
    """The entry's tensors, or None when its file is not the one its check describes, or not for `key`. The
    checksum streams over the file and the tensors are then read each into its own memory: at no time does
    the whole file sit in memory beside them (q4's packed weights: a load's peak)."""
    try:
        check = json.loads((target / CHECK).read_text())
        size, crc = _size_and_crc(target / TENSORS)
    except (OSError, ValueError):
        return None
    if not isinstance(check, dict) or check.get("key") != key or check.get("size") != size \
            or check.get("crc32") != crc:
        return None
    try:
        return load_file(target / TENSORS, backend="pread")
    except Exception:  # a header the checksum happened to pass (written by a broken build): rebuilt
        return None


def _size_and_crc(path: Path) -> tuple[int, int]:
    """A file's size and CRC-32, read in blocks (never the whole file in memory)."""
    crc = size = 0
    with path.open("rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            crc, size = zlib.crc32(block, crc), size + len(block)
    return size, crc


def discard(target: Path) -> None:
    """Remove an entry, under the lock its builders take (a reader that opened it keeps its copy)."""
    with exclusive(target.with_name(f".{target.name}.lock")), contextlib.suppress(FileNotFoundError):
        shutil.rmtree(target)
