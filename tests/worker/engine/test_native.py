"""The native forward (worker/engine/native/) against the torch runner on the same dequantized weights.

The native path quantizes each projection's input to int8 per 32 values (as llama.cpp's Q8 activations),
so its logits are close to the float reference, not equal: on SmolLM2 the largest difference measured
over a prompt was ~1.0 against logits up to ~36 (rms ~0.2). The tolerances below are set from that:
LOGIT_TOLERANCE of the largest logit for any one logit; a greedy token whose reference logit is within
TIE of the reference's best counts as a tie (the two paths may choose either), and anything else fails.
A bug (a wrong position, slot, head or layout) moves logits by far more.

The tiny model's tests run twice: on the library built for this CPU (AVX512-VNNI where it has it) and on the
plain-C path a CPU without it runs (built here with `-mno-avx512vnni`, build.py's SLUICE_NATIVE_FLAGS). Where
`auto` picked q4 and the native forward cannot start, the engine runs w8a8 instead (tested with a real worker).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import msgspec
import pytest
import torch
from structlog.testing import capture_logs
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.activations import ACT2FN

from common.protocol import Constraint, Finish, ModelInfo, Token, decode_event
from testkit.servers import free_port
from testkit.sluice import MODEL_CACHE, REPO, wait_for_health
from testkit.tiny_model import tiny_llama, write_tiny_model
from tests.worker.beam.helpers import request, run_all
from tests.worker.engine.runs import running_engine
from worker.cpu_features import AVX512_VNNI, cpu_features, pick_cpu_default
from worker.engine.native.build import FLAGS, NativeUnavailable, compiler, load_library
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE, NativeForward, NativeUnsupported
from worker.engine.native.pack import (
    EXACT_4BIT,
    PICK_ROWS,
    SLICE_ROWS,
    fixed_slices,
    pack4,
    pack8,
    pack_fixed,
    pick,
    pick_slices,
    relative_error,
)
from worker.engine.native.packed_torch import PackedEmbedding, PackedLinear
from worker.engine.runner import ModelRunner
from worker.engine.w8a8 import Int8Linear

PLAIN_C = "-mno-avx512vnni"  # forward.c's portable path, whatever this CPU has
LOGIT_TOLERANCE = 0.06  # of max |logit| (SmolLM2: 1.02 / 36.4 = 0.028 measured)
TIE = 1.5  # logits (SmolLM2: max per-step difference ~1.1)
PROMPTS = ["The capital of France is", "def fibonacci(n):",
           "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n", "Once upon a time"]


def _tiny_llama(seed: int, hidden: int = 128, heads: int = 4, kv_heads: int = 2, inter: int = 224,
                vocab: int = 96, head_dim: int | None = None) -> LlamaForCausalLM:
    """A random Llama whose projections are 4-bit-representable (each packed once, then dequantized) and whose
    vocabulary projection is not (so it is packed in 8 bits): both formats run. `inter` 224 = 7 groups: an
    odd number of groups in the down projection."""
    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=2,
                         num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=512,
                         tie_word_embeddings=False, head_dim=head_dim or hidden // heads)
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


@contextlib.contextmanager
def native_flags(flags: str):
    """SLUICE_NATIVE_FLAGS for what is built (or picked from the cache) meanwhile."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SLUICE_NATIVE_FLAGS", flags)
        yield


@pytest.fixture(scope="module", params=["", PLAIN_C], ids=["this-cpu", "plain-c"])
def tiny_pair(request):
    if request.param and platform.machine() not in ("x86_64", "AMD64"):
        pytest.skip("the plain-C build's flag is x86's")
    with native_flags(request.param):
        return _pair(_tiny_llama(3))


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the plain-C build's flag is x86's")
def test_the_plain_c_build_is_its_own_library_without_vnni():
    """What makes the plain-c runs above the fallback: the compiler defines no __AVX512VNNI__ under these
    flags (what forward.c tests for its fast path), and the library is another one than this CPU's default."""
    def defines(*extra: str) -> str:
        return subprocess.run([compiler(), *FLAGS[:-1], *extra, "-dM", "-E", "-x", "c", os.devnull],
                              capture_output=True, text=True, check=True).stdout

    assert "__AVX512VNNI__" not in defines(PLAIN_C)
    if AVX512_VNNI in cpu_features():  # here the flag is what turns the fast path off
        assert "__AVX512VNNI__" in defines()
    with native_flags(PLAIN_C):
        plain = load_library()
    assert Path(plain._name).parent != Path(load_library()._name).parent


def test_both_weight_formats_are_picked_and_reproduce_their_weights(tiny_pair):
    matrices = tiny_pair[1].native.matrices
    assert {name: m.bits for name, m in matrices.items() if name.startswith("0.")} == \
        {"0.qkv": 4, "0.o": 4, "0.gate_up": 4, "0.down": 4}
    assert matrices["lm_head"].bits == 8
    weight = torch.randn(64, 96)
    assert relative_error(pack8(weight), weight) < 0.5 / 127 + 1e-6  # half a step of the largest value
    assert relative_error(pack4(weight), weight) > EXACT_4BIT and pick(weight).bits == 8


@pytest.mark.parametrize("pack", [pack4, pack8])
def test_the_tile_layout_keeps_every_row_of_a_ragged_matrix(pack):
    """37 rows (two 16-row tiles and 5 rows of a third) of 3 groups: the packed layout gives back each row's
    codes, whole or picked, and a 4-bit matrix re-packs to the same bytes."""
    weight = torch.randn(37, 96, generator=torch.Generator().manual_seed(6))
    packed = pack(weight)
    assert (packed.rows, packed.cols) == (37, 96) and packed.tiles.shape == (3, 3, 16 * 32 * packed.bits // 8 + 64)
    groups = weight.view(37, 3, 32)
    peak = groups.abs().amax(-1, keepdim=True)
    step = peak / 127 if packed.bits == 8 else (groups.amax(-1, keepdim=True) - groups.amin(-1, keepdim=True)) / 15
    # half a step, and the half-float rounding (2^-11 relative) of the group's scale and minimum
    assert bool(((packed.dequantize() - weight).view(37, 3, 32).abs() <= 0.5 * step + 2 ** -9 * peak).all())
    picked = torch.tensor([36, 0, 17, 5])
    assert torch.equal(packed.dequantize(picked), packed.dequantize()[picked])
    if pack is pack4:
        assert torch.equal(pack4(packed.dequantize()).tiles, packed.tiles)


@pytest.mark.parametrize("pack", [pack4, pack8])
def test_packed_modules_compute_with_the_dequantized_rows_whole_and_in_slices(pack):
    """PackedLinear over 100 rows (7 tiles, the last ragged), whole and 32 rows at a time, and PackedEmbedding's
    picked rows, eager and scripted, equal the dequantized matrix's."""
    packed = pack(torch.randn(100, 96, generator=torch.Generator().manual_seed(8)))
    weight, bias = packed.dequantize(), torch.randn(100)
    x, ids = torch.randn(5, 96), torch.tensor([[99, 0], [17, 64]])
    whole, sliced = PackedLinear(packed, bias), PackedLinear(packed, bias)
    sliced.slice_rows = 32
    for module in (whole, sliced, torch.jit.script(sliced)):
        _close(module(x), torch.nn.functional.linear(x, weight, bias))
    for embedding in (PackedEmbedding(packed), torch.jit.script(PackedEmbedding(packed))):
        assert torch.equal(embedding(ids), weight[ids])


@pytest.mark.parametrize("bad", [float("inf"), float("nan"), 2.0 ** 16])
def test_weights_whose_scales_half_floats_cannot_hold_are_refused_by_matrix(bad):
    """Scales and minimums are half floats: a weight beyond +-2^15 (or not finite) is refused, not packed to
    infinities; a model holding one does not run natively, and the error names the matrix."""
    weight = torch.randn(16, 32)
    weight[3, 5] = bad
    with pytest.raises(ValueError, match="finite and within"):
        pick(weight)
    runner = ModelRunner(_tiny_llama(9), 2, 64)
    with torch.no_grad():
        runner.layers[1].mlp.down_proj.weight[0, 0] = bad
    with pytest.raises(NativeUnsupported, match="q4 cannot pack 1.down"):
        NativeForward(runner)


def test_pick_packs_a_tall_matrix_in_slices_as_it_would_whole():
    """`pick` packs PICK_ROWS rows at a time (a cold start's peak) and decides 4 or 8 bits over all of them."""
    exact = pack4(torch.randn(2 * PICK_ROWS + 3, 64)).dequantize()
    rough = exact.clone()
    rough[-1, 0] += 0.3  # one group of the last slice that 4 bits cannot hold: the whole matrix takes 8
    for weight, bits, whole in ((exact, 4, pack4(exact)), (rough, 8, pack8(rough))):
        packed = pick(weight)
        assert packed.bits == bits
        assert torch.equal(packed.tiles, whole.tiles) and packed.rows == whole.rows


def test_pick_of_slices_read_one_at_a_time_packs_as_pick_of_the_whole():
    """`pick_slices` (a file's matrix read SLICE_ROWS rows at a time) decides and packs as `pick` does."""
    exact = pack4(torch.randn(2 * PICK_ROWS + 3, 64)).dequantize()
    rough = exact.clone()
    rough[-1, 0] += 0.3  # one group of the last slice that 4 bits cannot hold: the whole matrix takes 8
    for weight, bits in ((exact, 4), (rough, 8)):
        whole, sliced = pick(weight), pick_slices(lambda w=weight: iter(w.split(SLICE_ROWS)), len(weight))
        assert sliced.bits == whole.bits == bits and sliced.rows == whole.rows
        assert torch.equal(sliced.tiles, whole.tiles)
    with pytest.raises(ValueError, match="hold 0 rows, not 5"):
        pick_slices(lambda: iter([]), 5)
    with pytest.raises(ValueError, match="whole tiles"):  # a ragged slice before the last
        pick_slices(lambda: iter(exact.split(SLICE_ROWS - 1)), len(exact))


def test_a_fixed_width_packs_a_matrix_4_bits_do_not_reproduce_and_round_trips_one_they_do():
    """A family's `vocab_bits`: `pack_fixed` packs in that width whatever `pick` would choose (Gemma 3's Q8_0
    vocabulary in 4 bits), its scales fitted to the codes (less squared error than pack4's range); a matrix 4 bits
    reproduce comes back as it was; read a slice at a time (`fixed_slices`, a GGUF's rows) it packs the same
    bytes; and 8 bits hold a matrix 4 would reproduce too."""
    weight = torch.randn(2 * PICK_ROWS + 3, 64, generator=torch.Generator().manual_seed(12))
    four = pack_fixed(weight, 4)
    assert pick(weight).bits == 8 and (four.bits, four.rows, four.cols) == (4, len(weight), 64)
    assert relative_error(four, weight) > EXACT_4BIT
    fitted, ranged = (float((packed.dequantize() - weight).square().sum()) for packed in (four, pack4(weight)))
    assert fitted < 0.95 * ranged
    sliced = fixed_slices(lambda: iter(weight.split(SLICE_ROWS)), len(weight), 4)
    assert sliced.bits == 4 and sliced.rows == four.rows and torch.equal(sliced.tiles, four.tiles)
    exact = pack4(weight).dequantize()
    assert relative_error(pack_fixed(exact, 4), exact) < EXACT_4BIT
    assert pick(exact).bits == 4 and pack_fixed(exact, 8).bits == 8
    assert relative_error(pack_fixed(exact, 8), exact) < 0.5 / 127 + 1e-6
    with pytest.raises(ValueError, match="whole tiles"):
        fixed_slices(lambda: iter(weight.split(SLICE_ROWS - 1)), len(weight), 4)


def test_a_familys_vocab_bits_sets_the_vocabulary_matrices_alone_and_keys_the_pack_cache(tmp_path):
    """`vocab_bits = 4` packs the vocabulary projection (and an untied embedding) in 4 bits where `pick` gives 8,
    leaves the layers' matrices as `pick` has them, and is part of the pack cache's recipe: a start with it does
    not read back the 8-bit vocabulary an earlier start kept, nor the other way round."""
    def runner(bits: int | None) -> ModelRunner:
        built = ModelRunner(_tiny_llama(3), 2, 64, kv_dtype=KV_DTYPE)
        built.family = dataclasses.replace(built.family, vocab_bits=bits)
        return built

    for bits, vocabulary in ((None, 8), (4, 4), (None, 8), (8, 8)):
        native = install_native(runner(bits), 1, cache=tmp_path, weights_id="tiny-3")
        assert {name: m.bits for name, m in native.matrices.items()} == {
            **{f"{layer}.{part}": 4 for layer in (0, 1) for part in ("qkv", "o", "gate_up", "down")},
            "lm_head": vocabulary, "embed": vocabulary}
    entries = [entry for entry in (tmp_path / "q4-packed").iterdir() if not entry.name.startswith(".")]
    assert len(entries) == 3  # None, 4 and 8: three recipes
    with pytest.raises(NativeUnsupported, match="4 or 8 bits, not 6"):
        install_native(runner(6))


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
    ids = list(range(1, 31))
    _close(native.prefill(0, ids, all_logits=True).logits, reference.prefill(0, ids, all_logits=True).logits)


def _matches_torch_whole_and_in_pieces(reference: ModelRunner, native: ModelRunner, ids: list[int],
                                       cuts: tuple[int, ...]) -> None:
    """The prompt prefilled whole (slot 0) matches torch, and bitwise its prefill in pieces cut at `cuts` (slot 1)."""
    whole = native.prefill(0, ids, all_logits=True).logits
    _close(whole, reference.prefill(0, ids, all_logits=True).logits)
    bounds = [0, *cuts, len(ids)]
    pieces = torch.cat([native.prefill(1, ids[start:end], start=start, all_logits=True).logits
                        for start, end in zip(bounds, bounds[1:])])
    assert torch.equal(whole, pieces)


def test_ragged_tiles_match_torch_and_keep_each_tokens_bits():
    """Shapes off the register tiles (16 rows x 8 tokens): q/k/v of 360 rows and a vocabulary of 100 (the last
    tile part empty), inputs of 3 and 5 groups, 21-token chunks (8 + 8 + 5). Against torch, and bitwise the
    same whether the chunk runs whole or as 3 + 17 + 1 tokens."""
    reference, native = _pair(_tiny_llama(8, hidden=96, heads=8, kv_heads=1, head_dim=36, inter=160, vocab=100))
    assert native.native.matrices["0.qkv"].rows == 360 and native.native.matrices["lm_head"].rows == 100
    ids = torch.randint(0, 100, (21,), generator=torch.Generator().manual_seed(9)).tolist()
    _matches_torch_whole_and_in_pieces(reference, native, ids, (3, 20))


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


@pytest.mark.parametrize(("hidden", "heads", "kv_heads", "head_dim"), [(160, 40, 1, 8), (64, 4, 2, 80)],
                         ids=["40-heads-a-group", "dim-80"])
def test_attention_jobs_of_every_shape_match_torch_and_keep_each_tokens_bits(hidden, heads, kv_heads, head_dim):
    """Attention runs in jobs of one slot's tokens x up to 32 query heads of a kv head, over 16 positions at a
    time: 40 heads sharing one kv head take two jobs a token (32 + 8); a head of 80 values is 64 in registers
    and a tail of 16. A 101-token prompt (positions off the 16s) against torch, and bitwise the same whole
    or in pieces of 1, 37 and 63 tokens."""
    reference, native = _pair(_tiny_llama(11, hidden=hidden, heads=heads, kv_heads=kv_heads, head_dim=head_dim))
    ids = torch.randint(0, 96, (101,), generator=torch.Generator().manual_seed(12)).tolist()
    _matches_torch_whole_and_in_pieces(reference, native, ids, (1, 38))


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
    """`release`: the float32 projections and embeddings are freed; the torch paths (prefill and decode
    steps with an adapter row) compute on the packed weights dequantized, and read and write the float16 KV
    cache the native forward shares."""
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
    ids = torch.randint(0, 96, (41,), generator=torch.Generator().manual_seed(6)).tolist()
    assert torch.equal(released.embed(torch.tensor(ids)), reference.embed(torch.tensor(ids)))
    expected = reference.prefill(0, ids, all_logits=True).logits
    assert released.scripted_layers() is not None  # PackedLinear scripts
    native, released.native = released.native, None  # the torch path, as a row with an adapter takes
    try:
        _close(released.prefill(0, ids, all_logits=True).logits, expected)
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


BROKEN_BUILDS = {"no-compiler": {"CC": "/nowhere/cc"}, "compiler-fails": {"CC": "false"},
                 "flag-refused": {"SLUICE_NATIVE_FLAGS": "--no-such-flag-for-sluice"}}


@pytest.fixture(scope="module")
def tiny_loaded(smol_cpu):
    return tiny_llama(smol_cpu.tokenizer, seed=4)


@pytest.mark.parametrize("broken", BROKEN_BUILDS.values(), ids=BROKEN_BUILDS.keys())
def test_where_auto_picked_q4_a_failed_native_start_runs_w8a8_with_one_line(tiny_loaded, tmp_path, monkeypatch,
                                                                               broken):
    """What the loader hands the engine where `auto` picked q4 (its fallback w8a8): a compiler that is not
    there, one that fails, or flags it refuses leave the engine on w8a8, serving, and one warning says why."""
    monkeypatch.setenv("SLUICE_NATIVE_CACHE", str(tmp_path))  # nothing built before stands in
    for name, value in broken.items():
        monkeypatch.setenv(name, value)
    picked = dataclasses.replace(tiny_loaded, quantization="q4", fallback="w8a8")
    with capture_logs() as logs, running_engine(picked, "fallback", max_batch_size=2, max_context=64) as engine:
        assert engine.runner.native is None and isinstance(engine.runner.fused[0].qkv, Int8Linear)
        assert (engine.loaded.quantization, engine.loaded.fallback) == ("w8a8", None)
        [run] = run_all(engine, [request([1, 2, 3], max_tokens=4, min_tokens=4, temperature=0.0)])
    assert len(run.finishes[0].token_ids) == 4
    [warning] = [entry for entry in logs if entry["event"] == "native_forward_unavailable"]
    assert warning["log_level"] == "warning" and warning["fallback"] == "w8a8"
    assert "\n" not in warning["reason"] and ("compil" in warning["reason"] or "C compiler" in warning["reason"])


def test_where_auto_picked_q4_a_model_forward_c_does_not_run_gets_w8a8(tiny_loaded):
    """An exact-GELU-gated MLP (forward.c computes SiLU and tanh-GELU): the engine serves the model in w8a8."""
    model = copy.deepcopy(tiny_loaded.model)
    model.config.hidden_act = "gelu"
    for layer in model.model.layers:
        layer.mlp.act_fn = ACT2FN["gelu"]
    picked = dataclasses.replace(tiny_loaded, model=model, quantization="q4", fallback="w8a8")
    with capture_logs() as logs, running_engine(picked, "gelu", max_batch_size=2, max_context=64) as engine:
        assert engine.runner.native is None and engine.loaded.quantization == "w8a8"
        [run] = run_all(engine, [request([1, 2, 3], max_tokens=4, min_tokens=4, temperature=0.0)])
    assert len(run.finishes[0].token_ids) == 4
    [warning] = [entry for entry in logs if entry["event"] == "native_forward_unavailable"]
    assert "SiLU" in warning["reason"]


def test_a_configured_q4_whose_build_fails_fails_the_start_in_one_line(tiny_loaded, tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_NATIVE_CACHE", str(tmp_path))
    monkeypatch.setenv("SLUICE_NATIVE_FLAGS", "--no-such-flag-for-sluice")
    with pytest.raises(NativeUnavailable, match="compiling forward.c failed") as raised, \
            running_engine(dataclasses.replace(tiny_loaded, quantization="q4"), "configured", max_context=64):
        pass
    assert "\n" not in str(raised.value) and "no-such-flag-for-sluice" in str(raised.value)


def test_a_worker_whose_auto_q4_cannot_build_serves_w8a8(tmp_path):
    """The real start (`python -m worker`, quantization and dtype `auto`) on a CPU where auto picks q4, with
    a compiler that fails: the worker reports w8a8, serves, and logged the fallback in one line."""
    engines = frozenset(torch.backends.quantized.supported_engines)
    if pick_cpu_default(cpu_features(), engines, None).quantization != "q4":
        pytest.skip("auto does not pick q4 on this CPU")
    model = write_tiny_model(tmp_path / "tiny")
    port, log = free_port(), tmp_path / "worker.log"
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(MODEL_CACHE), "SLUICE_NATIVE_CACHE": str(tmp_path / "native"),
           "SLUICE_LOG_FORMAT": "json",
           "CC": shutil.which("false") or "false"}
    with log.open("w") as out:
        process = subprocess.Popen([sys.executable, "-m", "worker", "--port", str(port), "--data-dir",
                                    str(tmp_path / "data"), "--model-json",
                                    json.dumps({"source": str(model), "max_batch_size": 2, "max_context": 128})],
                                   cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        try:
            wait_for_health(process, url, 300, "the worker")
            info = msgspec.json.decode(httpx.get(f"{url}/info", timeout=30).content, type=ModelInfo)
            reply = httpx.post(f"{url}/generate", timeout=120, content=msgspec.json.encode(
                request([1, 2, 3], max_tokens=3, min_tokens=3, temperature=0.0)))
        finally:
            process.terminate()
            process.wait(timeout=30)
    assert info.quantization == "w8a8"
    assert reply.status_code == 200, reply.text
    events = [decode_event(line) for line in reply.content.splitlines() if line]
    assert [len(e.token_ids) for e in events if isinstance(e, Finish)] == [3]
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    [picked] = [line for line in lines if line.get("event") == "compute_picked"]
    assert picked["quantization"] == "q4"
    [fallback] = [line for line in lines if line.get("event") == "native_forward_unavailable"]
    assert fallback["fallback"] == "w8a8" and "compiling forward.c failed" in fallback["reason"]


def test_pick_of_slices_measures_4_bits_as_their_packs_dequantize():
    """`pick_slices` measures 4 bits' error from the codes and scales themselves, not from laid-out tiles: the
    same decision at the edge of EXACT_4BIT, either side of it."""
    exact = pack4(torch.randn(3 * SLICE_ROWS, 64)).dequantize()
    largest = float(exact.abs().max())
    for bump, bits in ((0.5, 4), (2.0, 8)):  # an error of half / twice what EXACT_4BIT allows, in one weight
        weight = exact.clone()
        weight[SLICE_ROWS + 7, 5] += bump * EXACT_4BIT * largest
        whole, sliced = pick(weight), pick_slices(lambda w=weight: iter(w.split(SLICE_ROWS)), len(weight))
        assert whole.bits == sliced.bits == bits and torch.equal(whole.tiles, sliced.tiles)
