"""A model directory whose config.json cannot describe a causal LM fails to load in one line naming what is
wrong (worker/model_config_check.py), before transformers builds a default-sized model from it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from transformers import BloomConfig, GPT2Config, LlamaConfig, MambaConfig

from common.protocol import ModelConfig
from common.worker_launch import MODEL_LOAD_FAILED, MODEL_LOAD_FAILED_EXIT
from testkit.servers import free_port
from testkit.sluice import REPO
from worker.loading import load_model
from worker.model_config_check import ModelConfigError, check_model_config

SIZES = dict(vocab_size=64, hidden_size=16, num_hidden_layers=2, num_attention_heads=2)


@pytest.mark.parametrize(("config", "message"), [
    ({"model_type": "frobnicator", "architectures": ["FrobnicatorForCausalLM"], **SIZES},
     "unknown architecture: model_type 'frobnicator' (FrobnicatorForCausalLM) is not one transformers"),
    ({"model_type": "llama", "architectures": ["LlamaForFrobnication"], **SIZES},
     "unknown architecture 'LlamaForFrobnication' in config.json"),
    ({"architectures": ["LlamaForCausalLM"], **SIZES}, "names no model_type (LlamaForCausalLM)"),
    ({"model_type": "t5", "architectures": ["T5ForConditionalGeneration"]}, "t5 (T5ForConditionalGeneration) is "
     "not a causal language model"),
    ({"model_type": "llama", **{k: v for k, v in SIZES.items() if k != "hidden_size"}},
     "lacks hidden_size: transformers would build llama's default size"),
    ({"model_type": "gpt2", "vocab_size": 64}, "lacks hidden_size, num_hidden_layers, num_attention_heads"),
])
def test_a_config_that_describes_no_causal_lm_fails_in_one_line(tmp_path, config, message):
    (tmp_path / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelConfigError) as failed:
        load_model(ModelConfig(source=str(tmp_path), quantization="none", dtype="float32"), tmp_path / "data")
    assert message in str(failed.value) and "\n" not in str(failed.value)


def test_configs_transformers_writes_pass(tmp_path):
    """Aliased names (GPT-2's n_embd, Bloom's n_layer) count, and a family without heads (Mamba) needs none."""
    for index, config in enumerate([GPT2Config(), BloomConfig(), LlamaConfig(), MambaConfig()]):
        config.save_pretrained(tmp_path / str(index))
        check_model_config(tmp_path / str(index))


def test_the_worker_process_says_it_in_one_line_and_exits(tmp_path):
    """`python -m worker` as `sluice serve` starts it: the load-failure exit (common/worker_launch.py: the
    gateway does not restart it) and one line on stderr naming the missing field."""
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "vocab_size": 64,
                                                      "num_hidden_layers": 2, "num_attention_heads": 2}))
    done = subprocess.run([sys.executable, "-m", "worker", "--data-dir", str(tmp_path / "data"), "--port",
                           str(free_port()), "--model-json", json.dumps({"source": str(tmp_path)})],
                          cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "SLUICE_LOG_FORMAT": "json"})
    assert done.returncode == MODEL_LOAD_FAILED_EXIT
    lines = [line for line in done.stderr.splitlines() if line.startswith(MODEL_LOAD_FAILED)]
    assert len(lines) == 1 and "lacks hidden_size" in lines[0] and str(tmp_path) in lines[0], done.stderr[-2000:]
