"""What one tenant's grammar may cost the worker: a compile that overruns `timeout_s` is stopped (its process
killed, so no core goes on burning for it), and the compiled-grammar cache is bounded in bytes, by xgrammar's
own measure of each grammar."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time

import psutil
import pytest
import xgrammar

from common.protocol import Constraint
from worker.decoding.grammar import GrammarCompiler, GrammarTimeout
from worker.decoding.grammar.compile_process import _serve


def schema(value: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(value))


def _compiler(smol, **settings) -> GrammarCompiler:
    from worker.engine.engine import _model_eos_ids

    return GrammarCompiler(smol.tokenizer, smol.model.config.vocab_size, _model_eos_ids(smol), threads=2, **settings)


@pytest.fixture
def compiler(smol):
    compiler = _compiler(smol, timeout_s=1.0)
    yield compiler
    compiler.close()


@pytest.fixture
def cache_compiler(smol):
    compiler = _compiler(smol, timeout_s=120.0, cache_bytes=3_000_000)  # about two 1.2 MB string grammars
    yield compiler
    compiler.close()


def _gone(pid: int, seconds: float = 30.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False


def test_a_compile_that_overruns_is_stopped(compiler):
    # a 1 µs wait reaches the compile threads (it builds the vocabulary and forks the processes first)
    with pytest.raises(GrammarTimeout):
        compiler.compile(schema({"type": "boolean"}), timeout_s=1e-6)
    compiler.compile(schema({"type": "boolean"}), timeout_s=120)
    processes = {process._process.pid for process in compiler._processes if process._process is not None}
    assert processes
    heavy = schema({"type": "string", "maxLength": 20_000})  # minutes of compile on this vocabulary
    with pytest.raises(GrammarTimeout) as stopped:
        compiler.compile(heavy, timeout_s=120)  # waits for the compiler's own 1 s limit
    assert "was stopped" in str(stopped.value)
    killed = [pid for pid in processes if _gone(pid, seconds=0.5)]
    assert len(killed) == 1  # the process that ran it, and only that one
    assert not compiler.cached(heavy)
    light = schema({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})
    assert compiler.compile(light, timeout_s=120).compiled.memory_size_bytes > 0  # served on a new process


def test_the_cache_is_bounded_in_bytes(cache_compiler):
    small = schema({"type": "array", "items": {"type": "integer"}})
    assert 0 < cache_compiler.compile(small, timeout_s=120).compiled.memory_size_bytes < 100_000
    again = cache_compiler.compile(small, timeout_s=120)
    assert cache_compiler.cached_bytes == again.compiled.memory_size_bytes  # measured
    strings = [schema({"type": "string", "maxLength": 20 + i}) for i in range(4)]  # ~1.2 MB each
    sizes = []
    for constraint in strings:
        sizes.append(cache_compiler.compile(constraint, timeout_s=120).compiled.memory_size_bytes)
        assert cache_compiler.cached_bytes <= cache_compiler.cache_bytes
    assert sum(sizes) > cache_compiler.cache_bytes  # so some had to go: the least recently used
    assert not cache_compiler.cached(small) and not cache_compiler.cached(strings[0])
    assert cache_compiler.cached(strings[-1])


def test_a_compile_child_whose_parent_vanishes_mid_conversation_returns_quietly():
    """The parent is killed with a reply unread (a worker stopped with -9): the child's next read fails with a
    connection reset, which ends its loop like a closed pipe, without a traceback on the worker's stderr."""
    info = xgrammar.TokenizerInfo(["a", "b", "</s>"], stop_token_ids=[2])
    ours, theirs = multiprocessing.Pipe()
    raised: list[BaseException] = []

    def serve() -> None:
        try:
            _serve(theirs, info.serialize_json())
        except BaseException as error:  # what would be the child's traceback
            raised.append(error)

    child = threading.Thread(target=serve)
    child.start()
    assert ours.recv() is True
    ours.send(("regex", "a+"))
    assert ours.poll(30)  # the reply waits unread
    ours.close()  # closing with unread data resets the connection
    child.join(30)
    assert not child.is_alive() and raised == []


def test_a_compile_process_closed_from_several_threads_at_once_closes_each_handle_once():
    """The compile thread closes its process when the child dies while the compiler's close() kills it: each
    pipe descriptor is closed once (a second close raised EBADF at teardown, or could close a reused number)."""
    from worker.decoding.grammar.compile_process import CompileProcess

    tokenizer_json = xgrammar.TokenizerInfo(["a", "b", "</s>"], stop_token_ids=[2]).serialize_json()
    raised: list[BaseException] = []
    for _ in range(12):
        process = CompileProcess(tokenizer_json)
        assert process.compile("regex", "a+", timeout_s=60.0)  # started and answering
        gate = threading.Barrier(8)

        def close(process: CompileProcess = process, gate: threading.Barrier = gate) -> None:
            gate.wait()
            try:
                process.close()
            except BaseException as error:
                raised.append(error)

        threads = [threading.Thread(target=close) for _ in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert raised == []
