"""Random LoRA adapters written by PEFT itself, and PEFT's merged-model `generate()` as the reference."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import torch
from peft import LoraConfig, PeftModel, get_peft_model
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM

from common.protocol import AdapterRef
from tests.worker.engine.runs import request, submit
from worker.loading import LoadedModel
from worker.lora.adapter import LoraAdapter, lay_out, model_shape
from worker.lora.peft_format import read_adapter

ATTENTION = ["q_proj", "k_proj", "v_proj", "o_proj"]
EVERY = ATTENTION + ["gate_proj", "up_proj", "down_proj"]


def tiny_llama(tokenizer, seed: int = 0, layers: int = 2) -> LoadedModel:
    """A random Llama small enough to build in a test, on SmolLM2's tokenizer (real text in and out)."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=96, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         eos_token_id=tokenizer.eos_token_id, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, "tiny-llama", torch.device("cpu"), torch.float32, "none")


def write_adapter(base: nn.Module, directory: Path, seed: int, targets: list[str] = EVERY, rank: int = 8,
                  alpha: float = 16, strength: float = 0.5, **options) -> Path:
    """A PEFT LoRA adapter with random A and B, saved by PEFT. Each module's update B @ A * scaling gets
    `strength` times the norm of the weight it adapts: large enough to change the greedy output, not
    so large that the model only babbles."""
    torch.manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False, **options)
    model = get_peft_model(copy.deepcopy(base), config)
    with torch.no_grad():
        for module in model.modules():
            if hasattr(module, "lora_A") and "default" in module.lora_A:
                down, up = module.lora_A["default"].weight, module.lora_B["default"].weight
                update = (up @ down) * module.scaling["default"]
                up.mul_(strength * module.base_layer.weight.float().norm() / update.norm())
    model.save_pretrained(directory)
    return directory


def edit_config(directory: Path, **changes) -> Path:
    path = directory / "adapter_config.json"
    config = json.loads(path.read_text())
    config.update(changes)
    path.write_text(json.dumps(config))
    return directory


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
