"""The direct safetensors load gives the model `from_pretrained` gives, tensor for tensor, and steps
aside for checkpoints that need `from_pretrained`'s conversions."""

from __future__ import annotations

import torch
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM

from testkit.tiny_model import write_tiny_model
from worker.direct_load import load_direct


def assert_same_model(direct, reference) -> None:
    ours, theirs = direct.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[name], theirs[name]) and ours[name].dtype == theirs[name].dtype for name in ours)
    assert {n: b for n, b in direct.named_buffers()}.keys() == {n: b for n, b in reference.named_buffers()}.keys()
    assert all(torch.equal(a, b) for (_, a), (_, b) in zip(direct.named_buffers(), reference.named_buffers()))
    assert direct.generation_config.eos_token_id == reference.generation_config.eos_token_id
    ids = torch.tensor([[1, 504, 3458, 282, 4172]])
    with torch.inference_mode():
        assert torch.equal(direct(ids).logits, reference(ids).logits)


def test_a_tied_model_loads_directly_as_from_pretrained_loads_it(tmp_path):
    directory = write_tiny_model(tmp_path / "tiny", tied=True)
    direct = load_direct(directory, torch.float32)
    assert direct is not None and direct.lm_head.weight is direct.model.embed_tokens.weight
    assert_same_model(direct, AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32))


def test_a_bfloat16_file_is_cast_tensor_by_tensor_and_sharded_files_are_read_whole(tmp_path):
    """A bf16 checkpoint in two shards, loaded in float32: the same model `from_pretrained` gives."""
    directory = write_tiny_model(tmp_path / "tiny", tied=False)
    reference = AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16)
    (directory / "model.safetensors").unlink()
    reference.save_pretrained(directory, max_shard_size="300KB")
    assert len(list(directory.glob("*.safetensors"))) > 1
    direct = load_direct(directory, torch.float32)
    assert direct is not None
    assert_same_model(direct, AutoModelForCausalLM.from_pretrained(directory, dtype=torch.float32))


def test_an_untied_model_and_another_dtype(tmp_path):
    directory = write_tiny_model(tmp_path / "tiny", tied=False)
    direct = load_direct(directory, torch.bfloat16)
    assert direct is not None and direct.lm_head.weight is not direct.model.embed_tokens.weight
    assert_same_model(direct, AutoModelForCausalLM.from_pretrained(directory, dtype=torch.bfloat16))


def test_checkpoints_it_cannot_read_as_they_are_go_to_from_pretrained(tmp_path):
    directory = write_tiny_model(tmp_path / "tiny")
    weights = directory / "model.safetensors"
    state = load_file(weights)
    state["model.layers.0.self_attn.q_proj.renamed"] = state.pop("model.layers.0.self_attn.q_proj.weight")
    save_file(state, weights, metadata={"format": "pt"})
    assert load_direct(directory, torch.float32) is None
    assert load_direct(tmp_path / "no-such-dir", torch.float32) is None
    (tmp_path / "empty").mkdir()
    assert load_direct(tmp_path / "empty", torch.float32) is None
