"""The native forward's boundary (worker/engine/native/bounds.py, forward.c's index guard): a call with any index
out of range raises ValueError and writes nothing; no request's keys and values change because of another's
bad call, and no index reaches memory outside the cache.

Each index case runs twice: through `NativeForward.run` (the Python checks) and through `_call`, which skips
them (forward.c's own guard alone). A real tiny Llama (2 kv heads: a position one past a slot's capacity is
where the next slot's rows start) on the library built for this CPU.
"""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from worker.engine.native.model import KV_DTYPE, NativeForward
from worker.engine.native.packed_torch import run_on_packed
from worker.engine.runner import ModelRunner

VOCAB = 96


def _model() -> LlamaForCausalLM:
    torch.manual_seed(11)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def runner() -> ModelRunner:
    """A q4 runner whose model is released (packed embeddings, as a worker that owns its model runs), with
    slots 0 and 1 prefilled."""
    runner = ModelRunner(copy.deepcopy(_model()), 4, 64)
    runner.native = NativeForward(runner, threads=2)
    run_on_packed(runner, runner.native.matrices)
    runner.prefill(0, [1, 2, 3])
    runner.prefill(1, [4, 5, 6, 7])
    return runner


def _snapshot(runner: ModelRunner) -> list[torch.Tensor]:
    return [t.clone() for t in (*runner.cache.keys, *runner.cache.values)]


def _call(runner: ModelRunner, how: str, slots: list[int], positions: list[int], out_rows: list[int] | None = None,
          hidden: torch.Tensor | None = None):
    hidden = torch.randn(len(slots), runner.hidden_size) if hidden is None else hidden
    out_rows = list(range(len(slots))) if out_rows is None else out_rows
    keys, values = runner.cache.keys, runner.cache.values
    if how == "checked":
        return runner.native.run(hidden, slots, positions, keys, values, out_rows)
    return runner.native._call(hidden, slots, positions, keys, values, out_rows, True, False, None)


BOTH = pytest.mark.parametrize("how", ["checked", "c-guard"])


@BOTH
def test_a_position_at_the_capacity_raises_and_leaves_every_slot_as_it_was(runner, how):
    """Slot 0 at position == capacity used to land on slot 1's kv head 0, position 0, and return logits."""
    capacity = min(runner.cache.capacities)
    before = _snapshot(runner)
    with pytest.raises(ValueError, match="position"):
        _call(runner, how, [0], [capacity])
    for old, new in zip(before, _snapshot(runner)):
        assert torch.equal(old, new)


@BOTH
@pytest.mark.parametrize("slot", [4, 1 << 20, -1], ids=["one-past", "far", "negative"])
def test_a_slot_outside_the_cache_raises_without_touching_memory(runner, how, slot):
    before = _snapshot(runner)
    with pytest.raises(ValueError, match="slot"):
        _call(runner, how, [0, slot], [3, 4])
    assert all(torch.equal(old, new) for old, new in zip(before, _snapshot(runner)))


@BOTH
def test_a_negative_position_or_an_output_row_past_the_tokens_raises(runner, how):
    with pytest.raises(ValueError, match="position"):
        _call(runner, how, [0], [-1])
    with pytest.raises(ValueError, match="output row"):
        _call(runner, how, [0, 0], [3, 4], out_rows=[2])
    with pytest.raises(ValueError, match="output row"):
        _call(runner, how, [0], [3], out_rows=[0, 0])


@BOTH
def test_a_position_past_the_rotary_table_raises_whatever_the_cache_holds(runner, how):
    """A cache longer than the model's context (one the caller built) does not open the table's end."""
    rows, model = runner.native._model.max_positions, runner.native._model
    keys = [torch.zeros(4, model.kv_heads, rows + 16, model.head_dim, dtype=KV_DTYPE) for _ in range(model.layers)]
    values = [k.clone() for k in keys]
    hidden = torch.randn(1, runner.hidden_size)
    with pytest.raises(ValueError, match="rotary table" if how == "checked" else "position"):
        if how == "checked":
            runner.native.run(hidden, [0], [rows], keys, values, [0])
        else:
            runner.native._call(hidden, [0], [rows], keys, values, [0], True, False, None)
    assert not any(bool(t.any()) for t in (*keys, *values))


def test_shapes_and_lengths_that_disagree_raise(runner):
    native, keys, values = runner.native, runner.cache.keys, runner.cache.values
    hidden = torch.randn(2, runner.hidden_size)
    with pytest.raises(ValueError, match="positions"):
        native.run(hidden, [0, 1], [3], keys, values, [0])
    with pytest.raises(ValueError, match="hidden"):
        native.run(torch.randn(3, runner.hidden_size), [0, 1], [3, 4], keys, values, [0])
    with pytest.raises(ValueError, match="hidden"):
        native.run(hidden.double(), [0, 1], [3, 4], keys, values, [0])
    with pytest.raises(ValueError, match="at least one"):
        native.run(hidden[:0], [], [], keys, values, [])
    with pytest.raises(ValueError, match="layers"):
        native.run(hidden, [0, 1], [3, 4], keys[:1], values[:1], [0])
    with pytest.raises(ValueError, match=str(KV_DTYPE)):
        native.run(hidden, [0, 1], [3, 4], [k.float() for k in keys], [v.float() for v in values], [0])
    with pytest.raises(ValueError, match="capacity"):  # a cache laid out for another model
        native.run(hidden, [0, 1], [3, 4], [k[:, :1].contiguous() for k in keys], [v[:, :1].contiguous()
                                                                                  for v in values], [0])


def test_token_ids_outside_the_vocabulary_raise_on_every_native_path(runner):
    """The packed embedding used to read row -1 as the last one (and a padding row past the vocabulary)."""
    before = _snapshot(runner)
    with pytest.raises(ValueError, match="vocabulary"):
        runner.prefill(2, [5, -1])
    with pytest.raises(ValueError, match="vocabulary"):
        runner.prefill(2, [VOCAB])
    with pytest.raises(ValueError, match="vocabulary"):
        runner.decode([5, VOCAB + 3], [3, 4])
    assert all(torch.equal(old, new) for old, new in zip(before, _snapshot(runner)))


def test_good_calls_still_compute_after_refused_ones(runner):
    logits = runner.decode([5, 6], [3, 4]).logits
    assert logits.shape == (2, VOCAB) and bool(torch.isfinite(logits).all())
