"""The native forward (worker/engine/native/) against the torch runner on the same dequantized weights.

The native path quantizes each projection's input to int8 per 32 values (as llama.cpp's Q8 activations),
so its logits are close to the float reference, not equal: on SmolLM2 the largest difference measured
over a prompt was ~1.0 against logits up to ~36 (rms ~0.2). The tolerances below are set from that:
LOGIT_TOLERANCE of the largest logit for any one logit; a greedy token whose reference logit is within
TIE of the reference's best counts as a tie (the two paths may choose either), and anything else fails.
A bug (a wrong position, slot, head or layout) moves logits by far more.
"""

from __future__ import annotations

import copy
import dataclasses

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from common.protocol import Constraint, Token
from tests.worker.beam.helpers import request, run_all
from tests.worker.engine.runs import running_engine
from worker.engine.native.build import NativeUnavailable, compiler
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE, NativeForward
from worker.engine.native.pack import EXACT_4BIT, PICK_ROWS, pack4, pack8, pick, relative_error
from worker.engine.native.packed_torch import PackedEmbedding, PackedLinear
from worker.engine.runner import NATIVE_PREFILL_TOKENS, ModelRunner

LOGIT_TOLERANCE = 0.06  # of max |logit| (SmolLM2: 1.02 / 36.4 = 0.028 measured)
TIE = 1.5  # logits (SmolLM2: max per-step difference ~1.1)
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "Once upon a time"]


def _tiny_llama(seed: int, hidden: int = 128, heads: int = 4, kv_heads: int = 2, inter: int = 224) -> LlamaForCausalLM:
    """A random Llama whose projections are 4-bit-representable (each packed once, then dequantized) and whose
    vocabulary projection is not (so it is packed in 8 bits): both formats run. `inter` 224 = 7 groups: an
    odd last group in the down projection."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=96, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         tie_word_embeddings=False)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "proj" in name:
                parameter.copy_(pack4(parameter).dequantize())
            elif "norm" in name:
                parameter.uniform_(0.5, 1.5)
    return model


def _pair(model: torch.nn.Module, rows: int = 4, context: int = 128) -> tuple[ModelRunner, ModelRunner]:
    """(the torch reference, a runner whose `native` is set), each over its own copy of the model, the
    reference's vocabulary projection replaced by the packed one dequantized (the weights are then equal)."""
    reference, native = (ModelRunner(copy.deepcopy(model), rows, context) for _ in range(2))
    native.native = NativeForward(native, threads=2)
    with torch.no_grad():
        reference.lm_head.weight.copy_(native.native.matrices["lm_head"].dequantize())
    reference._head_chunks = reference.lm_head.weight.split(2048)
    return reference, native


def _close(ours: torch.Tensor, reference: torch.Tensor) -> None:
    assert ours.shape == reference.shape
    error = float((ours - reference).abs().max())
    assert error <= LOGIT_TOLERANCE * float(reference.abs().max()), error


@pytest.fixture(scope="module")
def tiny_pair():
    return _pair(_tiny_llama(3))


def test_both_weight_formats_are_picked_and_reproduce_their_weights(tiny_pair):
    matrices = tiny_pair[1].native.matrices
    assert {name: m.bits for name, m in matrices.items() if name.startswith("0.")} == \
        {"0.qkv": 4, "0.o": 4, "0.gate_up": 4, "0.down": 4}
    assert matrices["lm_head"].bits == 8
    weight = torch.randn(64, 96)
    assert relative_error(pack8(weight), weight) < 0.5 / 127 + 1e-6  # half a step of the largest value
    assert relative_error(pack4(weight), weight) > EXACT_4BIT and pick(weight).bits == 8


def test_pick_packs_a_tall_matrix_in_slices_as_it_would_whole():
    """`pick` packs PICK_ROWS rows at a time (a cold start's peak) and decides 4 or 8 bits over all of them."""
    exact = pack4(torch.randn(2 * PICK_ROWS + 3, 64)).dequantize()
    rough = exact.clone()
    rough[-1, 0] += 0.3  # one group of the last slice that 4 bits cannot hold: the whole matrix takes 8
    for weight, bits, whole in ((exact, 4, pack4(exact)), (rough, 8, pack8(rough))):
        packed = pick(weight)
        assert packed.bits == bits
        assert all(torch.equal(getattr(packed, name), getattr(whole, name)) for name in ("codes", "scale", "min"))


def test_prefill_in_chunks_matches_one_torch_prefill(tiny_pair):
    reference, native = tiny_pair
    ids = torch.randint(0, 96, (23,), generator=torch.Generator().manual_seed(1)).tolist()
    expected = reference.prefill(1, ids, all_logits=True).logits
    chunks = [native.prefill(1, ids[start:end], start=start, all_logits=True).logits
              for start, end in ((0, 9), (9, 10), (10, 23))]
    _close(torch.cat(chunks), expected)


def test_decode_rows_of_different_lengths_and_their_hidden_states(tiny_pair):
    reference, native = tiny_pair
    generator = torch.Generator().manual_seed(2)
    prompts = [torch.randint(0, 96, (length,), generator=generator).tolist() for length in (3, 11, 6)]
    for runner in tiny_pair:
        for slot, ids in enumerate(prompts):
            runner.prefill(slot, ids)
    tokens, lengths = [5, 17, 42], [len(p) for p in prompts]
    for _ in range(4):
        expected = reference.decode(tokens, lengths, want_hidden=True)
        ours = native.decode(tokens, lengths, want_hidden=True)
        _close(ours.logits, expected.logits)
        assert float((ours.hidden - expected.hidden).abs().max()) < 0.1 * float(expected.hidden.abs().max())
        tokens = expected.logits.argmax(-1).tolist()
        lengths = [length + 1 for length in lengths]


def test_a_mixed_step_of_decode_rows_and_a_prefill_chunk(tiny_pair):
    """One native call holds two decode rows and the first 7 positions of another slot's prompt."""
    reference, native = tiny_pair
    generator = torch.Generator().manual_seed(4)
    first, second, prompt = (torch.randint(0, 96, (n,), generator=generator).tolist() for n in (5, 9, 7))
    for runner in tiny_pair:
        runner.prefill(0, first)
        runner.prefill(1, second)
    expected_decode = reference.decode([7, 8], [5, 9]).logits
    expected_prefill = reference.prefill(2, prompt, all_logits=True).logits
    runner = native
    runner.cache.ensure(10, 3)
    hidden = runner.embed(torch.tensor([7, 8, *prompt])).float()
    logits, _ = runner.native.run(hidden, [0, 1] + [2] * 7, [5, 9, *range(7)], runner.cache.keys,
                                  runner.cache.values, list(range(9)))
    _close(logits[:2], expected_decode)
    _close(logits[2:], expected_prefill)


def test_a_grown_cache_and_layers_of_different_capacity(tiny_pair):
    """Layers grown one at a time (kv_cache.grow_layer) differ in capacity: each layer's own is passed."""
    reference, native = (ModelRunner(copy.deepcopy(r.model), 4, 512) for r in tiny_pair)
    native.native = NativeForward(native, threads=2)
    with torch.no_grad():
        reference.lm_head.weight.copy_(native.native.matrices["lm_head"].dequantize())
    native.cache.ensure(1, 4)
    native.cache.grow_layer(300)  # layer 0 at 300 positions, layer 1 at the initial capacity
    assert len(set(native.cache.capacities)) == 2
    ids = list(range(1, 31))  # one native chunk (runner.NATIVE_PREFILL_TOKENS)
    _close(native.prefill(0, ids, all_logits=True).logits, reference.prefill(0, ids, all_logits=True).logits)


@pytest.fixture(scope="module")
def smol_pair(smol_cpu):
    return _pair(smol_cpu.model, rows=4, context=512)


def test_the_gguf_projections_are_exactly_4bit(smol_pair):
    """SmolLM2's Q4_1 projections re-pack to float rounding; its embedding / head takes 8 bits."""
    native = smol_pair[1]
    for index, fused in enumerate(native.fused):
        for name, module in (("qkv", fused.qkv), ("o", fused.o_proj), ("gate_up", fused.gate_up),
                             ("down", fused.down_proj)):
            packed = native.native.matrices[f"{index}.{name}"]
            assert packed.bits == 4 and relative_error(packed, module.weight) < 1e-6
    assert native.native.matrices["lm_head"].bits == 8


def test_smol_greedy_tracks_the_float_reference(smol_pair, smol_cpu):
    """32 greedy tokens per prompt: every native choice is the reference's best or within TIE of it (on
    the native path's own prefix), and most are the best itself."""
    reference, native = smol_pair
    best = steps = 0
    for text in PROMPTS:
        ids = smol_cpu.tokenizer(text).input_ids
        ours, expected = native.prefill(0, ids).logits[-1], reference.prefill(0, ids).logits[-1]
        length = len(ids)
        for _ in range(32):
            token = int(ours.argmax())
            assert float(expected.max() - expected[token]) <= TIE
            best += int(token == int(expected.argmax()))
            steps += 1
            ours = native.decode([token], [length]).logits[0]
            expected = reference.decode([token], [length]).logits[0]
            length += 1
    assert best / steps > 0.95


def test_engine_in_q4_serves_every_decoding_feature(smol_cpu):
    """Penalties, bad words, n-gram bans, logprobs, beams and a JSON grammar act on the native logits."""
    loaded = dataclasses.replace(smol_cpu, quantization="q4")
    ids = smol_cpu.tokenizer(PROMPTS[2]).input_ids
    four = smol_cpu.tokenizer(" 4").input_ids
    settings = [dict(temperature=0.0, logprobs=3), dict(temperature=0.0, repetition_penalty=1.3),
                dict(temperature=0.8, top_p=0.9, seed=[7], presence_penalty=0.5),
                dict(temperature=0.0, bad_word_tokens=[four], no_repeat_ngram_size=2),
                dict(temperature=0.0, num_beams=2, n=2),
                dict(temperature=0.0, constraint=Constraint("regex", "[0-9]{3}"))]
    with running_engine(loaded, "q4-worker", max_batch_size=8, max_context=512, decode_threads=2) as engine:
        assert engine.runner.native is not None
        runs = run_all(engine, [request(ids, max_tokens=12, **s) for s in settings])
    for run in runs:
        assert run.finishes and all(f.token_ids for f in run.finishes)
    tokens = [e for e in runs[0].events if isinstance(e, Token)]
    assert tokens and all(len(t.top_logprobs) == 3 for t in tokens)
    banned = runs[3].finishes[0].token_ids
    assert all(banned[i:i + len(four)] != four for i in range(len(banned)))
    assert len(runs[4].finishes) == 2
    text = smol_cpu.tokenizer.decode(runs[5].finishes[0].token_ids, skip_special_tokens=True)
    assert text.isdigit() and len(text) == 3


def test_a_token_computes_the_same_bits_whatever_shares_its_call(tiny_pair):
    """Each token's projections, attention and norms depend only on that token and its slot's cache, and the
    threads split output rows, never a sum: a prompt prefilled whole, in chunks on one thread, or as decode
    steps beside another row gives bitwise the same logits."""
    native = tiny_pair[1]
    ids = torch.randint(0, 96, (12,), generator=torch.Generator().manual_seed(5)).tolist()
    whole = native.prefill(3, ids, all_logits=True).logits
    native.native.threads = 1
    try:
        chunked = torch.cat([native.prefill(2, ids[:5], all_logits=True).logits,
                             native.prefill(2, ids[5:], start=5, all_logits=True).logits])
    finally:
        native.native.threads = 2
    native.prefill(0, [9, 9, 9])
    stepped = [native.prefill(1, ids[:1]).logits[0]]
    for position in range(1, 12):  # row 0 (slot 0) decodes beside the prompt's row (slot 1)
        stepped.append(native.decode([4, ids[position]], [2 + position, position]).logits[1])
    assert torch.equal(whole, chunked)
    assert torch.equal(whole, torch.stack(stepped))


def test_a_runner_that_owns_its_model_keeps_only_packed_weights_and_its_torch_paths_use_them():
    """`release`: the float32 projections and embeddings are freed; the torch paths (a prefill chunk longer
    than the native one, decode steps with an adapter row) compute on the packed weights dequantized, and
    read and write the float16 KV cache the native forward shares."""
    model = _tiny_llama(6)
    reference, released = (ModelRunner(copy.deepcopy(model), 4, 128) for _ in range(2))
    install_native(released, threads=2, release=True)
    matrices = released.native.matrices
    with torch.no_grad():  # the reference's float weights = what the packed ones dequantize to
        reference.lm_head.weight.copy_(matrices["lm_head"].dequantize())
        reference.embed_tokens.weight.copy_(matrices["embed"].dequantize())
    reference._head_chunks = reference.lm_head.weight.split(2048)
    held = {name for name, p in released.model.named_parameters() if not p.is_meta}
    assert held and all("norm" in name for name in held)
    assert isinstance(released.fused[0].qkv, PackedLinear) and isinstance(released.embed_tokens, PackedEmbedding)
    assert released.cache.dtype == KV_DTYPE and reference.cache.dtype == torch.float32
    ids = torch.randint(0, 96, (NATIVE_PREFILL_TOKENS + 9,), generator=torch.Generator().manual_seed(6)).tolist()
    assert torch.equal(released.embed(torch.tensor(ids)), reference.embed(torch.tensor(ids)))
    expected = reference.prefill(0, ids, all_logits=True).logits
    _close(released.prefill(0, ids, all_logits=True).logits, expected)  # one chunk, the torch path
    assert released.scripted_layers() is not None  # PackedLinear scripts
    native, released.native = released.native, None  # decode as a step with an adapter row does
    try:
        tokens, length = [int(expected[-1].argmax())], len(ids)
        for _ in range(3):
            ours = released.decode(tokens, [length]).logits
            theirs = reference.decode(tokens, [length]).logits
            _close(ours, theirs)
            assert float((ours - theirs).abs().max()) < 1e-2 * float(theirs.abs().max())  # only KV rounding
            tokens, length = [int(theirs.argmax())], length + 1
    finally:
        released.native = native


def test_without_a_compiler_q4_says_so_in_one_line(monkeypatch):
    monkeypatch.delenv("CC", raising=False)
    monkeypatch.setenv("PATH", "")
    with pytest.raises(NativeUnavailable, match="needs a C compiler") as raised:
        compiler()
    assert "\n" not in str(raised.value)
