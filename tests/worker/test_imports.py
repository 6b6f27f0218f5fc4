"""What a worker process imports: triton stays out (worker/__init__.py says why), checked in a fresh interpreter."""

import subprocess
import sys

import pytest

PROBE = """
import sys
import worker
import torch._dynamo  # what transformers imports, and what probes for triton
from torch.utils._triton import has_triton_package
print(has_triton_package(), any("libtriton" in line for line in open("/proc/self/maps")))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/maps")
def test_a_worker_process_never_maps_triton():
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=300, check=True)
    assert done.stdout.split()[-2:] == ["False", "False"]


LEAN_PROBE = """
import sys
from pathlib import Path
from common.protocol import ModelConfig
from worker.__main__ import run_without_distributed
from worker.engine.engine import Engine
from worker.loading import load_model

run_without_distributed()
config = ModelConfig(name="m", source=sys.argv[1], quantization="q4")
loaded = load_model(config, Path(sys.argv[2]), engine_only=True)
engine = Engine(loaded, config, "w", data_dir=Path(sys.argv[2]), compile_later=True, owns_model=True)
assert engine.runner.native is not None and bool(engine.runner.prefill(0, [1, 2, 3]).logits.isfinite().all())
engine.start()
engine.warm_up()  # a generation through the whole step: scheduler, decoding, sampling
engine.stop()
print(type(loaded.model).__name__, *[name for name in ("transformers.modeling_utils", "torch._dynamo",
                                                       "torch.distributed.tensor", "sympy", "xgrammar")
                                   if name in sys.modules])
"""


def _lean_probe(source: str, data_dir) -> list[str]:
    done = subprocess.run([sys.executable, "-c", LEAN_PROBE, source, str(data_dir)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return done.stdout.splitlines()[-1].split()  # the probe's line, after the load's log lines


def test_a_q4_worker_loads_and_serves_without_transformers_modeling_code(tmp_path):
    """worker/families/skeleton.py and worker/__main__.py's `run_without_distributed`: the default GGUF (Llama's
    shape) loads, packs and runs a prefill with none of the ~170 MB transformers' model classes and sharding
    bring (torch._dynamo, torch.distributed.tensor, sympy), nor xgrammar (imported by the first structured
    request: worker/decoding/grammar/)."""
    assert _lean_probe("", tmp_path) == ["LeanCausalLM"]


def test_a_q4_gemma3_from_safetensors_loads_without_them_too(tmp_path):
    """Gemma 3's parts (scaled embeddings, (1 + w) norms, q/k norms, two rotary bases) from a safetensors
    directory, the other loading road."""
    from testkit.tiny_families import tiny_family

    loaded = tiny_family("gemma3_text")
    loaded.model.save_pretrained(tmp_path / "model")
    assert _lean_probe(str(tmp_path / "model"), tmp_path / "data") == ["LeanCausalLM"]
