"""A GGUF file's config and tokenizer, as transformers builds them from its metadata, without its slow reads.

`AutoConfig.from_pretrained(..., gguf_file=)` reads most architectures (Gemma 3's, Llama's) through gguf's
GGUFReader, element by element: Gemma 3 270M's 262,144-token vocabulary cost it ~13 s of a core, and
`AutoTokenizer` read it that way once more only to learn the config's model type. Here:

- the config is transformers' GGUF config read of a copy of the header without the vocabulary's arrays
  (gguf_header.SKIPPED: nothing but the tokenizer reads them, and the config only their length, for a
  file whose metadata names no vocabulary size), a few KB written beside the config (a value gguf's writer
  cannot write back: the whole file is read as before, with a log line);
- the tokenizer is built by the class transformers' `AutoTokenizer` picks for that config's model type
  (`tokenizer_type`), which reads the vocabulary through transformers' own fast GGUF reader.

tests/worker/test_gguf_metadata.py holds both to `AutoConfig` / `AutoTokenizer` on the file itself.
"""

from __future__ import annotations

import json
import logging
import struct
from pathlib import Path

import numpy as np
import structlog
from gguf import GGUFValueType, GGUFWriter
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig

from worker.gguf_header import Header

log = structlog.get_logger(__name__)

TOKENS = "tokenizer.ggml.tokens"
HEADER_COPY = "header-without-vocabulary.gguf"


def gguf_config(gguf: Path, header: Header, staging: Path) -> PretrainedConfig:
    """The config transformers reads from `gguf`, whose parsed header is `header` (the copy is written in
    `staging`, a scratch directory, and removed)."""
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint

    architecture = str(header.metadata["general.architecture"].value)
    if architecture in GGUF_CONFIG_ARCHS:  # transformers reads these with its fast reader: nothing to spare
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    copy = staging / HEADER_COPY
    try:
        _write_header_copy(header, architecture, copy)
    except (ValueError, TypeError, struct.error, OverflowError) as error:  # a value gguf's writer cannot write back
        log.warning("gguf_config_read_whole", file=gguf.name, reason=str(error)[:200])
        copy.unlink(missing_ok=True)
        return AutoConfig.from_pretrained(gguf.parent, gguf_file=gguf.name)
    quiet = logging.getLogger(load_gguf_checkpoint.__module__)  # it warns that the copy has no tokens
    level = quiet.level
    quiet.setLevel(logging.ERROR)
    try:
        config = load_gguf_checkpoint(str(copy), return_tensors=False)["config"]
    finally:
        quiet.setLevel(level)
        copy.unlink()
    tokens = header.metadata.get(TOKENS)
    if "vocab_size" not in config and tokens is not None:  # what the read takes from the tokens' count
        config["vocab_size"] = tokens.value if tokens.skipped else len(tokens.value)  # type: ignore[arg-type]
    (staging / "config.json").write_text(json.dumps(config))
    config = AutoConfig.from_pretrained(staging, local_files_only=True)
    config._name_or_path = str(gguf.parent)  # as read from the file itself
    return config


def _write_header_copy(header: Header, architecture: str, path: Path) -> None:
    """The metadata but the skipped arrays, and every tensor by name (one float each: the config read looks
    at the names only)."""
    writer = GGUFWriter(str(path), architecture)  # writes general.architecture itself
    for key, value in header.metadata.items():
        if value.skipped or key in ("general.architecture", "general.alignment"):
            continue
        sub_type = None if value.element is None else GGUFValueType(value.element)
        writer.add_key_value(key, value.value, GGUFValueType(value.kind), sub_type=sub_type)
    for tensor in header.tensors:
        writer.add_tensor(tensor.name, np.zeros(1, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_tokenizer(gguf: Path, config: PretrainedConfig):
    """The tokenizer `AutoTokenizer.from_pretrained(gguf_file=)` builds, by the class it would pick for `config`
    (it reads the config again to pick it, the slow way); where that pick could depend on more than the model
    type (a tokenizer_config.json beside the file, a type without a class of its own), AutoTokenizer itself."""
    from transformers.models.auto.tokenization_auto import TOKENIZER_MAPPING_NAMES

    if TOKENIZER_MAPPING_NAMES.get(config.model_type) is None or (gguf.parent / "tokenizer_config.json").exists():
        return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    return AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name, tokenizer_type=config.model_type)
