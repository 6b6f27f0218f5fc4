"""GGUF files read as they are shipped: the values are gguf's own dequantization, the model is transformers'
GGUF load tensor for tensor, and a file that cannot be read is refused in one line that names why, with
nothing left half-written in the model cache."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType, GGUFReader
from gguf.quants import dequantize

from common.protocol import ModelConfig
from common.worker_launch import MODEL_LOAD_FAILED, MODEL_LOAD_FAILED_EXIT
from testkit.sluice import REPO
from testkit.tiny_gguf import write_gguf
from testkit.tiny_model import write_tiny_model
from worker import gguf_file
from worker.engine.native.pack import SLICE_ROWS, four_bit
from worker.gguf_file import READABLE, read_four_bit, read_index, read_tensor
from worker.loading import ModelLoadError, default_gguf_path, load_model, packed_by_q4

EVERY_TYPE = sorted(READABLE, key=lambda kind: kind.name)


def test_the_default_gguf_loads_as_transformers_loads_it(smol):
    """SmolLM2 (Q4_1, Q8_0 and F32 tensors; Llama's permuted q/k): every weight, and the logits."""
    from transformers import AutoModelForCausalLM

    gguf = default_gguf_path()
    reference = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    ours, theirs = smol.model.state_dict(), reference.state_dict()
    assert set(ours) == set(theirs)
    assert all(torch.equal(ours[name], theirs[name]) for name in ours)
    assert smol.model.lm_head.weight is smol.model.model.embed_tokens.weight
    ids = torch.tensor([[1, 504, 3458, 282, 4172]])
    with torch.inference_mode():
        assert torch.equal(smol.model(ids).logits, reference(ids).logits)
    assert smol.tokenizer.chat_template and smol.tokenizer.eos_token == "<|im_end|>"
    assert smol.model.config.rope_parameters["rope_theta"] == reference.config.rope_parameters["rope_theta"]


def test_q4_for_an_engine_leaves_the_packed_weights_unread_and_reads_each_as_the_full_load(smol, tmp_path):
    loaded = load_model(ModelConfig(quantization="q4", dtype="float32"), tmp_path, engine_only=True)
    unread = [name for name, tensor in loaded.model.named_parameters() if tensor.is_meta]
    assert unread and all(packed_by_q4(name) for name in unread)
    full = smol.model.state_dict()
    for name in ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                 "model.embed_tokens.weight", "model.layers.29.mlp.down_proj.weight"):
        assert torch.equal(loaded.read_weight(name), full[name]), name
    assert loaded.weights_id == smol.weights_id and loaded.weights_id is not None
    # what q4 packs instead of those floats: the file's own codes and scales, rows where the floats are
    for name in ("model.layers.3.self_attn.q_proj.weight", "model.layers.3.self_attn.k_proj.weight",
                 "model.layers.0.mlp.gate_proj.weight"):
        codes, scale, minimum = loaded.read_weight.four_bit(name)
        rows, groups = scale.shape
        weights = codes.reshape(rows, groups, 32).float() * scale.unsqueeze(-1) + minimum.unsqueeze(-1)
        assert torch.equal(weights.reshape(rows, -1), full[name]), name
        packed = four_bit(codes, scale, minimum)
        assert packed.bits == 4 and torch.equal(packed.dequantize(), full[name])  # Q4_1: half floats, exact
    assert loaded.read_weight.four_bit("model.embed_tokens.weight") is None  # Q8_0: packed from floats
    # ... read a slice of rows at a time; q / k, whose rows the fix-up reorders, are not offered so
    slices = list(loaded.read_weight.row_slices("model.embed_tokens.weight", SLICE_ROWS)())
    assert max(len(part) for part in slices) == SLICE_ROWS
    assert torch.equal(torch.cat(slices), full["model.embed_tokens.weight"])
    assert loaded.read_weight.row_slices("model.layers.3.self_attn.q_proj.weight", SLICE_ROWS) is None
    assert loaded.read_weight.row_slices("model.layers.3.mlp.down_proj.weight", SLICE_ROWS) is not None


def test_q4_packs_the_vocabulary_matrix_from_the_file_without_a_float_copy_of_it(smol, tmp_path):
    """A first start's peak was the Q8_0 vocabulary matrix read whole in float32 (113 MB) to be packed: read
    a slice at a time, packing it grows the RSS by less than half that, and packs the same bytes."""
    script = f"""
import json, torch
from pathlib import Path
from common.protocol import ModelConfig
from worker.engine.native.pack import SLICE_ROWS, pick, pick_slices
from worker.allocator import return_large_blocks
from worker.loading import load_model

return_large_blocks()  # as the worker does first: what packing frees leaves the process
def memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {{key: int(status[key].split()[0]) * 1024 for key in ("VmHWM", "VmRSS")}}

loaded = load_model(ModelConfig(quantization="q4", dtype="float32"), Path({str(tmp_path)!r}), engine_only=True)
name = "model.embed_tokens.weight"
rows = loaded.read_weight.row_slices(name, SLICE_ROWS)
with open("/proc/self/clear_refs", "w") as handle:
    handle.write("5")  # VmHWM from here
before = memory()["VmRSS"]
packed = pick_slices(rows, 49152)
grown = memory()["VmHWM"] - before
whole = pick(loaded.read_weight(name))
print(json.dumps({{"grown": grown, "float_bytes": whole.rows * whole.cols * 4, "bits": packed.bits,
                  "same": packed.bits == whole.bits and torch.equal(packed.tiles, whole.tiles)}}))
"""
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # SLUICE_MODEL_CACHE: the tests' cache (the `smol` fixture)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["same"] and result["bits"] == 8, result
    assert result["grown"] < result["float_bytes"] / 2, result


def test_every_tensor_type_reads_as_ggufs_own_dequantization(tmp_path, monkeypatch):
    monkeypatch.setattr(gguf_file, "CHUNK_BYTES", 4096)  # several chunks per tensor
    tensors = {f"t.{kind.name}": (kind, (40, 512)) for kind in EVERY_TYPE}
    path = write_gguf(tmp_path / "types.gguf", "llama", tensors)
    architecture, entries = read_index(path)
    assert architecture == "llama" and {e.kind for e in entries} == {k.name for k in EVERY_TYPE}
    theirs = {tensor.name: dequantize(tensor.data, tensor.tensor_type) for tensor in GGUFReader(path).tensors}
    for entry in entries:
        ours = read_tensor(path, entry)
        assert ours.dtype == torch.float32 and ours.shape == (40, 512)
        assert np.array_equal(ours.numpy(), theirs[entry.name].reshape(40, 512)), entry.kind
        assert ours.isfinite().all() and 0 < float(ours.abs().max()) < 1, entry.kind


@pytest.mark.parametrize("kind", ["Q4_0", "Q4_1", "Q4_K"])
def test_four_bit_blocks_pack_as_they_are(tmp_path, kind):
    path = write_gguf(tmp_path / "four.gguf", "llama", {"m": (GGMLQuantizationType[kind], (40, 512))})
    [entry] = read_index(path)[1]
    theirs = dequantize(GGUFReader(path).tensors[0].data, GGMLQuantizationType[kind])
    codes, scale, minimum = read_four_bit(path, entry)
    weights = codes.reshape(40, 16, 32).float() * scale.unsqueeze(-1) + minimum.unsqueeze(-1)
    assert np.array_equal(weights.reshape(40, 512).numpy(), theirs)  # gguf's dequantization, to the bit
    error = (four_bit(codes, scale, minimum).dequantize() - torch.from_numpy(theirs)).abs().max()
    if kind == "Q4_K":  # half-float scales of d x 6-bit products: rounded, at 2^-11 of the largest weight
        assert float(error) <= 2 ** -11 * float(np.abs(theirs).max())
    else:
        assert float(error) == 0


def _truncated(tmp_path: Path) -> Path:
    path = write_gguf(tmp_path / "model.gguf", "llama", {"token_embd.weight": (GGMLQuantizationType.Q8_0, (64, 64))})
    path.write_bytes(path.read_bytes()[:-100])
    return path


def _unknown_type(tmp_path: Path) -> Path:
    """A tensor whose type id (written after its name, dimension count and dimensions) is no GGML type."""
    path = write_gguf(tmp_path / "model.gguf", "llama", {"blk.0.attn_q.weight": (GGMLQuantizationType.F32, (8, 32))})
    data = bytearray(path.read_bytes())
    at = data.index(b"blk.0.attn_q.weight") + len("blk.0.attn_q.weight") + 4 + 2 * 8
    assert int.from_bytes(data[at:at + 4], "little") == GGMLQuantizationType.F32
    data[at:at + 4] = (99).to_bytes(4, "little")
    path.write_bytes(bytes(data))
    return path


def _header(tmp_path: Path, metadata: bytes, metadata_count: int = 1) -> Path:
    """A v3 header of no tensors and `metadata_count` entries, whose bytes are `metadata`."""
    return _write(tmp_path / "model.gguf", b"GGUF" + struct.pack("<IQQ", 3, 0, metadata_count) + metadata)


def _key(name: str) -> bytes:
    return struct.pack("<Q", len(name)) + name.encode()


NESTED = _key("nested") + struct.pack("<I", 9) + struct.pack("<IQ", 9, 1) * 10_000  # arrays in arrays 10k deep


BAD_GGUFS = {
    "arrays nested 10,000 deep": (lambda tmp: _header(tmp, NESTED), "nested more than 8 deep"),
    "a count past the file": (lambda tmp: _header(tmp, _key("big") + struct.pack("<IIQ", 9, 4, 2**62)),
                              "is truncated or corrupt"),
    "2^64-1 metadata entries": (lambda tmp: _header(tmp, b"", 2**64 - 1), "is truncated or corrupt"),

    "bad magic": (lambda tmp: _write(tmp / "model.gguf", b"GGML" + bytes(64)), "is not a GGUF file"),
    "truncated tensor data": (_truncated, "is truncated"),
    "unknown architecture": (lambda tmp: write_gguf(tmp / "model.gguf", "nosucharch", {
        "token_embd.weight": (GGMLQuantizationType.F32, (8, 32))}), "GGUF architecture 'nosucharch'"),
    "unknown tensor type id": (_unknown_type, "unknown GGUF tensor type id 99"),
    "a type Sluice does not read": (lambda tmp: write_gguf(tmp / "model.gguf", "llama", {
        "token_embd.weight": (GGMLQuantizationType.Q2_K, (8, 256))}), "has GGUF type Q2_K"),
}


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def _cache_entries(cache: Path) -> list[str]:
    """What the model cache holds besides its locks and remembered hashes (dot files)."""
    return sorted(p.name for p in cache.iterdir() if not p.name.startswith(".")) if cache.exists() else []


@pytest.mark.parametrize("case", sorted(BAD_GGUFS))
def test_a_gguf_that_cannot_be_read_is_refused_naming_why_and_leaves_nothing_cached(tmp_path, monkeypatch, case):
    build, expected = BAD_GGUFS[case]
    path = build(tmp_path)
    cache = tmp_path / "cache"
    monkeypatch.setenv("SLUICE_MODEL_CACHE", str(cache))
    with pytest.raises(ModelLoadError, match=expected) as refused:
        load_model(ModelConfig(source=str(path), quantization="none", dtype="float32"), tmp_path)
    assert "\n" not in str(refused.value) and "model.gguf" in str(refused.value)
    assert _cache_entries(cache) == []
    assert not list(cache.glob(".*staging*"))


def test_a_truncated_safetensors_shard_is_refused_naming_it(tmp_path):
    directory = write_tiny_model(tmp_path / "tiny")
    weights = directory / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelLoadError, match="model.safetensors is not a whole safetensors file"):
        load_model(ModelConfig(source=str(directory), quantization="none", dtype="float32"), tmp_path)


def test_the_worker_refuses_a_corrupt_gguf_in_one_line_and_exits(tmp_path):
    path = _truncated(tmp_path)
    cache = tmp_path / "cache"
    model = json.dumps({"source": str(path), "quantization": "none", "dtype": "float32"})
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "worker", "--port", "1", "--data-dir", str(tmp_path / "data"),
                           "--model-json", model], cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == MODEL_LOAD_FAILED_EXIT
    [line] = [line for line in done.stderr.splitlines() if line.startswith(MODEL_LOAD_FAILED)]
    assert "model.gguf is truncated" in line
    assert _cache_entries(cache) == []


def test_loading_the_default_gguf_peaks_within_a_quarter_above_what_it_then_holds(smol, tmp_path):
    """Peak RSS (VmHWM) of a fresh process loading SmolLM2 in float32 against its RSS once loaded: one tensor
    in float32 beside the model at a time, never a copy of the model (the old path peaked at 2.75x)."""
    script = ("import json; from pathlib import Path; from common.protocol import ModelConfig; "
              "from worker.loading import load_model; "
              f"m = load_model(ModelConfig(quantization='none', dtype='float32'), Path({str(tmp_path)!r})); "
              "status = dict(line.split(':', 1) for line in open('/proc/self/status')); "
              "print(json.dumps({k: int(status[k].split()[0]) for k in ('VmHWM', 'VmRSS')}))")
    env = {**os.environ, "PYTHONPATH": str(REPO)}  # SLUICE_MODEL_CACHE: the tests' cache (the `smol` fixture)
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    memory = json.loads(done.stdout.strip().splitlines()[-1])
    assert memory["VmHWM"] <= 1.25 * memory["VmRSS"], memory
