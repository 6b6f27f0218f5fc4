"""The lean skeleton (worker/families/skeleton.py) is transformers' model without transformers' code: for every
family q4 serves, and the config variants those families ship with (biases, tied embeddings, scaled rotaries,
Gemma 3's per-layer-type bases), the same tensor names, shapes and dtypes; filled with the same weights, the
same rotary tables and the same logits through the lean runner, bit for bit. Anything it does not build is
declined, and transformers' class is built instead."""

from __future__ import annotations

import pytest
import torch
import transformers

from testkit.tiny_families import _COMMON, FAMILIES
from worker.direct_load import fill, skeleton
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE
from worker.engine.runner import ModelRunner
from worker.families.skeleton import LEAN_FAMILIES, LeanCausalLM, lean_skeleton

PROMPT = [5, 17, 300, 42, 9, 77, 128, 3, 250, 61, 8, 99, 14, 470]
_GEMMA3_SCALED = dict(rope_parameters={"sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
                                       "full_attention": {"rope_type": "linear", "rope_theta": 1e6, "factor": 8.0}})
_LLAMA3 = dict(rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0, "low_freq_factor": 1.0,
                                "high_freq_factor": 4.0, "original_max_position_embeddings": 64})
# (family, what differs from testkit/tiny_families.py's config): every family q4 serves, and the variants
VARIANTS = [
    ("llama", {}),
    ("llama", dict(attention_bias=True, mlp_bias=True, tie_word_embeddings=True)),
    ("llama", _LLAMA3),
    ("llama", dict(rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                    "original_max_position_embeddings": 64})),
    ("mistral", {}),
    ("qwen2", {}),
    ("qwen3", {}),
    ("qwen3", dict(attention_bias=True)),
    ("gemma2", {}),
    ("gemma3_text", {}),
    ("gemma3_text", _GEMMA3_SCALED),
    ("gemma3_text", dict(attention_bias=True, tie_word_embeddings=True)),
    ("phi3", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0})),  # Phi-3 mini 4k's
]


def _config(name: str, changes: dict):
    config_class, _, extra = FAMILIES[name]
    if name == "phi3":  # the tiny family's long rope is declined (below); the variant names its rotary
        extra = {}
    return getattr(transformers, config_class)(**{**_COMMON, **extra, **changes})


def _transformers_model(name: str, config) -> torch.nn.Module:
    torch.manual_seed(0)
    model = getattr(transformers, FAMILIES[name][1])(config).eval()
    with torch.no_grad():  # norms and biases start at one or zero: perturbed, so a misplaced one shows
        for parameter_name, parameter in model.named_parameters():
            if parameter_name.endswith("bias") or "norm" in parameter_name:
                parameter.add_(torch.randn_like(parameter) * 0.2)
    return model


def _filled(config, model: torch.nn.Module) -> LeanCausalLM:
    lean = lean_skeleton(config, torch.float32)
    assert isinstance(lean, LeanCausalLM)
    state = {key: tensor.clone() for key, tensor in model.state_dict().items()}
    assert fill(lean, config, state, set()) is None
    return lean.eval()


def _ids(variant) -> str:
    return f"{variant[0]}-{'-'.join(sorted(variant[1])) or 'plain'}"


@pytest.mark.parametrize("name,changes", VARIANTS, ids=[_ids(v) for v in VARIANTS])
def test_the_skeleton_has_transformers_tensors_names_shapes_and_dtypes(name, changes):
    config = _config(name, changes)
    for dtype in (torch.float32, torch.bfloat16):
        lean, theirs = lean_skeleton(config, dtype), skeleton(config, dtype)
        assert not isinstance(theirs, LeanCausalLM)
        shapes = {key: (tuple(t.shape), t.dtype, t.is_meta) for key, t in lean.state_dict().items()}
        assert shapes == {key: (tuple(t.shape), t.dtype, t.is_meta) for key, t in theirs.state_dict().items()}


@pytest.mark.parametrize("name,changes", VARIANTS, ids=[_ids(v) for v in VARIANTS])
def test_filled_with_the_same_weights_it_computes_what_transformers_computes(name, changes):
    """The rotary tables and the logits of a prefill and a decode step through the lean runner (every norm,
    bias, scale, activation and embedding scale on the way), equal to the bit."""
    config = _config(name, changes)
    theirs = _transformers_model(name, config)
    lean = _filled(config, theirs)
    positions = torch.arange(config.max_position_embeddings).unsqueeze(0)
    probe = torch.zeros(1, dtype=torch.float32)
    keys = sorted(set(config.layer_types)) if name == "gemma3_text" else [None]
    for key in keys:
        arguments = (probe, positions) if key is None else (probe, positions, key)
        for ours, expected in zip(lean.model.rotary_emb(*arguments), theirs.model.rotary_emb(*arguments)):
            assert torch.equal(ours, expected)
    runners = [ModelRunner(model, 1, 64) for model in (lean, theirs)]
    ours, expected = (runner.prefill(0, PROMPT, all_logits=True).logits for runner in runners)
    assert torch.equal(ours, expected)
    ours, expected = (runner.decode([7], [len(PROMPT)]).logits for runner in runners)
    assert torch.equal(ours, expected)
    with torch.inference_mode():  # and what transformers' own forward computes, as close as its kernels allow
        reference = theirs(torch.tensor([PROMPT])).logits[0]
    assert torch.allclose(runners[0].prefill(0, PROMPT, all_logits=True).logits, reference, atol=1e-4)


@pytest.mark.parametrize("name", ["llama", "gemma3_text"])
def test_q4_packs_the_skeleton_as_it_packs_transformers_model(name):
    """The native forward on each: the same packed weights, so the same logits (forward.c is deterministic)."""
    config = _config(name, {})
    theirs = _transformers_model(name, config)
    runners = [ModelRunner(model, 1, 64, kv_dtype=KV_DTYPE) for model in (_filled(config, theirs), theirs)]
    for runner in runners:
        install_native(runner)
    ours, expected = (runner.prefill(0, PROMPT, all_logits=True).logits for runner in runners)
    assert torch.equal(ours, expected)


DECLINED = [(name, {}) for name in sorted(set(FAMILIES) - set(LEAN_FAMILIES))] + [
    ("phi3", {}),  # long rope: its table changes with the length
    ("llama", dict(rope_parameters={"rope_type": "dynamic", "rope_theta": 10000.0, "factor": 2.0})),
    ("llama", dict(hidden_act="gelu")),
    ("gemma3_text", dict(use_bidirectional_attention=True)),  # the lean runner refuses it: transformers' runs it
    ("phi3", dict(rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 0.5})),
]


@pytest.mark.parametrize("name,changes", DECLINED, ids=[_ids(v) for v in DECLINED])
def test_what_it_does_not_build_is_declined_and_transformers_class_built(name, changes):
    settings = {**_COMMON, **FAMILIES[name][2], **changes}
    if name == "gpt_neox":
        del settings["num_key_value_heads"]
    config = getattr(transformers, FAMILIES[name][0])(**settings)
    assert lean_skeleton(config, torch.float32) is None
    assert type(skeleton(config, torch.float32, lean=True)).__name__ == FAMILIES[name][1]
