"""Build a plain (unquantized) model straight from a local safetensors directory, skipping
`from_pretrained`'s machinery: on a two-core host that machinery (checkpoint conversion rules compiled
as ~1,000 regular expressions, loading reports) costs ~1-2 s of a cold start, the tensors themselves a
tenth of a second.

The model is built on the meta device, the file's tensors are read one at a time (`pread`: one allocation
each, not views of one mapping of the whole file, so a tensor the engine replaces, as fusing and w8a8 do, is
freed on its own, and no mapping keeps the file's pages in RSS), cast to the model's dtype and assigned;
the tied head is tied again, and the rotary embedding (the one module whose buffers are computed, not
stored) is rebuilt from the config. Anything else left
unfilled, or a key that does not match, means the checkpoint needs `from_pretrained`'s conversions:
`load_direct` returns None and the caller uses it.
The weights are those `from_pretrained` loads, tensor for tensor (tests/worker/test_direct_load.py).

`unread` names tensors to leave on the meta device, unread (q4's engine packs them, or reads its packed copy
instead): `WeightReader` reads one of them by name when it is needed after all.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import structlog
import torch
from safetensors import SafetensorError, safe_open
from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

from worker.families.skeleton import lean_skeleton
from worker.load_errors import ModelLoadError

log = structlog.get_logger(__name__)


def skeleton(config, dtype: torch.dtype, lean: bool = False) -> torch.nn.Module:
    """The causal LM of `config` on the meta device: every tensor a placeholder, none allocated. `lean`: built
    from its family's description without transformers' modeling code where it can be (families/skeleton.py:
    what q4, which computes the layers itself, loads), else transformers' class."""
    model = lean_skeleton(config, dtype) if lean else None
    if model is not None:
        return model
    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(config, dtype=dtype)


def fill(model: torch.nn.Module, config, state: dict[str, torch.Tensor], left: set[str]) -> str | None:
    """Put `state` into the skeleton `model` (its tensors as they are), tie the head and rebuild the rotary
    embedding; None, or why the tensors do not make this model (the names in `left` may stay meta)."""
    missing, unexpected = model.load_state_dict(state, strict=False, assign=True)
    state.clear()  # the model holds them now; nothing else should keep them alive
    tied = {"lm_head.weight"} if getattr(config, "tie_word_embeddings", False) else set()
    if unexpected or set(missing) - tied - left:
        return f"checkpoint keys differ: missing {sorted(set(missing) - tied - left)[:3]}, unexpected {unexpected[:3]}"
    model.tie_weights()
    inner = getattr(model, "model", None)
    rotary = getattr(inner, "rotary_emb", None)
    if rotary is not None:  # its buffers are computed, not stored; float32, as from_pretrained leaves them
        inner.rotary_emb = type(rotary)(config=config)
    for module in model.modules():  # computed buffers the checkpoint never holds: Gemma's embedding scale
        scale = getattr(module, "scalar_embed_scale", None)
        if scale is not None and getattr(module, "embed_scale", None) is not None and module.embed_scale.is_meta:
            module.embed_scale = torch.tensor(scale)
    unfilled = [name for name, tensor in [*model.named_parameters(), *model.named_buffers()]
                if tensor.is_meta and name not in left]
    return f"tensors left unfilled: {unfilled[:3]}" if unfilled else None


def _in(tensor: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return tensor.to(dtype) if tensor.is_floating_point() else tensor


def load_direct(location: Path | str, dtype: torch.dtype, unread: Callable[[str], bool] | None = None,
                lean: bool = False) -> torch.nn.Module | None:
    """The model of a local HF directory, or None when this directory needs `from_pretrained`. Tensors whose
    names `unread` accepts stay on the meta device; `lean`: see `skeleton`. A shard that is not a whole
    safetensors file (truncated, corrupt): ModelLoadError naming it."""
    directory = Path(location)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files:
        return None
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    model = skeleton(config, dtype, lean)
    state: dict[str, torch.Tensor] = {}
    left: set[str] = set()
    for file in files:
        try:
            # pread: each tensor its own allocation (freed on its own; no mapping keeps the file's pages in
            # RSS), cast to the model's dtype at once (a bf16 file never sits beside its float32 copy)
            with safe_open(file, "pt", backend="pread") as handle:
                for key in handle.keys():  # noqa: SIM118 (a safetensors handle is not a mapping)
                    if unread is not None and unread(key):
                        left.add(key)
                    else:
                        state[key] = _in(handle.get_tensor(key), dtype)
        except SafetensorError as error:
            raise ModelLoadError(f"{file.name} is not a whole safetensors file (truncated or corrupt): "
                                 f"{' '.join(str(error).split())}") from None
    problem = fill(model, config, state, left)
    if problem:
        log.info("direct_load_declined", reason=problem)
        return None
    if (directory / "generation_config.json").exists():
        model.generation_config = GenerationConfig.from_pretrained(directory, local_files_only=True)
    return model


class WeightReader:
    """Reads a state-dict tensor of a local safetensors directory by name, in `dtype`, one at a time."""

    def __init__(self, location: Path | str, dtype: torch.dtype):
        self.files, self.dtype = sorted(Path(location).glob("*.safetensors")), dtype
        self._where: dict[str, Path] | None = None

    def __call__(self, name: str) -> torch.Tensor:
        if self._where is None:
            self._where = {}
            for file in self.files:
                with safe_open(file, "pt") as handle:
                    self._where.update(dict.fromkeys(handle.keys(), file))  # noqa: SIM118
        if name not in self._where:
            raise KeyError(f"no tensor {name} in {', '.join(f.name for f in self.files)}")
        with safe_open(self._where[name], "pt") as handle:
            return handle.get_tensor(name).to(self.dtype, copy=True)  # its own memory, not the mapping
