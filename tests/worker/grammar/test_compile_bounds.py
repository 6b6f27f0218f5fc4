"""What one tenant's grammar may cost the worker: a compile that overruns `timeout_s` is stopped (its process
killed, so no core goes on burning for it), so is one that uses more than its CPU time, the compile processes
run below the worker's priority, and the compiled-grammar cache is bounded in bytes, by xgrammar's
own measure of each grammar."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import psutil
import pytest
import xgrammar

from common.protocol import Constraint
from tests.worker.grammar.helpers import HANG_GUARD_S, compiles_held
from worker.decoding.grammar import GrammarCompiler, GrammarPending, GrammarTimeout
from worker.decoding.grammar.compile_process import _serve
from worker.decoding.grammar.compiler import VOCABULARY_WAIT_S
from worker.decoding.grammar.vocabulary import serialized_table


def schema(value: dict) -> Constraint:
    return Constraint("json_schema", json.dumps(value))


def _compiler(smol, **settings) -> GrammarCompiler:
    from worker.engine.engine import _model_eos_ids

    return GrammarCompiler(smol.tokenizer, smol.model.config.vocab_size, _model_eos_ids(smol), threads=2, **settings)


@pytest.fixture
def cache_compiler(smol):
    compiler = _compiler(smol, timeout_s=HANG_GUARD_S, cache_bytes=3_000_000)  # about two 1.2 MB string grammars
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


LIGHT = schema({"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]})


def test_a_compile_that_overruns_is_stopped(smol):
    """The compile cannot finish (its process is held stopped), so it always meets the compiler's own 1 s limit,
    however loaded the machine: that process is killed, the other one left alone, the next compile served."""
    compiler = _compiler(smol, timeout_s=1.0)
    try:
        with compiles_held(compiler) as held:
            with pytest.raises(GrammarTimeout) as stopped:
                compiler.compile(schema({"type": "boolean"}), timeout_s=HANG_GUARD_S)  # waits for the compiler's limit
        assert "took longer than 1 s and was stopped" in str(stopped.value)
        killed = [pid for pid in held if _gone(pid, seconds=0.5)]
        assert len(killed) == 1  # the process that ran it, and only that one
        assert not compiler.cached(schema({"type": "boolean"}))
        compiler.timeout_s = HANG_GUARD_S  # the next compile is not about the limit: none that can trip
        assert compiler.compile(LIGHT, timeout_s=HANG_GUARD_S).compiled.memory_size_bytes > 0  # served on a new process
    finally:
        compiler.close()


def test_the_limit_counts_from_when_the_vocabulary_table_is_ready(smol):
    """Building the tokenizer's table is the worker's start-up, not the constraint's cost: a request that waited
    past its whole limit for the table (held here: its lock taken) still gets its full limit for the compile."""
    limit = 5.0
    compiler = _compiler(smol, timeout_s=HANG_GUARD_S, build_later=True)
    try:
        with ThreadPoolExecutor(1) as pool:
            with compiler._building:  # the table is "being built" until the lock is let go
                with pytest.raises(GrammarPending) as pending:
                    compiler.compile(LIGHT, timeout_s=limit, pending=True)
                assert pending.value.limit_s == VOCABULARY_WAIT_S + limit  # a waiter elsewhere waits for it too
                asking = pool.submit(compiler.compile, LIGHT, timeout_s=limit)
                time.sleep(limit + 1)  # the request's own clock is past its limit before the table is built
            assert asking.result(HANG_GUARD_S).compiled.memory_size_bytes > 0  # GrammarTimeout before
    finally:
        compiler.close()


def test_a_compile_is_stopped_by_its_cpu_limit_whatever_the_wall_clock(smol):
    """RLIMIT_CPU counts the work done, not the time waited: with an hour of wall clock and 1 s of CPU, a compile
    that needs minutes of CPU is stopped (a busy machine only makes it take longer to get there)."""
    compiler = _compiler(smol, timeout_s=HANG_GUARD_S, cpu_s=1.0)
    try:
        # ~9 s of CPU on a fast AVX-512 host, more elsewhere; the limit grants at most 2 (whole seconds, rounded
        # up). A long string was the heavy case once, and compiles in 1.5 s there: not stopped, the test failed.
        heavy = schema({"enum": [f"sentence {i} of the enum, with words {i * 7} and {i * 13}" for i in range(16_000)]})
        with pytest.raises(GrammarTimeout) as stopped:
            compiler.compile(heavy, timeout_s=HANG_GUARD_S)
        assert "used more than 1 s of CPU and was stopped" in str(stopped.value)
        assert not compiler.cached(heavy)
        assert compiler.compile(LIGHT, timeout_s=HANG_GUARD_S).compiled.memory_size_bytes > 0  # a new process serves on
    finally:
        compiler.close()


def test_compile_processes_run_below_the_workers_priority(cache_compiler):
    """A tenant's compiles get a core only when serving leaves one idle: each process is niced 10 steps below the
    fork server it came from (which has the worker's priority)."""
    cache_compiler.compile(LIGHT, timeout_s=HANG_GUARD_S)
    pids = [process.pid for process in cache_compiler._processes if process.pid is not None]
    assert pids
    for pid in pids:
        child = psutil.Process(pid)
        assert child.nice() == min(19, child.parent().nice() + 10), (child.nice(), child.parent().nice())


def test_the_cache_is_bounded_in_bytes(cache_compiler):
    small = schema({"type": "array", "items": {"type": "integer"}})
    assert 0 < cache_compiler.compile(small, timeout_s=HANG_GUARD_S).compiled.memory_size_bytes < 100_000
    again = cache_compiler.compile(small, timeout_s=HANG_GUARD_S)
    assert cache_compiler.cached_bytes == again.compiled.memory_size_bytes  # measured
    strings = [schema({"type": "string", "maxLength": 20 + i}) for i in range(4)]  # ~1.2 MB each
    sizes = []
    for constraint in strings:
        sizes.append(cache_compiler.compile(constraint, timeout_s=HANG_GUARD_S).compiled.memory_size_bytes)
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
            _serve(theirs, serialized_table(info), limit_cpu=lambda cpu_s: None)  # not this test process's CPU
        except BaseException as error:  # what would be the child's traceback
            raised.append(error)

    child = threading.Thread(target=serve)
    child.start()
    assert ours.recv() is True
    ours.send(("regex", "a+", 60.0))
    assert ours.poll(30)  # the reply waits unread
    ours.close()  # closing with unread data resets the connection
    child.join(30)
    assert not child.is_alive() and raised == []


def test_a_compile_process_closed_from_several_threads_at_once_closes_each_handle_once():
    """The compile thread closes its process when the child dies while the compiler's close() kills it: each
    pipe descriptor is closed once (a second close raised EBADF at teardown, or could close a reused number)."""
    from worker.decoding.grammar.compile_process import CompileProcess

    table = serialized_table(xgrammar.TokenizerInfo(["a", "b", "</s>"], stop_token_ids=[2]))
    raised: list[BaseException] = []
    for _ in range(12):
        process = CompileProcess(table)
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
