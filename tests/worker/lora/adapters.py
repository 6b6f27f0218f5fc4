"""PEFT's merged-model `generate()` as the reference for the LoRA tests, and the worker's reading of an adapter
(the adapters themselves: testkit.lora_adapters)."""

from __future__ import annotations

import copy
from pathlib import Path

import torch
from peft import PeftModel
from torch import nn

from common.protocol import AdapterRef
from tests.worker.engine.runs import request, submit
from worker.lora.adapter import LoraAdapter, lay_out, model_shape
from worker.lora.peft_format import read_adapter


def laid_out(base: nn.Module, directory: Path) -> LoraAdapter:
    """The adapter as the worker reads it, named after its directory, for a ModelRunner over `base`."""
    shape = model_shape(base.model.layers)
    return lay_out(directory.name, str(directory), read_adapter(directory, shape, 256), shape, base.dtype,
                   base.device)


def merged(base: nn.Module, directory: Path) -> nn.Module:
    """PEFT's reading of the adapter, merged into a copy of the base weights."""
    return PeftModel.from_pretrained(copy.deepcopy(base), directory).merge_and_unload().eval()


def greedy(model: nn.Module, ids: list[int], tokens: int, eos: int) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=tokens, do_sample=False, pad_token_id=eos)
    return out[0, len(ids):].tolist()


def references(base: nn.Module, directory: Path | None, prompts: list[list[int]], tokens: int,
               eos: int) -> list[list[int]]:
    """Greedy continuations of each prompt by PEFT's merged model (by the base model for None)."""
    model = base if directory is None else merged(base, directory)
    return [greedy(model, ids, tokens, eos) for ids in prompts]


def serve_greedy(engine, jobs: list[tuple[str, Path | None]], tokens: int) -> list[list[int]]:
    """Submit every (prompt, adapter directory or None) as a greedy request at once, the adapter named
    after its directory; the tokens of each."""
    runs = []
    for prompt, directory in jobs:
        generate = request(prompt, max_tokens=tokens, temperature=0)
        if directory is not None:
            generate.adapter = AdapterRef(name=directory.name, source=str(directory))
        runs.append(submit(engine, generate, strict=True))
    return [run.wait().finishes[0].token_ids for run in runs]
