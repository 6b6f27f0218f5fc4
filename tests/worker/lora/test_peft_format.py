"""Reading PEFT adapter directories: what is served, and every refusal with the kind the gateway maps
(not_found -> 404, validation -> 422)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from safetensors.torch import load_file, save_file

from testkit.lora_adapters import ATTENTION, EVERY, edit_config, write_adapter
from testkit.tiny_model import tiny_llama
from worker.lora.adapter import model_shape
from worker.lora.errors import AdapterError
from worker.lora.peft_format import read_adapter
from worker.lora.sources import adapter_directory

WEIGHTS = "adapter_model.safetensors"


@pytest.fixture(scope="module")
def shape(tiny):
    return model_shape(tiny.model.model.layers)


@pytest.fixture
def adapter(tiny, tmp_path):
    return write_adapter(tiny.model, tmp_path / "adapter", 7, ATTENTION, rank=4, alpha=8)


def refused(directory, shape, kind: str = "validation", max_rank: int = 64) -> str:
    with pytest.raises(AdapterError) as caught:
        read_adapter(directory, shape, max_rank)
    assert caught.value.kind == kind, caught.value.message
    return caught.value.message


def test_every_projection_is_read_with_its_scaling(tiny, tmp_path, shape):
    directory = write_adapter(tiny.model, tmp_path / "rs", 3, EVERY, rank=8, alpha=4, use_rslora=True,
                              rank_pattern={"v_proj": 2})
    modules = read_adapter(directory, shape, 64).modules
    assert {name for _, name in modules} == set(EVERY) and {layer for layer, _ in modules} == {0, 1}
    assert modules[0, "q_proj"].rank == 8 and modules[0, "v_proj"].rank == 2  # rank_pattern: per module
    assert modules[0, "q_proj"].scaling == pytest.approx(4 / math.sqrt(8))  # use_rslora: alpha / sqrt(r)
    assert modules[1, "v_proj"].scaling == pytest.approx(4 / math.sqrt(2))
    plain = read_adapter(write_adapter(tiny.model, tmp_path / "plain", 3, ["o_proj"], rank=8, alpha=4), shape, 64)
    assert plain.modules[0, "o_proj"].scaling == 0.5  # alpha / r


def test_pickled_weights_read_like_safetensors(tiny, tmp_path, shape, adapter):
    pickled = write_adapter(tiny.model, tmp_path / "bin", 7, ATTENTION, rank=4, alpha=8)
    (pickled / WEIGHTS).unlink()
    torch.save(load_file(adapter / WEIGHTS), pickled / "adapter_model.bin")
    ours, theirs = read_adapter(adapter, shape, 64).modules, read_adapter(pickled, shape, 64).modules
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k].up, theirs[k].up) and torch.equal(ours[k].down, theirs[k].down) for k in ours)


def test_missing_directory_and_files_are_not_found(tmp_path, shape, adapter):
    with pytest.raises(AdapterError) as caught:
        adapter_directory(str(tmp_path / "nowhere"), tmp_path)
    assert caught.value.kind == "not_found" and "does not exist" in caught.value.message
    (tmp_path / "empty").mkdir()
    assert "adapter_config.json" in refused(tmp_path / "empty", shape, "not_found")
    (adapter / WEIGHTS).unlink()
    assert "adapter_model.safetensors nor adapter_model.bin" in refused(adapter, shape, "not_found")


@pytest.mark.parametrize(("text", "needle"), [
    ("{not json", "not valid JSON"),
    ("[1, 2]", "JSON object"),
    (json.dumps({"peft_type": "IA3"}), "only LORA"),
    (json.dumps({"peft_type": "LORA", "lora_alpha": -1}), "lora_alpha must be a positive number"),
    (json.dumps({"peft_type": "LORA", "lora_alpha": "16"}), "lora_alpha must be a positive number"),
    (json.dumps({"peft_type": "LORA", "bias": "all"}), "bias 'all'"),
])
def test_broken_configs_are_refused(adapter, shape, text, needle):
    (adapter / "adapter_config.json").write_text(text)
    assert needle in refused(adapter, shape)


@pytest.mark.parametrize(("options", "needle"), [
    (dict(use_dora=True), "DoRA"),
    (dict(lora_bias=True), "LoRA bias vectors"),
    (dict(modules_to_save=["lm_head"]), "modules_to_save"),
    (dict(alpha_pattern={"q_proj": 4}), "per-module lora_alpha"),
])
def test_peft_features_that_change_the_forward_are_refused_by_name(tiny, tmp_path, shape, options, needle):
    directory = write_adapter(tiny.model, tmp_path / "feature", 5, ["q_proj", "v_proj"], rank=4, **options)
    assert needle in refused(directory, shape)


def test_rank_above_the_limit_is_refused(tiny, tmp_path, shape):
    directory = write_adapter(tiny.model, tmp_path / "wide", 5, ["q_proj"], rank=16)
    assert "rank 16 is outside 1..8 (max_adapter_rank)" in refused(directory, shape, max_rank=8)
    assert read_adapter(directory, shape, 16).modules[0, "q_proj"].rank == 16


def test_an_adapter_for_another_base_model_is_refused(smol, tmp_path, shape):
    other = tiny_llama(smol.tokenizer, layers=2)
    other.model.model.layers[0].self_attn.q_proj = torch.nn.Linear(64, 32, bias=False)  # another width
    directory = write_adapter(other.model, tmp_path / "other", 5, ["q_proj"], rank=4)
    assert "trained for another base model" in refused(directory, shape)
    deeper = write_adapter(tiny_llama(smol.tokenizer, layers=3).model, tmp_path / "deeper", 5, ["o_proj"], rank=4)
    assert "targets layer 2; the model has 2 layers" in refused(deeper, shape)


def test_modules_outside_the_decoder_projections_are_refused(tiny, tmp_path, shape):
    directory = write_adapter(tiny.model, tmp_path / "head", 5, ["q_proj", "lm_head"], rank=4)
    assert "unsupported tensor 'base_model.model.lm_head." in refused(directory, shape)


def _rewrite_weights(directory, change) -> None:
    tensors = load_file(directory / WEIGHTS)
    change(tensors)
    save_file(tensors, directory / WEIGHTS)


def test_broken_weights_are_refused(adapter, shape):
    first_b = next(k for k in load_file(adapter / WEIGHTS) if "lora_B" in k)
    _rewrite_weights(adapter, lambda t: t.pop(first_b))
    assert "has lora_A but not its counterpart" in refused(adapter, shape)
    _rewrite_weights(adapter, lambda t: t.clear() or t.update(stray=torch.zeros(2)))
    assert "unsupported tensor 'stray'" in refused(adapter, shape)
    _rewrite_weights(adapter, lambda t: t.clear())
    assert "holds no LoRA weights" in refused(adapter, shape)
    (adapter / WEIGHTS).write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{broken")
    assert "cannot read the adapter weights" in refused(adapter, shape)


def test_weights_that_are_not_a_finite_rank_pair_are_refused(tiny, tmp_path, shape):
    def key(tensors, side):
        return next(k for k in tensors if f"q_proj.lora_{side}" in k)

    cases = [
        (lambda t: t.__setitem__(key(t, "A"), torch.full_like(t[key(t, "A")], math.nan)), "NaN or infinite"),
        (lambda t: t.__setitem__(key(t, "B"), t[key(t, "B")][:, :2].contiguous()), "are not a rank-r pair"),
        (lambda t: t.__setitem__(key(t, "A"), t[key(t, "A")].to(torch.int32)), "floating point"),
    ]
    for index, (change, needle) in enumerate(cases):
        directory = write_adapter(tiny.model, tmp_path / f"bad{index}", 5, ["q_proj"], rank=4)
        _rewrite_weights(directory, change)
        assert needle in refused(directory, shape)


def test_config_edits_that_keep_plain_lora_are_served(tiny, tmp_path, shape, adapter):
    edit_config(adapter, base_model_name_or_path="somebody/else", lora_dropout=0.3, inference_mode=False)
    assert len(read_adapter(adapter, shape, 64).modules) == 2 * len(ATTENTION)
