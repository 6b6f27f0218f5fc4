"""A tiny random Llama with an 8-token vocabulary and a real word-level tokenizer for it, so beam
statistics can be checked against the model's exact sequence probabilities."""

from __future__ import annotations

import copy

import torch
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from worker.loading import LoadedModel

WORDS = ["<eos>", "<bos>", "red", "green", "blue", "cat", "dog", "sun"]
EOS = 0


def tiny_model(seed: int = 2, sharpness: float = 2.5, layers: int = 1, positions: int = 64) -> LoadedModel:
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=len(WORDS), hidden_size=16, intermediate_size=32, num_hidden_layers=layers,
                         num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=positions,
                         bos_token_id=1, eos_token_id=EOS, pad_token_id=EOS, tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():  # a few dominant continuations, so sequences repeat across seeds
        model.lm_head.weight.mul_(sharpness / model.lm_head.weight.std())
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = EOS
    backend = Tokenizer(models.WordLevel({w: i for i, w in enumerate(WORDS)}, unk_token="<eos>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<eos>", bos_token="<bos>",
                                        pad_token="<eos>")
    return LoadedModel(model, tokenizer, "tiny-llama", torch.device("cpu"), torch.float32, "none")


def sequence_probabilities(model, prompt: list[int], max_tokens: int, temperature: float = 1.0
                           ) -> dict[tuple[int, ...], float]:
    """Every complete output (ends in EOS, or reaches max_tokens) with its exact probability under
    the softmax of logits / temperature, by enumeration in float64."""
    reference = copy.deepcopy(model).to(torch.float64)
    found: dict[tuple[int, ...], float] = {}
    frontier = {(): 1.0}
    for step in range(max_tokens):
        following = {}
        prefixes = list(frontier)
        with torch.inference_mode():
            batch = torch.tensor([prompt + list(p) for p in prefixes])
            logits = reference(batch).logits[:, -1].double()
        probs = torch.softmax(logits / temperature, dim=-1).tolist()
        for prefix, row in zip(prefixes, probs):
            for token, p in enumerate(row):
                sequence, mass = prefix + (token,), frontier[prefix] * p
                if token == EOS or step + 1 == max_tokens:
                    found[sequence] = mass
                else:
                    following[sequence] = mass
        frontier = following
    return found
