"""The framework internals our code leans on, checked against what is installed, and the bounds that keep an
upgrade from arriving unannounced.

uvicorn: gateway/edge/http_limits.py subclasses its httptools protocol and overrides its parser hooks.
transformers: worker/loading.py imports its model modules by path; worker/engine/layers.py and
native/model.py recognise its RMSNorm classes by name and read their `variance_epsilon`; worker/gguf_names.py
reads its GGUF tables (architectures, tensor names) and runs its per-architecture tensor processors. An upgrade that
renames or drops one fails here by name, before a worker falls back to a slow path or a request meets a 500.
"""

from __future__ import annotations

import importlib
import inspect
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]
# each framework whose internals we touch, and the module that does
FENCED = {"uvicorn": "gateway/edge/http_limits.py", "transformers": "worker/loading.py, worker/gguf_names.py",
          "litestar": "gateway/dialects/fast_path.py"}


def _requirements() -> dict[str, list[Requirement]]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    found: dict[str, list[Requirement]] = {}
    for line in [*project["dependencies"], *(d for extra in project["optional-dependencies"].values() for d in extra)]:
        requirement = Requirement(line)
        found.setdefault(requirement.name, []).append(requirement)
    return found


@pytest.mark.parametrize("name", sorted(FENCED))
def test_every_framework_whose_internals_we_touch_has_an_upper_bound_that_admits_the_tested_one(name):
    installed = Version(importlib.metadata.version(name))
    requirements = _requirements()[name]
    for requirement in requirements:
        assert any(spec.operator in ("<", "<=", "==", "~=") for spec in requirement.specifier), \
            f"{requirement}: {FENCED[name]} reads {name}'s internals; bound it above"
        assert requirement.specifier.contains(installed, prereleases=True), f"{requirement} excludes {installed}"


def test_uvicorn_protocol_has_every_hook_the_edge_overrides_with_the_same_parameters():
    from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

    from gateway.config import HttpSettings
    from gateway.edge.http_limits import edge_protocol

    edge = edge_protocol(HttpSettings(), [])
    hooks = [name for name, value in vars(edge).items()  # the methods that extend uvicorn's (super().name())
             if callable(value) and f"super().{name}(" in inspect.getsource(value)]
    assert {"connection_made", "data_received", "on_headers_complete", "on_body"} <= set(hooks)
    for name in hooks:
        assert hasattr(HttpToolsProtocol, name), f"uvicorn's HttpToolsProtocol no longer has {name}"
        ours, theirs = inspect.signature(getattr(edge, name)), inspect.signature(getattr(HttpToolsProtocol, name))
        assert list(ours.parameters) == list(theirs.parameters), f"{name}: {theirs} in uvicorn, {ours} here"
    for status in (408, 429, 431):  # the refusals http_limits writes itself
        assert STATUS_LINE[status].startswith(f"HTTP/1.1 {status} ".encode())
    # attributes the overrides read; set in __init__ (loop, cycle) or connection_made (transport, client)
    source = inspect.getsource(HttpToolsProtocol)
    for attribute in ("self.loop", "self.cycle", "self.transport", "self.client", "self.headers",
                      "response_complete"):
        assert attribute in source, f"uvicorn's HttpToolsProtocol no longer sets {attribute}"


def test_transformers_has_the_model_modules_and_norm_classes_we_name():
    import torch

    from worker.engine.layers import _PLAIN_RMS_NORMS
    from worker.loading import LAZY_MODEL_MODULES

    modules = [importlib.import_module(name) for name in LAZY_MODEL_MODULES]
    for name in sorted(_PLAIN_RMS_NORMS):
        family = name.removesuffix("RMSNorm").lower()
        module = importlib.import_module(f"transformers.models.{family}.modeling_{family}")
        norm = getattr(module, name)(8, eps=1e-5)
        assert norm.variance_epsilon == 1e-5 and norm.weight.shape == (8,)
        assert torch.allclose(norm(torch.ones(2, 8)), torch.ones(2, 8), atol=1e-4)
    assert all(hasattr(m, "__file__") for m in modules)


def test_transformers_gguf_tables_and_processors_read_as_gguf_names_expects():
    import numpy as np
    import torch
    from transformers import LlamaConfig
    from transformers.modeling_gguf_pytorch_utils import TENSOR_PROCESSORS, get_gguf_hf_weights_map

    from worker.direct_load import skeleton
    from worker.gguf_names import GgufTensors, known_architecture, tensor_names

    assert all(known_architecture(name) for name in ("llama", "qwen2", "qwen3", "qwen2moe", "gemma3", "phi3"))
    assert not known_architecture("nosucharch") and not known_architecture("tokenizer")
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)
    model = skeleton(config, torch.float32)
    names = tensor_names("llama", model)
    # the whole model's names alone map what transformers' walk of every submodule maps
    assert names == get_gguf_hf_weights_map(model, TENSOR_PROCESSORS["llama"](config=config.to_dict()))
    assert set(names.values()) == set(model.state_dict())
    assert names["blk.1.attn_q.weight"] == "model.layers.1.self_attn.q_proj.weight"
    assert names["output.weight"] == "lm_head.weight"
    # llama.cpp's converter permutes q and k rows per head for its rotary layout; reading undoes it
    tensors = GgufTensors("llama", config.to_dict(), names)
    for gguf_name, heads, rows in (("blk.0.attn_q.weight", 4, 32), ("blk.0.attn_k.weight", 2, 16)):
        original = np.arange(rows * 32, dtype=np.float32).reshape(rows, 32)
        permuted = original.reshape(heads, 2, rows // heads // 2, 32).swapaxes(1, 2).reshape(rows, 32)
        name, restored = tensors.convert(gguf_name, permuted)
        assert name == names[gguf_name] and np.array_equal(restored, original)
    name, values = tensors.convert("blk.0.ffn_up.weight", np.ones((64, 32), dtype=np.float32))
    assert name == "model.layers.0.mlp.up_proj.weight" and np.array_equal(values, np.ones((64, 32)))
