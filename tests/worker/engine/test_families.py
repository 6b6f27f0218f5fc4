"""Every decoder family of worker/families/ on a tiny random model built offline (testkit/tiny_families.py):
the engine in the exact mode (float32, unquantized) gives transformers `generate()`'s greedy tokens, sampled
tokens whose logprobs are the model's own, and the same seeded tokens alone or beside other rows. Gemma 2 also
through chunked prefill, the prefix cache and beam search; Qwen3 and Gemma 2 with a LoRA adapter. A model type
without a description, and a family the native q4 forward does not compute, are refused with a reason that
names what is missing."""

from __future__ import annotations

import copy
import dataclasses
import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from common.protocol import AdapterRef
from testkit.lora_adapters import write_adapter
from testkit.quality_rule import MAX_PERPLEXITY_RATIO, MIN_TOP1
from testkit.tiny_families import EOS, FAMILIES, WINDOW, tiny_family, word_tokenizer
from tests.worker.beam.helpers import beam_reference
from tests.worker.engine.runs import request, running_engine, submit
from tests.worker.lora.adapters import merged
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE, NativeUnsupported, check_supported
from worker.engine.runner import ModelRunner, UnsupportedModel
from worker.engine.w8a8 import quantize_runner

NEW_TOKENS = 12
PROMPTS = [[5, 17, 300, 42, 9, 77, 128, 3, 250, 61, 8, 99, 14, 470],  # longer than the windows (6)
           [260, 31, 7, 401, 55, 12, 90, 3, 18]]


@pytest.fixture(scope="module")
def tokenizer():
    return word_tokenizer()


def _greedy_reference(model, prompt: list[int]) -> list[int]:
    with torch.inference_mode():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS,
                             do_sample=False, pad_token_id=EOS)
    return out[0, len(prompt):].tolist()


def _sampled_logprobs(model, prompt: list[int], tokens: list[int]) -> list[float]:
    """The model's own log-probabilities of `tokens` after `prompt`, teacher-forced."""
    with torch.inference_mode():
        logits = model(torch.tensor([prompt + tokens])).logits[0, len(prompt) - 1:-1].float()
    return logits.log_softmax(-1).gather(1, torch.tensor(tokens).unsqueeze(1))[:, 0].tolist()


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_the_engine_decodes_each_family_as_transformers_does(name, tokenizer):
    """Two greedy prompts share the batch (unequal lengths: the padding mask and the windows are exercised), with
    a seeded sampled request beside them; the seeded request alone gives the same tokens."""
    loaded = tiny_family(name, tokenizer)
    runner_family = ModelRunner(loaded.model, 1, 64).family.name
    assert runner_family == name
    sampled = dict(max_tokens=NEW_TOKENS, temperature=1.0, seed=[7], logprobs=0)  # logprobs of the raw softmax
    with running_engine(loaded, f"family-{name}", max_batch_size=4, max_context=128) as engine:
        runs = [submit(engine, request(prompt_ids=prompt, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                       temperature=0), strict=True) for prompt in PROMPTS]
        crowded = submit(engine, request(prompt_ids=PROMPTS[1], **sampled), strict=True)
        for run in runs:
            run.wait()
        crowded.wait()
        alone = submit(engine, request(prompt_ids=PROMPTS[1], **sampled), strict=True).wait()
    for run, prompt in zip(runs, PROMPTS):
        assert run.finishes[0].token_ids == _greedy_reference(loaded.model, prompt), name
    tokens = crowded.finishes[0].token_ids
    assert alone.finishes[0].token_ids == tokens
    reported = [token.logprob for token in crowded.tokens()]
    assert reported == pytest.approx(_sampled_logprobs(loaded.model, PROMPTS[1], tokens), abs=1e-4)


def test_gemma2_through_chunked_prefill_the_prefix_cache_and_beams(tokenizer):
    """Small prefill chunks and a cached prefix give generate()'s greedy tokens; beam search gives transformers'
    beams and scores."""
    loaded = tiny_family("gemma2", tokenizer, seed=3)
    shared = [int(t) for t in torch.randint(2, 512, (40,), generator=torch.Generator().manual_seed(5))]
    prompts = [shared + [11, 12], shared + [40, 41, 42]]
    with running_engine(loaded, "gemma2-features", max_batch_size=4, max_context=128, max_batched_tokens=8) as engine:
        first = submit(engine, request(prompt_ids=prompts[0], max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                       temperature=0), strict=True).wait()
        second = submit(engine, request(prompt_ids=prompts[1], max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                        temperature=0), strict=True).wait()
        params = dict(num_beams=3, n=2, max_tokens=8, temperature=0.0)
        beams = submit(engine, request(prompt_ids=prompts[1], **params), strict=True).wait()
    assert first.done.cached_tokens == 0 and second.done.cached_tokens == 32  # two whole blocks of 16
    for run, prompt in zip((first, second), prompts):
        assert run.finishes[0].token_ids == _greedy_reference(loaded.model, prompt)
    sequences, scores = beam_reference(loaded.model, prompts[1], params, [EOS])
    assert [f.token_ids for f in beams.finishes] == sequences
    assert [f.score for f in beams.finishes] == pytest.approx(scores, abs=1e-3)


@pytest.mark.parametrize("name", ["qwen3", "gemma2"])
def test_a_lora_adapter_on_a_family_gives_pefts_merged_model(name, tokenizer, tmp_path):
    """An adapter on every projection of a non-Llama family, beside a base-model row: each gives what PEFT's merged
    model (or the base model) gives with `generate()`."""
    loaded = tiny_family(name, tokenizer, seed=2)
    directory = write_adapter(loaded.model, tmp_path / f"{name}-lora", 4)
    with running_engine(loaded, f"lora-{name}", max_batch_size=4, max_context=128) as engine:
        adapted = request(prompt_ids=PROMPTS[0], max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS, temperature=0)
        adapted.adapter = AdapterRef(name="shop", source=str(directory))
        runs = [submit(engine, adapted, strict=True),
                submit(engine, request(prompt_ids=PROMPTS[1], max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                       temperature=0), strict=True)]
        tokens = [run.wait().finishes[0].token_ids for run in runs]
    assert tokens == [_greedy_reference(merged(loaded.model, directory), PROMPTS[0]),
                      _greedy_reference(loaded.model, PROMPTS[1])]
    assert tokens[0] != _greedy_reference(loaded.model, PROMPTS[0])  # the adapter changed the answer


@pytest.mark.parametrize("name", sorted(FAMILIES))
def test_w8a8_quantizes_each_familys_layout(name, tokenizer):
    """w8a8 (auto's pick without VNNI) reads each family's projections in its own layout (fused, by head, experts
    kept in float32): every position's logits point where float32's do (bench/family_quality.py: the quality rule)."""
    loaded = tiny_family(name, tokenizer)
    exact, quantized = ModelRunner(loaded.model, 1, 64), ModelRunner(copy.deepcopy(loaded.model), 1, 64)
    quantize_runner(quantized, tokenizer)
    expected = exact.prefill(0, PROMPTS[0], all_logits=True).logits
    got = quantized.prefill(0, PROMPTS[0], all_logits=True).logits
    assert not torch.equal(got, expected)  # the int8 projections ran
    assert torch.nn.functional.cosine_similarity(got, expected, dim=-1).min() > 0.99


def test_a_model_type_without_a_description_is_refused_by_name():
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=2)).eval()
    with pytest.raises(UnsupportedModel, match="gpt2: no family description"):
        ModelRunner(model, 1, 32)


@pytest.mark.parametrize("name", sorted(set(FAMILIES) - {"llama", "mistral", "qwen2", "qwen3", "gemma2",
                                                          "gemma3_text"}))
def test_the_native_forward_refuses_what_it_does_not_compute(name, tokenizer):
    runner = ModelRunner(tiny_family(name, tokenizer).model, 1, 64)
    with pytest.raises(NativeUnsupported, match=f"^{name}: .* not in the native q4 forward"):
        check_supported(runner)


def _native_tracks_float32(model, cosine: float = 0.999) -> ModelRunner:
    """A q4 runner on a copy of `model` whose logits point where float32's do (cosine similarity), prefill
    (PROMPTS[0], longer than the windows) and decode; the q4 runner."""
    exact = ModelRunner(model, 1, 64)
    native = ModelRunner(copy.deepcopy(model), 1, 64, kv_dtype=KV_DTYPE)
    install_native(native)
    expected, got = (r.prefill(0, PROMPTS[0], all_logits=True).logits for r in (exact, native))
    assert torch.nn.functional.cosine_similarity(got, expected, dim=-1).min() > cosine
    assert torch.equal(got.argmax(-1), expected.argmax(-1))
    expected, got = (r.decode([7], [len(PROMPTS[0])]).logits for r in (exact, native))
    assert torch.nn.functional.cosine_similarity(got, expected, dim=-1).min() > cosine
    return native


def test_qwen3_runs_natively_with_its_per_head_norms(tokenizer):
    """forward.c norms each q and k head before the rotation: Qwen3's q4 logits point where float32's do, prefill
    and decode (without the norms they would not: the weights are perturbed away from one)."""
    _native_tracks_float32(tiny_family("qwen3", tokenizer).model)


@pytest.mark.parametrize("name", ["mistral", "qwen2"])
def test_a_sliding_window_runs_natively(name, tokenizer):
    """Mistral's window on every layer, Qwen2's on some (6 positions, the prompt 14): each token attends to its
    last 6 positions in forward.c as in transformers."""
    native = _native_tracks_float32(tiny_family(name, tokenizer).model)
    assert WINDOW in {layer.window for layer in native.native._layers}


@pytest.mark.parametrize("name", ["gemma2", "gemma3_text"])
def test_gemma_runs_natively_and_keeps_the_quality_rule(name, tokenizer):
    """forward.c computes Gemma's layer: (1 + w) norms, norms of attention's and the MLP's outputs, GeGLU,
    alternate layers' window (6, shorter than the prompts), query_pre_attn_scalar, embeddings scaled by
    sqrt(hidden) (the packed embedding's, where q4 released the float32 one); Gemma 2's soft-capped scores and
    logits, Gemma 3's per-head q/k norms and local layers' rotary base beside global ones. Its logits point where
    float32's do; teacher-forced on float32's greedy continuations, its top-1 and perplexity keep the quality
    rule of `auto` (bench/default_config.py), as bench/family_quality.py measures it (the vocabulary projection
    sharpened likewise)."""
    loaded = tiny_family(name, tokenizer)
    with torch.no_grad():
        loaded.model.get_output_embeddings().weight.mul_(4.0)  # a real model's argmax margin
    # int8 activations err more here than in Qwen3 (0.9988 measured): attention twice the hidden width, two more
    # norms a layer; the quality rule below is the bar
    native = _native_tracks_float32(loaded.model, cosine=0.998)
    assert [layer.window for layer in native.native._layers] == [WINDOW, 0, WINDOW, 0]
    released = ModelRunner(copy.deepcopy(loaded.model), 1, 64, kv_dtype=KV_DTYPE)
    install_native(released, release=True)
    exact = ModelRunner(loaded.model, 1, 64)
    agree = total = 0
    nll = nll_exact = 0.0
    for prompt in PROMPTS:
        text = prompt + _greedy_reference(loaded.model, prompt)
        targets = torch.tensor(text[1:])
        expected, got = (r.prefill(0, text[:-1], all_logits=True).logits.log_softmax(-1) for r in (exact, released))
        agree += int((got[-NEW_TOKENS:].argmax(-1) == targets[-NEW_TOKENS:]).sum())
        total += NEW_TOKENS
        nll_exact -= float(expected.gather(1, targets[:, None]).sum())
        nll -= float(got.gather(1, targets[:, None]).sum())
    positions = sum(len(prompt) - 1 + NEW_TOKENS for prompt in PROMPTS)
    assert agree / total >= MIN_TOP1
    assert math.exp((nll - nll_exact) / positions) <= MAX_PERPLEXITY_RATIO


def test_auto_serves_gemma3_in_q4_without_falling_back(tokenizer):
    """Where `auto` picked q4, the engine serves Gemma 3 natively (no w8a8 fallback): two greedy prompts batched
    give what a q4 runner gives each alone (forward.c is batch-invariant)."""
    loaded = tiny_family("gemma3_text", tokenizer)
    native = ModelRunner(copy.deepcopy(loaded.model), 1, 128, kv_dtype=KV_DTYPE)
    install_native(native)
    expected = []
    for prompt in PROMPTS:
        logits, length, tokens = native.prefill(0, prompt).logits[-1], len(prompt), []
        for _ in range(NEW_TOKENS):
            tokens.append(int(logits.argmax()))
            logits = native.decode([tokens[-1]], [length]).logits[0]
            length += 1
        expected.append(tokens)
    picked = dataclasses.replace(loaded, quantization="q4", fallback="w8a8")
    with running_engine(picked, "gemma3-q4", max_batch_size=4, max_context=128) as engine:
        assert engine.runner.native is not None and engine.loaded.quantization == "q4"
        runs = [submit(engine, request(prompt_ids=prompt, max_tokens=NEW_TOKENS, min_tokens=NEW_TOKENS,
                                       temperature=0), strict=True) for prompt in PROMPTS]
        assert [run.wait().finishes[0].token_ids for run in runs] == expected
