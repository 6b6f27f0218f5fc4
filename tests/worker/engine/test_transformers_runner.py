"""Families with no fast path run through transformers' own forward in the engine (hf_runner.py), in the exact
mode: tiny random GPT-2, OPT, Falcon, Bloom and Gemma 3 (sliding window smaller than the prompts) built here,
each sent through the fallback whatever fast paths the lean runner has.
Greedy output equals `generate()` for rows of different lengths sharing the batch; seeded sampling reports the
logprobs of the model's own full forward; beams equal transformers' beam search; and on a tiny Llama the
fallback samples exactly what the lean runner does."""

from __future__ import annotations

import pytest
import torch
from transformers import (
    AutoModelForCausalLM,
    BloomConfig,
    FalconConfig,
    Gemma3TextConfig,
    GPT2Config,
    OPTConfig,
)

from common.protocol import AdapterRef, ModelConfig
from testkit.tiny_model import tiny_llama
from tests.logged import logged
from tests.worker.beam.helpers import beam_reference
from tests.worker.engine.runs import request, running_engine, submit
from tests.worker.lora.adapters import greedy
from worker.engine import runner_choice
from worker.engine.engine import Engine
from worker.engine.hf_runner import TransformersRunner
from worker.engine.prepare_errors import RequestRejected
from worker.engine.runner import UnsupportedModel
from worker.loading import LoadedModel

PROMPTS = ["Hi", "The quick brown fox jumps over the lazy dog and runs to the river bank, where the old miller "
           "keeps his boat tied to a post", "One two three four five", "x y"]


def family_config(family: str, vocab: int, eos: int):
    sizes = dict(vocab_size=vocab, eos_token_id=eos)
    return {
        "gpt2": lambda: GPT2Config(n_embd=32, n_layer=4, n_head=4, n_positions=128, **sizes),
        "opt": lambda: OPTConfig(hidden_size=32, num_hidden_layers=4, ffn_dim=64, num_attention_heads=4,
                                 word_embed_proj_dim=32, max_position_embeddings=128, **sizes),
        "falcon": lambda: FalconConfig(hidden_size=32, num_hidden_layers=4, num_attention_heads=4, **sizes),
        "bloom": lambda: BloomConfig(hidden_size=32, n_layer=4, n_head=4, **sizes),
        "gemma3": lambda: Gemma3TextConfig(hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                                           num_attention_heads=4, num_key_value_heads=2, head_dim=8, sliding_window=6,
                                           max_position_embeddings=128, **sizes),
    }[family]()


def tiny(family: str, tokenizer) -> LoadedModel:
    torch.manual_seed(1)
    model = AutoModelForCausalLM.from_config(family_config(family, len(tokenizer), tokenizer.eos_token_id),
                                             dtype=torch.float32).eval()
    model.generation_config.pad_token_id = tokenizer.eos_token_id
    return LoadedModel(model, tokenizer, f"tiny-{family}", torch.device("cpu"), torch.float32, "none")


def run(engine, prompt, **params):
    return submit(engine, request(prompt, **params), strict=True).wait()


@pytest.mark.parametrize("family", ["gpt2", "opt", "falcon", "bloom", "gemma3"])
def test_a_family_without_a_fast_path_decodes_as_generate_does(family, smol_tokenizer, monkeypatch):
    loaded = tiny(family, smol_tokenizer)
    monkeypatch.setattr(runner_choice, "LEAN_MODEL_TYPES", frozenset())  # the fallback, whatever has a fast path
    lines = logged(monkeypatch, runner_choice)
    # prompts prefilled in chunks of 8 tokens, a repeated one from the prefix cache
    with running_engine(loaded, family, max_batch_size=8, max_context=128, quantization="none", dtype="float32",
                        max_batched_tokens=8) as engine:
        assert isinstance(engine.runner, TransformersRunner)
        assert [(line["event"], line["model_class"]) for line in lines] == \
            [("transformers_forward", type(loaded.model).__name__)]
        runs = [submit(engine, request(p, max_tokens=12, temperature=0, ignore_eos=True), strict=True)
                for p in PROMPTS]  # concurrent rows of different lengths
        eos = smol_tokenizer.eos_token_id
        for prompt, result in zip(PROMPTS, runs):
            ids = smol_tokenizer(prompt).input_ids
            with torch.inference_mode():
                expected = loaded.model.generate(torch.tensor([ids]), max_new_tokens=12, min_new_tokens=12,
                                                 do_sample=False, pad_token_id=eos)[0, len(ids):].tolist()
            assert result.wait().finishes[0].token_ids == expected
            if prompt == PROMPTS[1]:
                cached = run(engine, prompt, max_tokens=12, temperature=0, ignore_eos=True)
                assert cached.done.cached_tokens >= 16 and cached.finishes[0].token_ids == expected

        sampled = dict(max_tokens=10, temperature=1.0, seed=[7], logprobs=0, ignore_eos=True)
        first, again = run(engine, PROMPTS[1], **sampled), run(engine, PROMPTS[1], **sampled)
        tokens = first.finishes[0].token_ids
        assert again.finishes[0].token_ids == tokens
        ids = smol_tokenizer(PROMPTS[1]).input_ids
        with torch.inference_mode():  # the model's own forward over the whole text, no cache
            logits = loaded.model(torch.tensor([ids + tokens])).logits[0, len(ids) - 1:-1]
        expected = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(tokens)[:, None])[:, 0].tolist()
        assert [t.logprob for t in first.tokens()] == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("family", ["gpt2", "gemma3"])
def test_beams_and_prompt_logprobs_on_the_fallback(family, smol_tokenizer, monkeypatch):
    loaded = tiny(family, smol_tokenizer)
    monkeypatch.setattr(runner_choice, "LEAN_MODEL_TYPES", frozenset())
    with running_engine(loaded, family, max_batch_size=8, max_context=128, quantization="none",
                        dtype="float32") as engine:
        assert isinstance(engine.runner, TransformersRunner)
        ids = smol_tokenizer(PROMPTS[1]).input_ids
        params = dict(num_beams=3, n=2, max_tokens=8)
        result = run(engine, PROMPTS[1], **params)
        expected, scores = beam_reference(loaded.model, ids, params, [smol_tokenizer.eos_token_id])
        assert [f.token_ids for f in result.finishes] == expected
        assert [f.score for f in result.finishes] == pytest.approx(scores, abs=1e-3)
        scored = run(engine, PROMPTS[1], max_tokens=1, temperature=0, prompt_logprobs=True)
        with torch.inference_mode():
            logits = loaded.model(torch.tensor([ids])).logits[0, :-1]
        expected = torch.log_softmax(logits.double(), -1).gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
        assert [p.logprob for p in scored.accepted.prompt_details[1:]] == pytest.approx(expected.tolist(), abs=1e-4)


def test_the_fallback_samples_what_the_lean_runner_samples(smol_tokenizer, monkeypatch):
    """A tiny Llama through both runners: the same seeded, penalised, top-p draws and greedy equal to generate()."""
    loaded = tiny_llama(smol_tokenizer, seed=4)
    params = dict(max_tokens=12, temperature=0.8, top_p=0.9, repetition_penalty=1.3, seed=[3, 9], n=2, logprobs=0)
    answers = []
    for lean in (True, False):
        if not lean:  # the Llama family taken off the fast path's list
            monkeypatch.setattr(runner_choice, "LEAN_MODEL_TYPES", frozenset())
        with running_engine(loaded, "llama", max_batch_size=8, max_context=128) as engine:
            assert isinstance(engine.runner, TransformersRunner) is not lean
            result = run(engine, PROMPTS[1], **params)
            answers.append(([f.token_ids for f in result.finishes],
                            [[t.logprob for t in result.tokens(i)] for i in range(2)]))
            plain = run(engine, PROMPTS[2], max_tokens=12, temperature=0)
            assert plain.finishes[0].token_ids == greedy(loaded.model, smol_tokenizer(PROMPTS[2]).input_ids, 12,
                                                         smol_tokenizer.eos_token_id)
    assert answers[0][0] == answers[1][0]
    for lean, fallback in zip(answers[0][1], answers[1][1]):
        assert fallback == pytest.approx(lean, abs=1e-4)


def test_what_the_fallback_cannot_serve_is_refused_by_name(smol_tokenizer):
    loaded = tiny("gpt2", smol_tokenizer)
    with running_engine(loaded, "gpt2", max_batch_size=4, max_context=64, quantization="none") as engine:
        generate = request("Hi", max_tokens=2)
        generate.adapter = AdapterRef(name="a", source="/x")
        with pytest.raises(RequestRejected, match="serves no LoRA") as refused:
            engine.prepare(generate)
        assert refused.value.field == "adapter"
    with pytest.raises(UnsupportedModel, match="quantization w8a8 needs a family with a fast path.*GPT2LMHeadModel"):
        Engine(LoadedModel(loaded.model, smol_tokenizer, "gpt2", torch.device("cpu"), torch.float32, "w8a8"),
               ModelConfig(quantization="w8a8", max_batch_size=4, max_context=64))
