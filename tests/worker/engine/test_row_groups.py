"""Decode row groups (runner.py): contiguous groups of rows run their forward in parallel threads,
through the scripted decode layer (decode_layer.py). Each group's logits are exactly what one thread
computes for those rows; the scripted layer is exactly the Python path."""

from __future__ import annotations

import os
import threading
import time

import pytest
import torch
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, Qwen3Config, Qwen3ForCausalLM

from common.protocol import ModelConfig
from gateway.config import load_settings
from worker.engine.decode_layer import script_decode_layers
from worker.engine.helper_threads import HelperThreads
from worker.engine.runner import MIN_GROUP_ROWS, ModelRunner
from worker.engine.w8a8 import quantize_runner
from worker.threads import decode_threads

LENGTHS = [5, 9, 3, 12, 7, 7, 2, 10]  # unequal: the attention mask is exercised


def _tiny(kind=LlamaForCausalLM, config=LlamaConfig, seed: int = 0, **extra) -> nn.Module:
    torch.manual_seed(seed)
    return kind(config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **extra)).eval()


def _prompts(count: int, seed: int = 1) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 96, (LENGTHS[i % len(LENGTHS)],), generator=generator).tolist() for i in range(count)]


def _runner(model, prompts, decode_threads=1) -> ModelRunner:
    """A runner whose slot i holds prompt i minus its last token (what the engine prefills)."""
    runner = ModelRunner(model, len(prompts), 64, decode_threads=decode_threads)
    for slot, prompt in enumerate(prompts):
        runner.prefill(slot, prompt[:-1])
    return runner


def _decode(runner, prompts, **options):
    return runner.decode([p[-1] for p in prompts], [len(p) - 1 for p in prompts], **options)


def _python_path(runner: ModelRunner) -> ModelRunner:
    runner._decode_layers = None  # what a runner whose layers do not script runs
    return runner


def _python_in_groups(model, prompts, groups: list[tuple[int, int]]) -> torch.Tensor:
    """The Python path's logits, each row group decoded alone: what a grouped step computes, bit for bit, on any
    host (one thread's GEMM over 8 rows and over 4 may round differently: MKL does on AVX-512 hosts with AMX)."""
    return torch.cat([_decode(_python_path(_runner(model, prompts[start:end], decode_threads=2)),
                              prompts[start:end]).logits for start, end in groups])


def test_the_scripted_decode_step_is_the_python_path_and_matches_transformers():
    model, prompts = _tiny(), _prompts(6)
    scripted = _decode(_runner(model, prompts), prompts, want_hidden=True)
    python = _decode(_python_path(_runner(model, prompts)), prompts, want_hidden=True)
    assert torch.equal(scripted.logits, python.logits) and torch.equal(scripted.hidden, python.hidden)
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            reference = model(torch.tensor([prompt])).logits[0, -1]
            assert torch.allclose(scripted.logits[row], reference, atol=1e-5), row


def test_one_row_decodes_through_the_scripted_stack_as_the_python_path_does():
    """A single stream (one row, SDPA's attention) runs the scripted stack too, with the same logits."""
    model, prompts = _tiny(), _prompts(1)
    runner = _runner(model, prompts)
    scripted = _decode(runner, prompts, want_hidden=True)
    python = _decode(_python_path(_runner(model, prompts)), prompts, want_hidden=True)
    assert runner.scripted_layers() is not None
    assert torch.equal(scripted.logits, python.logits) and torch.equal(scripted.hidden, python.hidden)
    with torch.inference_mode():
        reference = model(torch.tensor(prompts)).logits[0, -1]
    assert torch.allclose(scripted.logits[0], reference, atol=1e-5)
    # and the next step reads the key and value that step wrote, in both paths alike
    following = [prompts[0] + [int(scripted.logits[0].argmax())]]
    scripted_runner, python_runner = _runner(model, prompts), _python_path(_runner(model, prompts))
    for runner in (scripted_runner, python_runner):
        _decode(runner, prompts)
    assert torch.equal(_decode(scripted_runner, following).logits, _decode(python_runner, following).logits)


def test_equal_lengths_take_the_unmasked_path_and_agree_too():
    model = _tiny()
    prompts = [p[:4] for p in _prompts(5) if len(p) >= 4]
    scripted = _decode(_runner(model, prompts), prompts)
    python = _decode(_python_path(_runner(model, prompts)), prompts)
    assert torch.equal(scripted.logits, python.logits)


def test_each_row_group_gets_exactly_what_one_thread_computes_for_its_rows():
    model, prompts = _tiny(), _prompts(8)
    override = torch.randn(64)
    grouped = _decode(_runner(model, prompts, decode_threads=2), prompts, want_hidden=True,
                      embeds_override={5: override})
    first, second = prompts[:4], prompts[4:]  # 4 rows: one group, on this thread (prefilled alike)
    alone_first = _decode(_runner(model, first, decode_threads=2), first, want_hidden=True)
    alone_second = _decode(_runner(model, second, decode_threads=2), second, want_hidden=True,
                           embeds_override={1: override})
    assert torch.equal(grouped.logits, torch.cat([alone_first.logits, alone_second.logits]))
    assert torch.equal(grouped.hidden, torch.cat([alone_first.hidden, alone_second.hidden]))
    # and the whole step still agrees with one thread over all rows, up to float32 rounding
    single = _decode(_runner(model, prompts), prompts, embeds_override={5: override})
    assert torch.allclose(grouped.logits, single.logits, atol=1e-5)


def test_groups_write_each_rows_key_and_value_into_its_own_slot():
    model, prompts = _tiny(), _prompts(8)
    grouped, single = _runner(model, prompts, decode_threads=2), _runner(model, prompts)
    _decode(grouped, prompts)
    _decode(single, prompts)
    for layer in range(2):
        assert torch.allclose(grouped.cache.keys[layer], single.cache.keys[layer], atol=1e-5)
        assert torch.allclose(grouped.cache.values[layer], single.cache.values[layer], atol=1e-5)


@pytest.mark.parametrize(("threads", "rows", "groups"), [
    (2, 1, [(0, 1)]),
    (2, 2 * MIN_GROUP_ROWS - 1, [(0, 2 * MIN_GROUP_ROWS - 1)]),  # too few rows for two groups
    (2, 2 * MIN_GROUP_ROWS, [(0, MIN_GROUP_ROWS), (MIN_GROUP_ROWS, 2 * MIN_GROUP_ROWS)]),
    (2, 17, [(0, 8), (8, 17)]),
    (3, 16, [(0, 5), (5, 10), (10, 16)]),
    (1, 16, [(0, 16)]),
])
def test_row_groups_are_contiguous_and_large_enough(threads, rows, groups):
    assert _runner(_tiny(), _prompts(1), decode_threads=threads)._row_groups(rows) == groups


def test_layers_that_do_not_script_keep_the_python_path_in_one_group():
    """Qwen3's per-head q/k norms are not in the scripted layer: the runner decodes in one thread."""
    model = _tiny(Qwen3ForCausalLM, Qwen3Config, head_dim=16)
    prompts = _prompts(8)
    runner = _runner(model, prompts, decode_threads=2)
    assert runner._row_groups(8) == [(0, 8)]
    out = _decode(runner, prompts)
    with torch.inference_mode():
        for row, prompt in enumerate(prompts):
            assert torch.allclose(out.logits[row], model(torch.tensor([prompt])).logits[0, -1], atol=1e-5)


class _PythonOnlyActivation(nn.Module):
    def forward(self, x):
        return nn.functional.silu(x) if isinstance(x, torch.Tensor) and not hasattr(x, "_nope") else x


def test_a_deferred_runner_decodes_in_one_group_until_script_now_has_compiled_its_layers():
    """A worker's start (Engine.finish_start): the layers are compiled before it returns, not beside the
    first decode steps, so the first request already decodes in row groups."""
    model, prompts = _tiny(), _prompts(8)
    runner = _runner(model, prompts, decode_threads=2)
    runner.defer_scripting()
    python = _decode(runner, prompts)
    assert runner._row_groups(8) == [(0, 8)]
    runner.script_now()
    assert runner.scripted_layers() is not None and runner._row_groups(8) == [(0, 4), (4, 8)]
    grouped = _decode(runner, prompts).logits
    assert torch.equal(grouped, _python_in_groups(model, prompts, [(0, 4), (4, 8)]))
    assert torch.allclose(grouped, python.logits, atol=1e-5)  # one group over all rows, up to float32 rounding


def test_the_stack_runs_as_compiled_without_the_executors_optimization_passes():
    """The profiling executor would record the stack's first call and optimize its graph at the second
    (seconds of a core on the real model, the first steps of a woken worker's burst): the runner's calls, of
    every shape, leave it without an optimized plan, and decode exactly as the Python path."""
    # five layers: a stack type of its own (the executor's plan belongs to the type, shared by its instances)
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=5,
                                         num_attention_heads=4, num_key_value_heads=2,
                                         max_position_embeddings=64)).eval()
    prompts = _prompts(8)
    runner = _runner(model, prompts, decode_threads=2)
    assert runner._row_groups(8) == [(0, 4), (4, 8)]
    expected = _python_in_groups(model, prompts, [(0, 4), (4, 8)])  # prefilled alike
    assert torch.equal(_decode(runner, prompts).logits, expected)
    _decode(runner, prompts[:1])  # one row: no mask
    assert torch.equal(_decode(runner, prompts).logits, expected)
    with pytest.raises(RuntimeError):  # "optimized_plan_ ... not initialized": no optimization ran
        runner.scripted_layers().get_debug_state()
    stack = script_decode_layers(runner)
    with torch.inference_mode():
        for _ in range(2):  # called plainly, the executor optimizes at the second call: what the test rules out
            stack(*_stack_inputs(runner, prompts))
    assert stack.get_debug_state().execution_plans


def _stack_inputs(runner: ModelRunner, prompts: list[list[int]]) -> tuple:
    lengths = torch.tensor([[len(p) - 1] for p in prompts])
    hidden = runner.embed(torch.tensor([[p[-1]] for p in prompts]))
    longest = int(lengths.max()) + 1
    mask = (runner._positions[:longest].unsqueeze(0) <= lengths).view(len(prompts), 1, 1, longest)
    slots = runner.cache.decode_slots(0, len(prompts), lengths[:, 0])
    cos, sin = runner._rope(hidden, lengths)[None]  # the one rotary table of a Llama
    return (hidden, cos, sin, mask, slots, runner.cache.keys, runner.cache.values, 0, longest,
            [], [[] for _ in runner.layers])


def test_a_layer_that_fails_to_script_falls_back_to_the_python_path():
    model, prompts = _tiny(), _prompts(8)
    runner = _runner(model, prompts, decode_threads=2)
    runner.fused[0].act = _PythonOnlyActivation()  # hasattr on a tensor: TorchScript refuses it
    runner.projections_changed()
    assert runner.scripted_layers() is None and runner._row_groups(8) == [(0, 8)]
    assert torch.allclose(_decode(runner, prompts).logits, _decode(_runner(model, prompts), prompts).logits, atol=1e-6)


@pytest.mark.parametrize("rows", [5, 1])
def test_w8a8_scripted_step_is_its_python_path_on_the_real_weights(smol_cpu, rows):
    prompts = [smol_cpu.tokenizer(text).input_ids for text in ("The river town", "def parse(line):", "Dear team,",
                                                           "Once upon a time there was", "1, 2, 3,")][:rows]
    runners = [ModelRunner(smol_cpu.model, len(prompts), 64) for _ in range(2)]
    for runner in runners:
        quantize_runner(runner, smol_cpu.tokenizer)
        for slot, prompt in enumerate(prompts):
            runner.prefill(slot, prompt[:-1])
    scripted, python = _decode(runners[0], prompts), _decode(_python_path(runners[1]), prompts)
    assert runners[0].scripted_layers() is not None
    assert torch.equal(scripted.logits, python.logits)


def test_helpers_return_results_in_order_and_run_in_parallel_threads():
    helpers = HelperThreads(2)
    names = helpers.run([lambda i=i: (i, threading.current_thread().name) for i in range(3)])
    assert [i for i, _ in names] == [0, 1, 2]
    assert names[0][1] == threading.current_thread().name and len({name for _, name in names}) == 3
    assert all(t.daemon for t in threading.enumerate() if t.name.startswith("sluice-helper"))


def test_a_failing_call_is_raised_after_every_call_finished():
    helpers, finished = HelperThreads(1), []

    def slow():
        time.sleep(0.2)
        finished.append("slow")

    def fail():
        raise KeyError("boom")

    with pytest.raises(KeyError, match="boom"):
        helpers.run([fail, slow])
    assert finished == ["slow"]
    assert helpers.run([lambda: 1, lambda: 2]) == [1, 2]  # the helper survives a failure


def test_more_calls_than_threads_is_refused():
    with pytest.raises(ValueError, match="3 calls for 1 helpers"):
        HelperThreads(1).run([lambda: 0] * 3)


def test_decode_threads_default_to_the_cores_torch_leaves():
    assert decode_threads(ModelConfig(decode_threads=3)) == 3
    assert decode_threads(ModelConfig()) == max(1, (os.cpu_count() or 1) // torch.get_num_threads())


def test_config_refuses_negative_decode_threads(tmp_path):
    config = tmp_path / "sluice.toml"
    config.write_text("[[models]]\ndecode_threads = -1\n")
    with pytest.raises(SystemExit, match="decode_threads"):
        load_settings(str(config))
    config.write_text("[[models]]\ndecode_threads = 2\n")
    assert load_settings(str(config)).models[0].decode_threads == 2
