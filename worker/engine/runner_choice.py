"""Which runner serves a model: the lean one (runner.py) for the families it has a fast path for, transformers'
own forward (hf_runner.py) for every other causal LM, with one log line naming the model class and why.

A family the lean runner does not know must never reach it: a decoder that merely looks like Llama's (layers,
a rotary module) can start there and answer wrong tokens without a word (Gemma 2 did).
"""

from __future__ import annotations

import dataclasses

import structlog
import torch

from common.protocol import ModelConfig
from worker.engine.hf_runner import TransformersRunner
from worker.engine.runner import ModelRunner, UnsupportedModel
from worker.families import FAMILIES
from worker.loading import LoadedModel, read_unread_weights

log = structlog.get_logger(__name__)

# the config `model_type`s the lean runner computes exactly (greedy equal to `generate()`: tests/worker/engine)
LEAN_MODEL_TYPES = frozenset(FAMILIES)
# quantizations that live inside the lean runner (its projections); bitsandbytes' layers run anywhere
LEAN_ONLY = ("q4", "w8a8")


def build_runner(loaded: LoadedModel, config: ModelConfig, decode_threads: int,
                 kv_dtype: torch.dtype | None) -> tuple[ModelRunner | TransformersRunner, LoadedModel]:
    """The runner for `loaded`, and the model as that runner serves it (q4 / w8a8 picked by `auto` run
    unquantized on the fallback: the weights q4 left unread are read)."""
    model_type = getattr(loaded.model.config, "model_type", None)
    try:
        if model_type not in LEAN_MODEL_TYPES:
            raise UnsupportedModel(f"model type {model_type!r} has no fast path")
        return ModelRunner(loaded.model, config.max_batch_size, config.max_context, decode_threads,
                           kv_dtype=kv_dtype), loaded
    except UnsupportedModel as error:
        reason = str(error)
    if loaded.quantization in LEAN_ONLY:
        if config.quantization != "auto":
            raise UnsupportedModel(f"quantization {loaded.quantization} needs a family with a fast path and "
                                   f"{type(loaded.model).__name__} runs on transformers' forward ({reason}): set "
                                   "quantization to auto, none, int8 or nf4")
        loaded = dataclasses.replace(read_unread_weights(loaded), quantization="none", fallback=None)
    runner = TransformersRunner(loaded.model, config.max_batch_size, config.max_context, decode_threads)
    log.warning("transformers_forward", model_class=type(loaded.model).__name__, reason=reason,
                quantization=loaded.quantization)
    return runner, loaded
