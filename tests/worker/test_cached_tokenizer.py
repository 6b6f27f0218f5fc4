"""A model cache directory's tokenizer read through `tokenizers` (worker/cached_tokenizer.py) is the tokenizer
AutoTokenizer loads from the same files: recorded only once proven equal, refused when a file it read changed,
written anew when its record cannot be read."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast
from transformers.models.gemma.tokenization_gemma import GemmaTokenizer

from common.protocol import ModelConfig
from common.worker_launch import MODEL_LOAD_FAILED, MODEL_LOAD_FAILED_EXIT
from testkit.servers import free_port
from testkit.sluice import MODEL_CACHE, REPO
from worker.cached_tokenizer import FAST_RECORD, TOKENIZER_FILES, load_tokenizer, tokenizer_difference
from worker.gguf_load import gguf_metadata_dir
from worker.known_chat_templates import KNOWN
from worker.load_errors import ModelLoadError
from worker.loading import default_gguf_path, load_model

CORPUS = ["<start_of_turn>user\nhello world<end_of_turn>\n<start_of_turn>model\n", "he<eos>llo jello",
          "<bos>zebra  hello\t", "  leading and trailing  ", "ünï 🙂 中", "<|im_start|>user\nHi<|im_end|>\n"]
MESSAGES = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hello"},
            {"role": "assistant", "content": "hello jello"}, {"role": "user", "content": "zebra?"}]


def _gemma_directory(tmp_path: Path) -> Path:
    """A small Gemma tokenizer (the class that rebuilds its Rust tokenizer from a Python parse), with added
    tokens, saved as the model cache keeps one."""
    pieces = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "\u2581", *"abcdefghijklmnopqrstuvwxyz", "\u2581h", "he",
              "\u2581he", "ll", "llo"]
    tokenizer = GemmaTokenizer(vocab={piece: i for i, piece in enumerate(pieces)},
                               merges=[("\u2581", "h"), ("h", "e"), ("\u2581h", "e"), ("l", "l"), ("ll", "o")])
    tokenizer.add_special_tokens({"additional_special_tokens": ["<start_of_turn>", "<end_of_turn>"]})
    directory = tmp_path / "gemma-tokenizer"
    tokenizer.save_pretrained(directory)
    return directory


def _smol_directory(tmp_path: Path) -> Path:
    """The default model's tokenizer files, as its GGUF's metadata directory holds them (copied: a record
    written here must not reach the shared cache)."""
    kept = gguf_metadata_dir(default_gguf_path(), MODEL_CACHE)
    directory = tmp_path / "smol-tokenizer"
    directory.mkdir()
    for name in TOKENIZER_FILES:
        if (kept / name).is_file():
            shutil.copy(kept / name, directory / name)
    return directory


def _slow(directory: Path):
    return lambda: AutoTokenizer.from_pretrained(directory, local_files_only=True)


def _load_and_record(directory: Path):
    """A first load: the slow path, then what a worker runs after it is ready (the proof and the record)."""
    tokenizer, after_ready = load_tokenizer(directory, _slow(directory))
    assert after_ready is not None
    tokenizer.chat_template = tokenizer.chat_template or KNOWN["gemma3"].template  # as the worker gives one
    after_ready()
    return tokenizer


def _recorded(directory: Path):
    tokenizer, after_ready = load_tokenizer(directory, lambda: pytest.fail("a recorded directory is read slowly"))
    assert after_ready is None
    return tokenizer


def _assert_same(ours, theirs) -> None:
    assert tokenizer_difference(theirs, ours) is None
    assert ours.all_special_tokens == theirs.all_special_tokens
    assert ours.added_tokens_decoder == theirs.added_tokens_decoder
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id) == (theirs.bos_token_id, theirs.eos_token_id,
                                                                        theirs.pad_token_id)
    assert ours.get_vocab() == theirs.get_vocab() and ours.padding_side == theirs.padding_side
    for text in CORPUS:
        ids = theirs(text).input_ids
        assert ours(text).input_ids == ids
        assert ours.decode(ids) == theirs.decode(ids)
        assert ours.decode(ids, skip_special_tokens=True) == theirs.decode(ids, skip_special_tokens=True)
    for tokenizer in (ours, theirs):  # the template the worker gives a model whose files carry none
        tokenizer.chat_template = tokenizer.chat_template or KNOWN["gemma3"].template
    assert ours.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True) == \
        theirs.apply_chat_template(MESSAGES, tokenize=False, add_generation_prompt=True)
    assert ours.apply_chat_template(MESSAGES, add_generation_prompt=True) == \
        theirs.apply_chat_template(MESSAGES, add_generation_prompt=True)


@pytest.mark.parametrize("make", [_gemma_directory, _smol_directory], ids=["gemma-class", "smollm2"])
def test_the_first_load_proves_and_records_the_fast_one_and_later_loads_take_it(make, tmp_path):
    directory = make(tmp_path)
    assert not (directory / FAST_RECORD).exists()
    first = _load_and_record(directory)
    assert type(first) is type(AutoTokenizer.from_pretrained(directory))  # the slow path, which proved the record
    record = json.loads((directory / FAST_RECORD).read_text())
    assert "tokenizer.json" in record["files"]
    later = _recorded(directory)
    assert isinstance(later, PreTrainedTokenizerFast) and "_merges" not in vars(later)
    _assert_same(later, AutoTokenizer.from_pretrained(directory, local_files_only=True))


def test_a_tokenizer_file_changed_after_its_record_is_refused_in_one_line(tmp_path):
    directory = _gemma_directory(tmp_path)
    _load_and_record(directory)
    content = json.loads((directory / "tokenizer.json").read_text())
    content["model"]["vocab"]["zz"] = content["model"]["vocab"].pop("llo")  # still parses: a wrong tokenizer
    (directory / "tokenizer.json").write_text(json.dumps(content))
    with pytest.raises(ModelLoadError) as refused:
        load_tokenizer(directory, lambda: pytest.fail("a changed file is not read the slow way either"))
    message = str(refused.value)
    assert "\n" not in message and "tokenizer.json has changed" in message and f"delete {directory}" in message
    (directory / "chat_template.jinja").write_text("{{ messages }}")  # a file the slow path would read too
    with pytest.raises(ModelLoadError, match="chat_template.jinja appeared"):
        load_tokenizer(directory, _slow(directory))
    (directory / "chat_template.jinja").unlink()
    (directory / "tokenizer.json").unlink()
    with pytest.raises(ModelLoadError, match="tokenizer.json is missing"):
        load_tokenizer(directory, _slow(directory))


@pytest.mark.parametrize("record", ["{not json", '{"format": 1, "files": []}', "[]", ""])
def test_an_unreadable_record_is_written_anew_by_the_slow_path(record, tmp_path):
    directory = _gemma_directory(tmp_path)
    (directory / FAST_RECORD).write_text(record)
    loaded = _load_and_record(directory)
    assert isinstance(loaded, GemmaTokenizer)  # the slow path
    assert "tokenizer.json" in json.loads((directory / FAST_RECORD).read_text())["files"]
    _assert_same(_recorded(directory), AutoTokenizer.from_pretrained(directory))


def test_a_tokenizer_that_answers_differently_is_never_recorded(tmp_path):
    directory = _gemma_directory(tmp_path)
    slow = AutoTokenizer.from_pretrained(directory)
    other = AutoTokenizer.from_pretrained(directory)
    other.backend_tokenizer.model.unk_token = "<pad>"
    assert tokenizer_difference(slow, other) == "the Rust pipelines differ"
    other = AutoTokenizer.from_pretrained(directory, padding_side="right")
    assert tokenizer_difference(slow, other) == "padding_side differs"
    other = AutoTokenizer.from_pretrained(directory, chat_template="{{ bos_token }}")
    assert tokenizer_difference(slow, other) == "chat_template differs"
    calls = []

    def loaded_differently():
        calls.append(1)
        return other

    for _ in range(2):
        loaded, after_ready = load_tokenizer(directory, loaded_differently)
        assert loaded is other
        after_ready()
        assert not (directory / FAST_RECORD).exists()  # every start takes the slow path
    assert len(calls) == 2


def test_a_cached_gguf_start_loads_the_recorded_tokenizer(tmp_path, monkeypatch):
    monkeypatch.setenv("SLUICE_MODEL_CACHE", str(tmp_path / "models"))
    config = ModelConfig(dtype="float32", quantization="none")
    first = load_model(config, tmp_path / "data")
    kept = gguf_metadata_dir(default_gguf_path(), tmp_path / "models")
    assert first.after_ready is not None and not (kept / FAST_RECORD).exists()
    first.after_ready()  # with the template the worker gave it meanwhile, where the files carry none
    assert (kept / FAST_RECORD).is_file()
    again = load_model(config, tmp_path / "data")
    assert isinstance(again.tokenizer, PreTrainedTokenizerFast) and again.after_ready is None
    _assert_same(again.tokenizer, first.tokenizer)


def test_a_worker_records_it_once_ready_and_refuses_a_changed_file_in_one_line(tmp_path):
    """worker/__main__.py runs the proof after `worker_ready`; the next worker on that cache reads the record, and
    one whose tokenizer.json changed since exits with one line."""
    cache = tmp_path / "cache"
    env = {**os.environ, "SLUICE_MODEL_CACHE": str(cache), "PYTHONPATH": str(REPO)}
    command = [sys.executable, "-m", "worker", "--port", str(free_port()), "--data-dir", str(tmp_path / "data"),
               "--model-json", json.dumps({"quantization": "none", "dtype": "float32"})]
    worker = subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    kept = gguf_metadata_dir(default_gguf_path(), cache)  # what the worker finds built, or builds first
    try:
        deadline = time.monotonic() + 300  # a bound on a hung start, not a timing the test asserts
        while not (kept / FAST_RECORD).is_file() and worker.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
    finally:
        worker.terminate()
        worker.wait(timeout=60)
    assert (kept / FAST_RECORD).is_file()
    content = json.loads((kept / "tokenizer.json").read_text())
    vocab = content["model"]["vocab"]
    first, second = list(vocab)[300:302]
    vocab[first], vocab[second] = vocab[second], vocab[first]  # two ids swapped: a tokenizer that still loads
    (kept / "tokenizer.json").write_text(json.dumps(content))
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == MODEL_LOAD_FAILED_EXIT
    [line] = [line for line in done.stderr.splitlines() if line.startswith(MODEL_LOAD_FAILED)]
    assert "tokenizer.json has changed since its tokenizer was checked" in line and "delete" in line
