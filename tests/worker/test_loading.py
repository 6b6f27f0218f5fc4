"""Model sources and quantization modes: each loads and generates through our runner."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import boto3
import pytest
import torch
from structlog.testing import capture_logs
from transformers import LlamaConfig, LlamaForCausalLM

from common.protocol import ModelConfig
from testkit.servers import free_port
from testkit.sluice import MODEL_CACHE
from worker.c_compiler import compiler_problem
from worker.cpu_features import AVX512_VNNI, cpu_features, pick_cpu_default
from worker.engine.runner import ModelRunner, UnsupportedModel
from worker.engine.w8a8 import quantize_runner
from worker.gguf_load import METADATA_FORMAT, gguf_metadata_dir
from worker.loading import (
    ModelLoadError,
    default_gguf_path,
    file_sha256,
    load_model,
    pick_compute,
    remembered_sha256,
    resolve_source,
    weights_id,
)


def greedy(loaded, prompt: str, steps: int) -> list[int]:
    """Greedy tokens from our runner (prefill + decode) for one prompt."""
    ids = loaded.tokenizer(prompt).input_ids
    runner = ModelRunner(loaded.model, 1, 256)
    runner.prefill(0, ids[:-1])
    token, length, out = ids[-1], len(ids) - 1, []
    for _ in range(steps):
        token = int(runner.decode([token], [length]).logits[0].argmax())
        length += 1
        out.append(token)
    return out


def hf_greedy(loaded, prompt: str, steps: int) -> list[int]:
    ids = loaded.tokenizer(prompt).input_ids
    with torch.inference_mode():
        out = loaded.model.generate(torch.tensor([ids]), max_new_tokens=steps, do_sample=False,
                                    pad_token_id=loaded.tokenizer.eos_token_id)
    return out[0, len(ids):].tolist()


def write_tiny_llama(tmp_path_factory, tokenizer, name: str, intermediate_size: int) -> Path:
    """A random two-layer Llama with `tokenizer`, written as a plain HF directory."""
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=intermediate_size,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=512, eos_token_id=tokenizer.eos_token_id)
    directory = tmp_path_factory.mktemp(name)
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def tiny_model_dir(tmp_path_factory, smol) -> Path:
    """A random two-layer Llama with SmolLM2's tokenizer."""
    return write_tiny_llama(tmp_path_factory, smol.tokenizer, "tiny-llama", intermediate_size=128)


@pytest.fixture(scope="module")
def narrow_block_model_dir(tmp_path_factory, smol) -> Path:
    """The same, with an MLP 96 wide: its down projection's input is not a multiple of a 4-bit block (64)."""
    return write_tiny_llama(tmp_path_factory, smol.tokenizer, "narrow-block-llama", intermediate_size=96)


@pytest.mark.parametrize("quantization", ["nf4", "fp4"])
def test_a_4bit_layer_off_the_block_size_keeps_the_portable_layout_and_answers(narrow_block_model_dir, tmp_path,
                                                                               quantization):
    """bitsandbytes' AVX512-BF16 repacking fails on such a layer at the first forward (every prefill failed on
    CPUs that have it); `keep_4bit_layout` leaves those layers out of it, and only those."""
    loaded = load_model(ModelConfig(name="tiny", source=str(narrow_block_model_dir), quantization=quantization),
                        tmp_path)
    mlp = loaded.model.model.layers[0].mlp
    assert mlp.down_proj.in_features == 96 and not mlp.down_proj.support_avx512bf16_for_cpu
    assert mlp.up_proj.support_avx512bf16_for_cpu == type(mlp.up_proj)(64, 96).support_avx512bf16_for_cpu
    assert greedy(loaded, "Hello there", 6) == hf_greedy(loaded, "Hello there", 6)


def test_a_gguf_is_read_as_it_is_and_its_metadata_kept_once(smol, tmp_path):
    gguf = default_gguf_path()
    assert resolve_source("", tmp_path) == gguf == resolve_source(str(gguf), tmp_path)
    kept = gguf_metadata_dir(gguf, MODEL_CACHE)
    assert kept == MODEL_CACHE / f"{file_sha256(gguf)}.gguf{METADATA_FORMAT}"
    assert not list(kept.glob("*.safetensors"))  # config, tokenizer and the tensor index: no weights
    stamp = (kept / "config.json").stat().st_mtime_ns
    assert gguf_metadata_dir(gguf, MODEL_CACHE) == kept and (kept / "config.json").stat().st_mtime_ns == stamp
    assert smol.model.config.model_type == "llama" and smol.dtype == torch.float32
    assert smol.quantization == "none"


def test_a_files_hash_is_remembered_until_the_file_changes(tmp_path):
    source = tmp_path / "model.gguf"
    source.write_bytes(b"first")
    cache = tmp_path / "cache"
    assert remembered_sha256(source, cache) == file_sha256(source)
    [memo] = (cache / ".sha256").iterdir()
    memo.write_text("f" * 64)  # what a later start reads instead of hashing the file again
    assert remembered_sha256(source, cache) == "f" * 64
    source.write_bytes(b"second, longer")  # changed in place: a new size (and mtime), so hashed again
    assert remembered_sha256(source, cache) == file_sha256(source)
    blocked = tmp_path / "not-a-directory"
    blocked.write_text("")  # a cache it cannot write to still answers
    assert remembered_sha256(source, blocked) == file_sha256(source)


def test_default_model_matches_transformers_generate(smol):
    assert greedy(smol, "The capital of France is", 12) == hf_greedy(smol, "The capital of France is", 12)


def test_the_tokenizer_keeps_no_copy_of_the_tables_it_was_built_from(tmp_path):
    """transformers' Gemma tokenizer keeps the vocabulary dict and merges list it built the Rust tokenizer from
    (~180 MB of Python objects for Gemma 3's 262k tokens); the loaded tokenizer drops them, and encodes, decodes
    and lists its vocabulary as the tokenizer transformers loads from the same files."""
    from transformers import AutoTokenizer
    from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581h", "he",
              "\u2581he", "ll", "llo"]
    tokenizer = GemmaTokenizer(vocab={piece: i for i, piece in enumerate(pieces)},
                               merges=[("\u2581", "h"), ("h", "e"), ("\u2581h", "e"), ("l", "l"), ("ll", "o")])
    config = LlamaConfig(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128, bos_token_id=2,
                         eos_token_id=1)
    directory = tmp_path / "gemma-tokenized"
    LlamaForCausalLM(config).save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    loaded = load_model(ModelConfig(name="tiny", source=str(directory), quantization="none"), tmp_path / "data")
    fresh = AutoTokenizer.from_pretrained(directory)
    assert {"_vocab", "_merges"} <= set(vars(fresh))  # what there is to drop
    assert not {"_vocab", "_merges"} & set(vars(loaded.tokenizer))
    for text in ("hello world", "he<eos>llo jello", "<bos>zebra  hello\t"):
        ids = fresh(text).input_ids
        assert loaded.tokenizer(text).input_ids == ids and loaded.tokenizer.decode(ids) == fresh.decode(ids)
    assert loaded.tokenizer.get_vocab() == fresh.get_vocab() and len(loaded.tokenizer) == len(fresh)


@pytest.mark.parametrize("quantization", ["none", "int8", "nf4", "fp4", "w8a8", "q4"])
def test_hf_directory_in_every_quantization_mode(tiny_model_dir, tmp_path, quantization):
    loaded = load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), quantization=quantization), tmp_path)
    assert loaded.quantization == quantization and loaded.fallback is None  # named, so never swapped
    layer = type(loaded.model.model.layers[0].self_attn.q_proj).__name__
    # w8a8 and q4 leave the Hugging Face modules in float32: only the engine's runner is quantized
    assert layer == {"none": "Linear", "int8": "Linear8bitLt", "nf4": "Linear4bit", "fp4": "Linear4bit",
                     "w8a8": "Linear", "q4": "Linear"}[quantization]
    assert greedy(loaded, "Hello there", 6) == hf_greedy(loaded, "Hello there", 6)


def test_q4_for_an_engine_alone_leaves_packed_weights_unread_and_reads_them_once(tiny_model_dir, tmp_path,
                                                                                 monkeypatch):
    """`engine_only` (a worker): the tensors q4 packs stay unread; the first engine reads them one at a time to
    pack them into the pack cache, a later start reads only that cache. Both serve what an engine over the
    fully loaded model serves."""
    from tests.worker.engine.runs import generate
    from worker.engine.engine import Engine

    monkeypatch.setenv("SLUICE_MODEL_CACHE", str(tmp_path / "cache"))
    config = ModelConfig(name="tiny", source=str(tiny_model_dir), quantization="q4", max_batch_size=4,
                         max_context=256)

    def served(loaded, owns_model: bool) -> list[int]:
        engine = Engine(loaded, config, "q4", data_dir=tmp_path, owns_model=owns_model)
        engine.start()
        try:
            return generate(engine, "Hello there", max_tokens=8, temperature=0.0, ignore_eos=True).finishes[0].token_ids
        finally:
            engine.stop()

    reads: list[str] = []
    first = load_model(config, tmp_path, engine_only=True)
    attention = first.model.model.layers[0].self_attn
    assert attention.q_proj.weight.is_meta and first.model.model.embed_tokens.weight.is_meta
    assert not first.model.model.layers[0].input_layernorm.weight.is_meta
    read = first.read_weight
    first.read_weight = lambda name: reads.append(name) or read(name)
    tokens = served(first, owns_model=True)
    assert "model.layers.1.mlp.down_proj.weight" in reads and "model.embed_tokens.weight" in reads
    assert tokens == served(load_model(config, tmp_path), owns_model=False)

    def refuse(name: str):
        raise AssertionError(f"{name} was read although the pack cache holds it")

    again = load_model(config, tmp_path, engine_only=True)
    again.read_weight = refuse
    assert served(again, owns_model=True) == tokens


def test_w8a8_needs_cpu_and_float32(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="w8a8"):
        load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), quantization="w8a8", dtype="bfloat16"),
                   tmp_path)


def test_q4_needs_cpu_and_float32(tiny_model_dir, tmp_path):
    with pytest.raises(ModelLoadError, match="q4"):
        load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), quantization="q4", dtype="bfloat16"),
                   tmp_path)


def test_w8a8_refuses_bitsandbytes_layers(tiny_model_dir, tmp_path):
    loaded = load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), quantization="int8"), tmp_path)
    with pytest.raises(UnsupportedModel, match="w8a8"):
        quantize_runner(ModelRunner(loaded.model, 1, 64), loaded.tokenizer)


@pytest.mark.parametrize("cc", [None, "/nowhere/cc"], ids=["this-machine", "no-compiler"])
def test_auto_picks_by_the_cpus_features_and_says_why(tiny_model_dir, tmp_path, monkeypatch, cc):
    """This machine's pick, and the same without a C compiler: never q4 then, and where the CPU would have
    run q4 the log line says which compiler was missing."""
    if cc:
        monkeypatch.setenv("CC", cc)
    engines = frozenset(torch.backends.quantized.supported_engines)
    expected = pick_cpu_default(cpu_features(), engines, compiler_problem())
    with capture_logs() as logs:
        loaded = load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), device="cpu"), tmp_path)
    assert (loaded.quantization, str(loaded.dtype)) == (expected.quantization, f"torch.{expected.dtype}")
    assert loaded.fallback == ("w8a8" if loaded.quantization == "q4" else None)  # what runs if q4 cannot start
    [picked] = [entry for entry in logs if entry["event"] == "compute_picked"]
    assert picked["quantization"] == expected.quantization and picked["reason"] == expected.reason
    assert set(picked["cpu_features"]) == cpu_features()
    if cc:
        assert loaded.quantization != "q4"
        if AVX512_VNNI in cpu_features() and loaded.quantization == "w8a8":
            assert cc in picked["reason"]


@pytest.mark.parametrize(("quantization", "dtype", "expected"), [
    ("auto", "float32", ("none", torch.float32)),  # a pinned dtype means unquantized: the parity tests' setting
    ("none", "auto", ("none", torch.float32)),
    ("w8a8", "auto", ("w8a8", torch.float32)),
])
def test_an_explicit_setting_is_kept(quantization, dtype, expected):
    picked = pick_compute(quantization, dtype, torch.device("cpu"))
    assert picked[:2] == expected


def test_the_weights_id_changes_with_the_weights_files(tiny_model_dir, tmp_path):
    copy = tmp_path / "copy"
    shutil.copytree(tiny_model_dir, copy)
    first = weights_id(copy)
    assert first is not None and weights_id(copy) == first
    weights = next(copy.glob("*.safetensors"))
    os.utime(weights, ns=(weights.stat().st_atime_ns, weights.stat().st_mtime_ns + 1))
    assert weights_id(copy) != first
    assert weights_id(tmp_path / "missing") is None and weights_id("HuggingFaceTB/some-hub-id") is None


def test_bfloat16_is_selectable(tiny_model_dir, tmp_path):
    loaded = load_model(ModelConfig(name="tiny", source=str(tiny_model_dir), dtype="bfloat16"), tmp_path)
    assert loaded.dtype == torch.bfloat16 and loaded.model.dtype == torch.bfloat16
    assert len(greedy(loaded, "Hello there", 4)) == 4


def _load_in_subprocess(source: str, hub_cache: Path, data_dir: Path) -> subprocess.CompletedProcess:
    """The hub cache location is read at import time, so load in a fresh interpreter, as a worker does."""
    script = ("import sys; from pathlib import Path; from worker.loading import load_model; "
              "from common.protocol import ModelConfig; "
              f"m = load_model(ModelConfig(name={source!r}, source={source!r}), Path({str(data_dir)!r})); "
              "print('layers', m.model.config.num_hidden_layers)")
    env = {**os.environ, "HF_HUB_CACHE": str(hub_cache), "HF_HUB_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=300)


def test_hub_id_loads_from_the_local_cache_offline(tiny_model_dir, tmp_path):
    snapshot = tmp_path / "hub" / "models--acme--tiny" / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    for item in tiny_model_dir.iterdir():
        (snapshot / item.name).symlink_to(item)
    refs = tmp_path / "hub" / "models--acme--tiny" / "refs"
    refs.mkdir()
    (refs / "main").write_text("0123abcd")
    loaded = _load_in_subprocess("acme/tiny", tmp_path / "hub", tmp_path)
    assert "layers 2" in loaded.stdout, loaded.stderr[-2000:]
    missing = _load_in_subprocess("nobody/nothing", tmp_path / "hub", tmp_path)
    assert missing.returncode != 0 and "ModelLoadError" in missing.stderr


@pytest.fixture
def s3(monkeypatch):
    """A real S3 API (moto's server) that model sources are read from; yields a boto3 client."""
    from moto.server import ThreadedMotoServer

    port = free_port()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        endpoint = f"http://127.0.0.1:{port}"
        for name, value in {"AWS_ACCESS_KEY_ID": "test", "AWS_SECRET_ACCESS_KEY": "test",
                            "AWS_DEFAULT_REGION": "us-east-1", "SLUICE_S3_ENDPOINT": endpoint}.items():
            monkeypatch.setenv(name, value)
        client = boto3.client("s3", endpoint_url=endpoint)
        client.create_bucket(Bucket="models")
        yield client
    finally:
        server.stop()


def test_s3_source_downloads_once(tiny_model_dir, tmp_path, s3):
    for item in tiny_model_dir.iterdir():
        s3.upload_file(str(item), "models", f"tiny/v1/{item.name}")
    s3.put_object(Bucket="models", Key="tiny/v1/notes/", Body=b"")  # a folder marker: no file
    s3.put_object(Bucket="models", Key="tiny/v10/config.json", Body=b"{}")  # a sibling prefix: not ours
    loaded = load_model(ModelConfig(name="tiny", source="s3://models/tiny/v1"), tmp_path)
    assert loaded.model.config.hidden_size == 64
    local = tmp_path / "s3" / "models" / "tiny" / "v1"
    assert (local / "config.json").exists() and not (local / "0").exists() and not (local / "notes").exists()
    s3.delete_object(Bucket="models", Key="tiny/v1/config.json")  # a second load must not need S3
    assert resolve_source("s3://models/tiny/v1", tmp_path) == local
    with pytest.raises(ModelLoadError):
        resolve_source("s3://models/empty-prefix", tmp_path)


def test_an_s3_prefix_without_a_config_is_refused_before_any_download(tmp_path, s3):
    s3.put_object(Bucket="models", Key="weights-only/model.safetensors", Body=b"not a model on its own")
    with pytest.raises(ModelLoadError, match="no config.json under s3://models/weights-only"):
        resolve_source("s3://models/weights-only", tmp_path)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []


@pytest.mark.parametrize(("source", "key"), [
    ("s3://models/tiny/v1", "tiny/v1/../../../../../escaped.txt"),
    ("s3://models/tiny/v1", "tiny/v1/sub/../../../../../../escaped.txt"),
    ("s3://models/tiny/v1", "tiny/v1//escaped.txt"),
    ("s3://models/tiny/v1", "tiny/v1/./escaped.txt"),
    ("s3://models", "/escaped.txt"),
])
def test_s3_keys_that_would_leave_the_cache_are_refused_before_any_download(tmp_path, s3, source, key):
    data_dir = tmp_path / "data"
    s3.put_object(Bucket="models", Key="tiny/v1/config.json", Body=b"{}")
    s3.put_object(Bucket="models", Key=key, Body=b"written outside the model cache")
    with pytest.raises(ModelLoadError, match="refusing S3 object key"):
        resolve_source(source, data_dir)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # not even the harmless config.json


@pytest.mark.parametrize("source", ["s3://models/tiny/../../..", "s3://../models/x", "s3://models/a//b"])
def test_s3_sources_with_dot_segments_are_refused(tmp_path, source):
    with pytest.raises(ModelLoadError, match="refusing S3"):
        resolve_source(source, tmp_path)


@pytest.mark.parametrize("source", ["/no/such/dir", "./missing.gguf", "/no/such/model.gguf"])
def test_missing_sources_fail_clearly(source, tmp_path):
    with pytest.raises(ModelLoadError):
        resolve_source(source, tmp_path)


def test_directory_without_config_is_refused(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelLoadError, match="config.json"):
        resolve_source(str(tmp_path / "empty"), tmp_path)


def test_cached_gguf_dir_survives_without_the_env(tmp_path, monkeypatch):
    monkeypatch.delenv("SLUICE_MODEL_CACHE", raising=False)
    assert os.environ.get("SLUICE_MODEL_CACHE") is None
    from worker.loading import model_cache_dir

    assert model_cache_dir(tmp_path) == tmp_path / "models"
