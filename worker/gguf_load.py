"""A GGUF file loaded as it is shipped, tensor by tensor, into the model's own size.

The first start parses and checks the header (gguf_file.read_index); transformers builds the config and the
tokenizer from the metadata (tokenizer, chat template, special tokens, rope settings), and those, with the
tensor index, are kept as a small directory in the model cache: `<cache>/<sha256 of the file>.gguf<FORMAT>`
(build_once: complete or absent, never half-written); the tokenizer is read back through `tokenizers` once a
load has proven that equal to transformers' own reading (worker/cached_tokenizer.py). Every start builds the
model's skeleton on the meta device from that config and reads the weights one GGUF tensor at a time
(gguf_file.read_tensor), through transformers' name map and fix-ups (gguf_names.py), each cast to the compute
dtype and put in its place at once: no float32 copy of the model exists, only of the tensor being read.
Weights the engine packs itself (q4 `engine_only`, loading.py) are left unread; `GgufWeights` reads one by
name when it is needed, and hands q4 a Q4_0 / Q4_1 / Q4_K matrix's codes and scales as they are
(`four_bit`), packed without a float copy.

Earlier versions cached the whole model dequantized to float32 safetensors under `<cache>/<sha256>`; those
directories are no longer read or written (delete them to reclaim the space).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import structlog
import torch
from transformers import AutoConfig

from worker.build_once import build_once
from worker.direct_load import fill, skeleton
from worker.file_hash import remembered_sha256
from worker.gguf_file import FOUR_BIT, TensorEntry, checked_header, read_four_bit, read_index, read_rows, read_tensor
from worker.gguf_metadata import gguf_config, gguf_tokenizer
from worker.gguf_names import GgufTensors, config_dict, known_architecture, known_architectures, tensor_names
from worker.load_errors import ModelLoadError

log = structlog.get_logger(__name__)

METADATA_FORMAT = 1  # the layout of the metadata directory (its name carries it: a new layout, a new directory)
INDEX = "gguf_index.json"


def is_gguf(location: Path | str) -> bool:
    return isinstance(location, Path) and location.suffix == ".gguf"


def gguf_metadata_dir(gguf: Path, cache: Path) -> Path:
    """The config, tokenizer and tensor index of a GGUF file, in the model cache (built on its first use)."""
    target = cache / f"{remembered_sha256(gguf, cache)}.gguf{METADATA_FORMAT}"

    def build(staging: Path) -> None:
        header = checked_header(gguf)
        architecture, entries = read_index(gguf, header)
        if not known_architecture(architecture):
            raise ModelLoadError(f"{gguf.name}: GGUF architecture {architecture!r} is not one Sluice loads "
                                 f"(it loads {', '.join(known_architectures())})")
        log.info("gguf_metadata", file=str(gguf), cache=str(target), architecture=architecture)
        config = gguf_config(gguf, header, staging)
        if hasattr(config, "quantization_config"):  # the weights are read as they are, not by transformers
            del config.quantization_config
        config.save_pretrained(staging)
        gguf_tokenizer(gguf, config).save_pretrained(staging)
        index = {"architecture": architecture, "file_size": gguf.stat().st_size,
                 "names": tensor_names(architecture, skeleton(config, torch.float32, lean=True)),
                 "tensors": [entry.as_json() for entry in entries]}
        (staging / INDEX).write_text(json.dumps(index))

    return build_once(target, INDEX, build)


def gguf_weights_id(directory: Path) -> str:
    """Names these weights for what is derived from them (q4's packs, w8a8's calibration): the file's hash is
    the directory's name; the config and the index say how they are read."""
    digest = hashlib.sha256(f"gguf\0{directory.name}\0".encode())
    digest.update((directory / "config.json").read_bytes())
    digest.update((directory / INDEX).read_bytes())
    return digest.hexdigest()


class GgufWeights:
    """Reads the weights of a GGUF file as state-dict tensors in `dtype`, one at a time."""

    def __init__(self, gguf: Path, directory: Path, model: torch.nn.Module, dtype: torch.dtype):
        index = json.loads((directory / INDEX).read_text())
        if gguf.stat().st_size != index["file_size"]:
            raise ModelLoadError(f"{gguf.name} changed while it was being loaded")
        self.gguf, self.dtype = gguf, dtype
        self.entries = [TensorEntry.from_json(value) for value in index["tensors"]]
        self.tensors = GgufTensors(index["architecture"], config_dict(model), index["names"])
        self._sources = self.tensors.sources()
        self._by_name = {entry.name: entry for entry in self.entries}

    def converted(self, entry: TensorEntry) -> tuple[str | None, torch.Tensor]:
        name, values = self.tensors.convert(entry.name, read_tensor(self.gguf, entry).numpy())
        return name, torch.from_numpy(np.ascontiguousarray(values)).to(self.dtype)

    def row_slices(self, name: str, step: int) -> Callable[[], Iterator[torch.Tensor]] | None:
        """Reads the matrix `name` from the file as float32 slices of `step` rows (each call reads it again),
        for a packer that needs no float32 copy of the whole (a vocabulary matrix's was a cold start's peak).
        None where the tensor is not a matrix its fix-up leaves row for row (q / k's heads move rows)."""
        source = self._by_name.get(self._sources.get(name, ""))
        if source is None or len(source.shape) != 2:
            return None
        try:
            if self._row_order(source, name) is not None:
                return None
        except ValueError:
            return None
        return lambda: (torch.from_numpy(values) for values in read_rows(self.gguf, source, step))

    def _row_order(self, source: TensorEntry, name: str) -> np.ndarray | None:
        """Where the fix-up puts each of the source's rows, or None where it leaves them in place; a fix-up
        that does more than reorder rows (or names another tensor) raises ValueError."""
        rows = source.shape[0]
        probe = np.arange(rows, dtype=np.float32).reshape(rows, 1)  # each row's index, through the fix-up
        converted, order = self.tensors.convert(source.name, probe)
        if converted != name or order.shape != (rows, 1) or not np.array_equal(np.sort(order[:, 0]), probe[:, 0]):
            raise ValueError(f"{source.name}'s fix-up does more than reorder its rows")
        return None if np.array_equal(order[:, 0], probe[:, 0]) else order[:, 0]

    def four_bit(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """A 4-bit matrix's codes, scales and minimums as its GGUF blocks hold them (gguf_file.read_four_bit),
        rows in the state dict's order: what q4 packs without a float round trip. None where the tensor is
        not Q4_0 / Q4_1 / Q4_K, or its architecture's fix-up does more than reorder rows."""
        source = self._by_name.get(self._sources.get(name, ""))
        if source is None or source.kind not in FOUR_BIT or len(source.shape) != 2:
            return None
        try:
            order = self._row_order(source, name)
        except ValueError:
            return None
        codes, scale, minimum = read_four_bit(self.gguf, source)
        if order is None:
            return codes, scale, minimum
        index = torch.from_numpy(order.astype(np.int64))
        return codes[index], scale[index], minimum[index]

    def __call__(self, name: str) -> torch.Tensor:
        source = self._by_name.get(self._sources.get(name, ""))
        if source is None:
            raise KeyError(f"no tensor of {self.gguf.name} is {name}")
        converted, tensor = self.converted(source)
        if converted != name:
            raise KeyError(f"{source.name} of {self.gguf.name} is read as {converted}, not {name}")
        return tensor


def load_gguf(gguf: Path, directory: Path, dtype: torch.dtype, unread: Callable[[str], bool] | None = None,
              lean: bool = False) -> tuple[torch.nn.Module, GgufWeights]:
    """The model of a GGUF file (`directory`: its gguf_metadata_dir), and the reader of its weights. Tensors
    whose state-dict names `unread` accepts stay on the meta device; `lean`: direct_load.skeleton's."""
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    model = skeleton(config, dtype, lean)
    weights = GgufWeights(gguf, directory, model, dtype)
    state: dict[str, torch.Tensor] = {}
    left: set[str] = set()
    for entry in weights.entries:
        mapped = weights.tensors.names.get(entry.name)
        if mapped is not None and unread is not None and unread(mapped):
            left.add(mapped)
            continue
        name, tensor = weights.converted(entry)
        if name is not None:
            state[name] = tensor
    state.update({name: t.to(dtype) for name, t in weights.tensors.assembled["tensors"].items()})
    problem = fill(model, config, state, left)
    if problem:
        raise ModelLoadError(f"{gguf.name}: its tensors do not make a {config.model_type} model ({problem})")
    return model, weights
