"""xgrammar compiles in a child process, so that one that overruns its time is killed instead of burning a core.

xgrammar cannot stop a compile it started, and a thread cannot be killed: a constraint that takes minutes
(a 40,000-value enum of sentences: 50 s, 366 MB) would hold a core and its memory to the end. Each compile
thread of the worker owns one child; the child compiles one constraint after another and sends each back as
xgrammar's JSON. A compile that overruns is stopped by killing the child; the next compile forks a new one.

Measured on the SmolLM2 tokenizer (2 cores): a `maxLength: 2500` string schema compiles in 1.95 s, its JSON
(12.6 MB) takes 0.49 s to write and 0.17 s to read back, a third more per cold compile (cached compiles pay
nothing); small schemas compile in about 1 ms either way. Children fork from multiprocessing's fork server,
which imports xgrammar (with torch: 2.4 s, 260 MB) once, before any thread runs in it: a new child shares those
pages and starts by reading the tokenizer's table (vocabulary.py), not by importing again. A worker starts the
server beside its own imports (worker/__main__.py; a standby spare before it is assigned), so that import does not
compete with its first requests.

A tenant's compiles must not take the CPU that serves every tenant: each child runs `_NICENESS` steps below the
worker (the engine's step and the HTTP threads win every contest for a core), and each compile gets a CPU-time
limit (RLIMIT_CPU, set afresh before each one) beside the caller's wall-clock limit. The wall clock stops a
compile the worker is waiting for; the CPU limit also stops one nobody waits for any more (an orphan whose worker
was killed), and does so by the work done, whatever the load.
"""

from __future__ import annotations

import math
import multiprocessing
import multiprocessing.forkserver
import os
import resource
import signal
import threading
from collections.abc import Callable
from multiprocessing.connection import Connection

import xgrammar as xgr

from worker.allocator import return_large_blocks, trim_now
from worker.decoding.grammar.vocabulary import from_table

_OBJECT = '{"type": "object"}'
_context = multiprocessing.get_context("forkserver")
_context.set_forkserver_preload([__name__])  # the children start with xgrammar already imported
_START_S = 120.0  # a child that has not read the tokenizer's table by then is broken
_starting = threading.Lock()  # the fork server is started once, by the first compile thread that needs it
_NICENESS = 10  # below the worker's threads: a compile gets a core only when serving leaves one idle


def start_server() -> None:
    """Start the fork server now (it imports xgrammar on its own: this returns at once). Call it from a thread
    of normal priority: the server, and so every compile process, keeps the niceness of the thread that
    started it (a background thread's would starve compiles under load)."""
    with _starting:
        multiprocessing.forkserver.ensure_running()


class CompileFailed(RuntimeError):
    """xgrammar refused the constraint; the message is its own (cleaned up by the caller)."""


class CompileOverran(RuntimeError):
    """The compile ran past its time and its process was killed."""


class CompileProcess:
    """One child process that compiles constraints, one at a time, for one compile thread."""

    def __init__(self, table: bytes, cpu_s: float = 3600.0):
        self._table = table  # the vocabulary's table (vocabulary.py tokenizer_table)
        self.cpu_s = cpu_s  # CPU seconds one compile may use (whole seconds, rounded up: RLIMIT_CPU's unit)
        self._process = None
        self._conn: Connection | None = None
        self._started = False
        self.compiling = False  # a constraint is in the child now
        # close() runs on the compile thread (an overrun, a dead child) and on the compiler's close() at once:
        # the handles are taken under this lock so that each is closed once (a second close of a pipe's fd
        # fails with EBADF, or closes whatever file reused its number)
        self._closing = threading.Lock()

    def compile(self, kind: str, value: str, timeout_s: float) -> str:
        """The compiled grammar as xgrammar's JSON. CompileFailed: xgrammar refused it; CompileOverran: it took
        longer than `timeout_s` (counted from when the child had it, not from its start-up) or used more than
        `cpu_s` of CPU."""
        conn = self._ready(timeout_s)
        process = self._process
        try:
            self.compiling = True
            conn.send((kind, value, self.cpu_s))
            answered = conn.poll(timeout_s)
            ok, text = conn.recv() if answered else (False, "")
        except (EOFError, OSError):  # the child died (its CPU limit, out of memory, a crash in xgrammar), or close()
            if process is not None:
                process.join(timeout=10)
            self.close()
            if process is not None and process.exitcode == -signal.SIGXCPU:
                raise CompileOverran(f"the compile used more than {self.cpu_s:g} s of CPU and was stopped") from None
            raise CompileFailed("the compile process ended without an answer") from None
        finally:
            self.compiling = False
        if not answered:
            self.close()
            raise CompileOverran(f"the compile took longer than {timeout_s:g} s and was stopped")
        if not ok:
            raise CompileFailed(text)
        return text

    @property
    def pid(self) -> int | None:
        process = self._process
        return None if process is None else process.pid

    def start(self) -> CompileProcess:
        """Fork the child now (it reads the tokenizer's table on its own); `compile` waits until it has."""
        if self._process is None or not self._process.is_alive():
            self.close()
            ours, theirs = _context.Pipe()
            with _starting:
                self._process = _context.Process(target=_child, args=(theirs, self._table),
                                                 name="sluice-grammar-compile", daemon=True)
                self._process.start()
            theirs.close()
            self._conn, self._started = ours, False
        return self

    def _ready(self, timeout_s: float = 0.0) -> Connection:
        conn = self.start()._conn
        if not self._started:  # its first message says it has the table
            start_s = max(_START_S, timeout_s)  # niced, on a busy machine, it starts as slowly as it compiles
            if not conn.poll(start_s):
                self.close()
                raise CompileFailed(f"the compile process did not start within {start_s:g} s")
            try:
                conn.recv()
            except EOFError:
                self.close()
                raise CompileFailed("the compile process ended as it started") from None
            self._started = True
        return conn

    def close(self) -> None:
        with self._closing:
            process, self._process = self._process, None
            conn, self._conn = self._conn, None
        if process is not None:
            process.kill()
            process.join(timeout=10)
        if conn is not None:
            conn.close()


def _child(conn: Connection, table: bytes) -> None:
    """The child process: below the worker's priority, no core files (SIGXCPU's default action dumps one), the
    worker's allocator setting (worker/allocator.py: what a large compile frees leaves the process)."""
    os.nice(_NICENESS)
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return_large_blocks()
    _serve(conn, table, _limit_cpu)


def _serve(conn: Connection, table: bytes, limit_cpu: Callable[[float], None]) -> None:
    """Compile each (kind, value, cpu_s) received until the pipe closes, under `limit_cpu(cpu_s)` each."""
    compiler = xgr.GrammarCompiler(from_table(table), max_threads=1,
                                   cache_enabled=False)
    trim_now()  # building the table frees as much again as it keeps (Gemma 3's 262k tokens: ~23 MB)
    conn.send(True)
    while True:
        try:
            kind, value, cpu_s = conn.recv()
        except (EOFError, ConnectionResetError):  # the pipe closed, or its parent was killed: nothing to serve
            return
        limit_cpu(cpu_s)
        try:
            conn.send((True, build(compiler, kind, value).serialize_json()))
        except RuntimeError as exc:  # xgrammar reports a bad constraint as a RuntimeError with a C++ prefix
            conn.send((False, str(exc)))
        trim_now()  # what the compile freed (a large schema's: 100+ MB) leaves the process while it waits


def _limit_cpu(cpu_s: float) -> None:
    """SIGXCPU (which ends this process) once this compile has used `cpu_s` more CPU seconds than all before it.
    Only the soft limit moves: an unprivileged process cannot raise a hard limit it lowered."""
    used = resource.getrusage(resource.RUSAGE_SELF)
    hard = resource.getrlimit(resource.RLIMIT_CPU)[1]
    soft = math.ceil(used.ru_utime + used.ru_stime + cpu_s)
    resource.setrlimit(resource.RLIMIT_CPU, (soft if hard == resource.RLIM_INFINITY else min(soft, hard), hard))


def build(compiler: xgr.GrammarCompiler, kind: str, value: str) -> xgr.CompiledGrammar:
    """xgrammar's compile of one constraint (its value checked by the caller)."""
    if kind == "json_object":  # any JSON object, no whitespace runs the model could loop on
        return compiler.compile_json_schema(_OBJECT, any_whitespace=False, strict_mode=False)
    if kind == "json_schema":
        try:  # strict: unlisted properties/items are closed, which keeps outputs short
            return compiler.compile_json_schema(value, any_whitespace=False, strict_mode=True)
        except RuntimeError:  # some valid schemas contradict strict closing (e.g. minItems without items)
            return compiler.compile_json_schema(value, any_whitespace=False, strict_mode=False)
    if kind == "regex":
        return compiler.compile_regex(value)
    if kind == "ebnf":
        return compiler.compile_grammar(value)
    if kind == "structural_tag":  # built by the worker for tool calls (worker/tools/grammar.py)
        return compiler.compile_structural_tag(value)
    raise RuntimeError(f"unknown constraint kind {kind!r}")
