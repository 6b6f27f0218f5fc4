"""What transformers knows of GGUF, fenced here: the architectures it maps, GGUF tensor names -> state-dict
names, and each architecture's fix-ups of a tensor's values as llama.cpp's converter stored them (Llama's
q/k rows permuted for its rotary layout, Gemma's norms stored as w - 1, MoE experts split per projection).

Using transformers' own tables and processors keeps our reading equal to its GGUF load, tensor for tensor
(tests/worker/test_gguf_load.py). The only module that reads these internals: an upgrade that renames one
fails tests/infra/test_framework_contracts.py by name.
"""

from __future__ import annotations

import numpy as np
import torch
from transformers import PretrainedConfig
from transformers.modeling_gguf_pytorch_utils import (
    GGUF_SUPPORTED_ARCHITECTURES,
    TENSOR_PROCESSORS,
    TensorProcessor,
    get_gguf_hf_weights_map,
)

# the general.architecture strings transformers reads under another model type (load_gguf_checkpoint's renames)
RENAMED = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}
NOT_CAUSAL_LM = {"general", "tokenizer", "t5", "umt5", "bloom", "mamba"}  # not decoders the engine serves


def known_architecture(architecture: str) -> bool:
    """Whether transformers builds a config (and a causal LM) from a GGUF of this `general.architecture`."""
    name = RENAMED.get(architecture, architecture)
    return name in GGUF_SUPPORTED_ARCHITECTURES and name not in NOT_CAUSAL_LM


def known_architectures() -> list[str]:
    return sorted(set(GGUF_SUPPORTED_ARCHITECTURES) - NOT_CAUSAL_LM)


def _processor(architecture: str, config: dict) -> TensorProcessor:
    return TENSOR_PROCESSORS.get(architecture, TensorProcessor)(config=config)


class _Shallow:
    """A model as get_gguf_hf_weights_map reads it, without its submodules: that function maps each submodule
    again (with the name tables built anew each time: ~20 s for a 30-layer model on a small host) only to find
    names the whole model's state dict already maps."""

    def __init__(self, model: torch.nn.Module):
        self.model, self.config = model, model.config

    def state_dict(self) -> dict:
        return self.model.state_dict()

    def named_children(self) -> list:
        return []


def config_dict(model: torch.nn.Module) -> dict:
    """The model's config as a dict (`config` is an attribute of a PreTrainedModel, not of Module)."""
    config: PretrainedConfig = getattr(model, "config")  # noqa: B009 -- Module's __getattr__ types it as a tensor
    return config.to_dict()


def tensor_names(architecture: str, model: torch.nn.Module) -> dict[str, str]:
    """GGUF tensor name -> state-dict name, for `model` (a skeleton: only its names are read), as transformers
    maps them; the whole model's names first, the submodules' walk only where some are left unmapped."""
    processor = _processor(architecture, config_dict(model))
    names = get_gguf_hf_weights_map(_Shallow(model), processor)
    tied = {"lm_head.weight"} if getattr(model.config, "tie_word_embeddings", False) else set()
    if set(model.state_dict()) - tied - set(names.values()):
        names = get_gguf_hf_weights_map(model, processor)
    return names


class GgufTensors:
    """Turns a GGUF tensor, dequantized (float32, numpy), into the state-dict tensor it is, as transformers'
    GGUF load does. `config`: the model's config as a dict, `names`: `tensor_names`."""

    def __init__(self, architecture: str, config: dict, names: dict[str, str]):
        self.processor, self.names = _processor(architecture, config), names
        # where a processor assembles a state-dict tensor from several GGUF tensors (MoE experts)
        self.assembled: dict[str, dict[str, torch.Tensor]] = {"tensors": {}}

    def sources(self) -> dict[str, str]:
        """state-dict name -> the GGUF tensor it comes from (where one does alone)."""
        return {hf: gguf for gguf, hf in self.names.items()}

    def convert(self, gguf_name: str, weights: np.ndarray) -> tuple[str | None, np.ndarray]:
        """(state-dict name, values), or (None, _) where the tensor is not the model's or went into
        `assembled` (complete once every GGUF tensor was converted)."""
        result = self.processor.process(weights=weights, name=gguf_name, tensor_key_mapping=self.names,
                                        parsed_parameters=self.assembled)
        if result.name is None or result.name not in self.names:
            return None, result.weights
        return self.names[result.name], result.weights
