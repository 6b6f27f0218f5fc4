"""LoRA on a tiny random Llama: each row's logits and greedy tokens equal PEFT's merged model for that
row's adapter, whatever else shares the batch, in the Python path, the scripted decode layer and the
row groups."""

from __future__ import annotations

import pytest
import torch

from common.protocol import AdapterRef
from tests.worker.beam.helpers import beam_reference
from tests.worker.engine.runs import request, running_engine, submit
from tests.worker.lora.adapters import laid_out, merged, references, serve_greedy
from worker.engine.runner import ModelRunner

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time", "List three colors:"]
ROWS = ["attention", None, "mlp", "every", "attention", "qv", None, "every", "mlp"]  # 9 rows: two row groups


def step(tiny, adapters, prompts, decode_threads=2, python=False):
    """Prefill every row's prompt minus its last token with its adapter, then one decode step."""
    runner = ModelRunner(tiny.model, len(prompts), 128, decode_threads=decode_threads)
    if python:
        runner._decode_layers = None  # what a runner whose layers do not script runs
    for slot, (ids, adapter) in enumerate(zip(prompts, adapters)):
        runner.prefill(slot, ids[:-1], adapter=adapter)
    return runner, runner.decode([ids[-1] for ids in prompts], [len(ids) - 1 for ids in prompts], want_hidden=True,
                                 adapters=adapters)


@pytest.fixture(scope="module")
def batch(tiny, tiny_adapters):
    objects = {name: laid_out(tiny.model, directory) for name, directory in tiny_adapters.items()}
    adapters = [None if name is None else objects[name] for name in ROWS]
    prompts = [tiny.tokenizer(PROMPTS[i % len(PROMPTS)] * (1 + i % 3)).input_ids for i in range(len(ROWS))]
    return adapters, prompts


def test_a_mixed_step_gives_each_row_its_merged_models_logits(tiny, tiny_adapters, batch):
    adapters, prompts = batch
    runner, out = step(tiny, adapters, prompts)
    assert runner._row_groups(len(prompts)) == [(0, 4), (4, 9)] and runner.scripted_layers() is not None
    models = {name: merged(tiny.model, directory) for name, directory in tiny_adapters.items()}
    with torch.inference_mode():
        for row, (name, ids) in enumerate(zip(ROWS, prompts)):
            model = tiny.model if name is None else models[name]
            reference = model(torch.tensor([ids])).logits[0, -1]
            torch.testing.assert_close(out.logits[row], reference, atol=2e-5, rtol=0, msg=f"row {row} ({name})")
            if name is not None:  # the adapter moves the logits far more than the tolerance
                assert (tiny.model(torch.tensor([ids])).logits[0, -1] - reference).abs().max() > 0.05


def test_scripted_layers_python_path_and_row_groups_agree(tiny, batch):
    adapters, prompts = batch
    _, scripted = step(tiny, adapters, prompts, decode_threads=1)
    _, python = step(tiny, adapters, prompts, decode_threads=1, python=True)
    assert torch.equal(scripted.logits, python.logits) and torch.equal(scripted.hidden, python.hidden)
    # each row group computes exactly what one thread computes for its rows alone
    _, grouped = step(tiny, adapters, prompts)
    _, first = step(tiny, adapters[:4], prompts[:4])
    _, second = step(tiny, adapters[4:], prompts[4:])
    assert torch.equal(grouped.logits, torch.cat([first.logits, second.logits]))
    torch.testing.assert_close(grouped.logits, scripted.logits, atol=1e-5, rtol=0)


@pytest.mark.parametrize("row", [0, 3])  # ROWS[0]: attention only, ROWS[3]: every projection
def test_a_single_stream_with_an_adapter_takes_the_scripted_stack_as_the_python_path(tiny, batch, row):
    adapters, prompts = batch
    runner, scripted = step(tiny, adapters[row:row + 1], prompts[row:row + 1], decode_threads=1)
    _, python = step(tiny, adapters[row:row + 1], prompts[row:row + 1], decode_threads=1, python=True)
    assert runner.scripted_layers() is not None
    assert torch.equal(scripted.logits, python.logits) and torch.equal(scripted.hidden, python.hidden)


def test_rows_of_one_adapter_and_base_rows_are_untouched_by_the_others(tiny, batch):
    adapters, prompts = batch
    _, mixed = step(tiny, adapters, prompts)
    base_rows = [row for row, name in enumerate(ROWS) if name is None]
    _, alone = step(tiny, [None] * len(base_rows), [prompts[row] for row in base_rows], decode_threads=1)
    torch.testing.assert_close(mixed.logits[base_rows], alone.logits, atol=1e-5, rtol=0)
    _, plain = step(tiny, [None] * len(prompts), prompts)  # no adapter anywhere: the base forward
    torch.testing.assert_close(plain.logits[base_rows], mixed.logits[base_rows], atol=1e-5, rtol=0)


@pytest.fixture(scope="module")
def tiny_engine(tiny):
    with running_engine(tiny, "lora-tiny", max_batch_size=16, max_context=256, decode_threads=2) as engine:
        yield engine


def test_each_adapter_alone_equals_peft_generate(tiny, tiny_adapters, tiny_engine):
    ids = [tiny.tokenizer(p).input_ids for p in PROMPTS]
    eos = tiny.tokenizer.eos_token_id
    base = references(tiny.model, None, ids, 16, eos)
    for directory in tiny_adapters.values():
        expected = references(tiny.model, directory, ids, 16, eos)
        assert expected != base  # the adapter changes the output
        for prompt, tokens in zip(PROMPTS, expected):
            assert serve_greedy(tiny_engine, [(prompt, directory)], 16) == [tokens], directory.name


def test_a_batch_mixing_three_adapters_and_the_base_model_equals_peft(tiny, tiny_adapters, tiny_engine):
    names = [None, "attention", "mlp", "qv"]
    jobs = [(prompt, None if name is None else tiny_adapters[name]) for prompt in PROMPTS for name in names]
    got = serve_greedy(tiny_engine, jobs, 20)  # 16 requests decode side by side, in two row groups
    eos = tiny.tokenizer.eos_token_id
    for name in names:
        directory = None if name is None else tiny_adapters[name]
        expected = references(tiny.model, directory, [tiny.tokenizer(p).input_ids for p in PROMPTS], 20, eos)
        assert [tokens for (_, d), tokens in zip(jobs, got) if d == directory] == expected, name
    assert {"attention", "mlp", "qv"} <= set(tiny_engine.load().adapters)


def test_beam_search_with_an_adapter_equals_transformers_on_the_merged_model(tiny, tiny_adapters, tiny_engine):
    """Beam rows of one request share its adapter while the search reorders them; an ordinary row of
    another adapter decodes beside them."""
    params = dict(num_beams=3, n=2, max_tokens=10)
    ids = tiny.tokenizer(PROMPTS[2]).input_ids
    beams = request(PROMPTS[2], **params)
    beams.adapter = AdapterRef(name="every", source=str(tiny_adapters["every"]))
    beside = request(PROMPTS[0], max_tokens=10, temperature=0)
    beside.adapter = AdapterRef(name="qv", source=str(tiny_adapters["qv"]))
    runs = [submit(tiny_engine, beams, strict=True), submit(tiny_engine, beside, strict=True)]
    for run in runs:
        run.wait()
    expected, scores = beam_reference(merged(tiny.model, tiny_adapters["every"]), ids, params,
                                      [tiny.tokenizer.eos_token_id])
    assert [f.token_ids for f in runs[0].finishes] == expected
    assert [f.score for f in runs[0].finishes] == pytest.approx(scores, abs=1e-3)
    assert runs[1].finishes[0].token_ids == references(tiny.model, tiny_adapters["qv"],
                                                       [tiny.tokenizer(PROMPTS[0]).input_ids], 10,
                                                       tiny.tokenizer.eos_token_id)[0]
