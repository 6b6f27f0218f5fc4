"""A model cache directory's tokenizer, loaded from its serialized form by the Rust `tokenizers` library.

`AutoTokenizer.from_pretrained` on a GGUF file's metadata directory (gguf_load.gguf_metadata_dir) parses the
whole tokenizer.json in Python (once for its added tokens, once more for the vocabulary and merges its class
rebuilds the Rust tokenizer from): Gemma 3's 262,144 tokens and 514,906 merges cost ~2.6 s of a core on every
start, the largest part of a cached start. The Rust tokenizer that class builds is what tokenizer.json holds, so
`tokenizers` reads it directly (~0.9 s) and transformers' generic class wraps it, given the added tokens and
settings the slow path would have read.

That is used only where it was proven equal: the first load of a directory takes the slow path; then (in a
worker: after it is ready) the fast one is built and compared with it (the Rust pipeline, vocabulary, added
and special tokens, ids and decoding of a corpus, the chat template's output); only when all match is
`FAST_RECORD` written: what the fast load passes and the sha256 of every tokenizer file it reads. A record
that cannot be read is written anew the same way; a tokenizer file that no longer matches its hash refuses
the load with one line (the slow path would read that same file: never a wrong tokenizer).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import structlog

from worker.load_errors import ModelLoadError

log = structlog.get_logger(__name__)

FAST_RECORD = "fast_tokenizer.json"
RECORD_FORMAT = 1
# what AutoTokenizer.from_pretrained reads from a local directory
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
                   "chat_template.jinja")
# where ids and decoding are compared: whitespace runs, digits, code, scripts, emoji, byte fallback
CORPUS = ("Hello world", "  two leading spaces,\ttabs\n\nand blank lines\n", "The year 2024: 3.14159, 1,000,000!",
          'def f(x):\n    return {"a": x ** 2}  # comment', "émoji 🙂🚀, 中文, テスト, العربية, Ünïcödé",
          "\x00\x01 control \u200b zero-width", "a" * 50, "<p>markup</p> &amp; <unk>", "")


def load_tokenizer(directory: Path, slow: Callable[[], Any]) -> tuple[Any, Callable[[], None] | None]:
    """`directory`'s tokenizer: from its fast record where one proves it, else `slow()` (AutoTokenizer). With the
    slow one comes what proves the fast load and records it for the next start: ~3 s of a core for Gemma 3,
    which a worker runs after it is ready (nothing it answers depends on it); None where nothing is left to do."""
    record = _read_record(directory)
    if record is not None:
        _check_files(directory, record["files"])
        return _fast(directory, record), None
    tokenizer = slow()
    template = tokenizer.chat_template  # the files' (a worker may give one to a model whose files carry none)
    return tokenizer, lambda: _record(directory, tokenizer, template)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as handle:
        while chunk := handle.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _files(directory: Path) -> dict[str, str]:
    return {name: _sha256(directory / name) for name in TOKENIZER_FILES if (directory / name).is_file()}


def _read_record(directory: Path) -> dict | None:
    path = directory / FAST_RECORD
    try:
        record = json.loads(path.read_text())
        if record.get("format") != RECORD_FORMAT:
            return None  # another layout: the slow path writes this one
        if not (isinstance(record["files"], dict) and isinstance(record["added_tokens"], dict)
                and isinstance(record["padding_side"], str) and "tokenizer.json" in record["files"]):
            raise ValueError("missing fields")
        return record
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as error:
        log.warning("fast_tokenizer_record_unreadable", file=str(path), reason=str(error)[:200],
                    action="the tokenizer is loaded the slow way and the record written anew")
        return None


def _check_files(directory: Path, recorded: dict[str, str]) -> None:
    now = _files(directory)
    for name in sorted(set(now) | set(recorded)):
        if now.get(name) != recorded.get(name):
            state = "is missing" if name not in now else "appeared" if name not in recorded else "has changed"
            raise ModelLoadError(f"model cache {directory}: {name} {state} since its tokenizer was checked "
                                 f"(a corrupt or edited cache): delete {directory} and start again")


def _fast(directory: Path, record: dict):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    # given the added tokens, from_pretrained reads tokenizer.json only through `tokenizers` (Rust); the generic
    # class loads it as it is, where a model's own class would rebuild it from a Python parse of the file
    added = {int(index): AddedToken(**token) for index, token in record["added_tokens"].items()}
    return PreTrainedTokenizerFast.from_pretrained(directory, local_files_only=True, added_tokens_decoder=added,
                                                   padding_side=record["padding_side"])


def _record(directory: Path, slow, template: str | None) -> None:
    """Prove the fast load equal to `slow` (the tokenizer AutoTokenizer loaded from `directory`, whose chat
    template was `template` then) and write the record; where they differ, or the fast load fails, nothing is
    written and every start takes the slow path."""
    if type(getattr(slow, "_tokenizer", None)).__module__.split(".")[0] != "tokenizers":
        return  # no Rust tokenizer to read directly
    files = _files(directory)
    if "tokenizer.json" not in files:
        return
    record = {"format": RECORD_FORMAT, "files": files, "padding_side": slow.padding_side,
              "added_tokens": {str(index): token.__getstate__() for index, token in slow.added_tokens_decoder.items()}}
    try:
        fast = _fast(directory, record)
    except Exception as error:  # noqa: BLE001 (any failure only means the slow path stays)
        log.info("fast_tokenizer_unproven", directory=str(directory), reason=f"loading it failed: {error}"[:200])
        return
    if fast.chat_template != template:
        log.info("fast_tokenizer_unproven", directory=str(directory), reason="the chat templates differ")
        return
    fast.chat_template = slow.chat_template  # both render the one the worker uses
    try:
        difference = tokenizer_difference(slow, fast)
    except Exception as error:  # noqa: BLE001 (as unproven: the slow path stays)
        difference = f"comparing them failed: {error}"[:200]
    if difference is not None:
        log.info("fast_tokenizer_unproven", directory=str(directory), reason=difference)
        return
    handle, temporary = tempfile.mkstemp(dir=directory, prefix=f".{FAST_RECORD}.")
    try:
        with os.fdopen(handle, "w") as out:
            json.dump(record, out)
        os.replace(temporary, directory / FAST_RECORD)  # atomic: a reader sees all of it or none
    except OSError as error:  # a read-only cache: the slow path each time
        log.info("fast_tokenizer_unrecorded", directory=str(directory), reason=str(error)[:200])
        with contextlib.suppress(OSError):
            Path(temporary).unlink()


def tokenizer_difference(slow, fast) -> str | None:
    """Where `fast` would answer differently from `slow`, or None."""
    if slow.backend_tokenizer.to_str() != fast.backend_tokenizer.to_str():
        return "the Rust pipelines differ"
    for attribute in ("added_tokens_decoder", "special_tokens_map", "all_special_ids", "all_special_tokens",
                      "bos_token_id", "eos_token_id", "pad_token_id", "unk_token_id", "padding_side",
                      "truncation_side", "model_max_length", "chat_template", "clean_up_tokenization_spaces",
                      "model_input_names"):
        if getattr(slow, attribute, None) != getattr(fast, attribute, None):
            return f"{attribute} differs"
    if len(slow) != len(fast) or slow.get_vocab() != fast.get_vocab():
        return "the vocabularies differ"
    specials = [str(token) for token in slow.added_tokens_decoder.values()]
    sampled = slow.convert_ids_to_tokens(list(range(0, len(slow), max(1, len(slow) // 512))))
    corpus = [*CORPUS, " ".join(specials[:256]), "".join(specials[:64]) + " tail", " ".join(map(str, sampled))]
    for text in corpus:
        for special in (True, False):
            ids = slow.encode(text, add_special_tokens=special)
            if fast.encode(text, add_special_tokens=special) != ids:
                return f"the ids of {text[:40]!r} differ"
            for skip in (True, False):
                if slow.decode(ids, skip_special_tokens=skip) != fast.decode(ids, skip_special_tokens=skip):
                    return f"the decoding of {text[:40]!r} differs"
    every = list(range(len(slow)))
    if slow.convert_ids_to_tokens(every) != fast.convert_ids_to_tokens(every):
        return "the tokens of some ids differ"
    if slow.chat_template:
        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"},
                    {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "And again?"}]
        try:
            expected = slow.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except Exception:  # noqa: BLE001 (a template that refuses this conversation: then the same for both)
            expected = None
        if expected is not None and fast.apply_chat_template(messages, tokenize=False,
                                                             add_generation_prompt=True) != expected:
            return "the chat template's output differs"
    return None
