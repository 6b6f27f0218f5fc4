"""Compile a `Constraint` into an xgrammar grammar, off the engine thread, cached by its hash.

xgrammar was chosen over llguidance by measurement on the SmolLM2 tokenizer (bench/grammar_engines.py):
much lower per-token mask cost, the dominant cost once a schema is cached.

Compiles run on a few daemon threads, each handing its compiles to a child process of its own
(compile_process.py, niced below the worker), which gets at most `timeout_s` of wall-clock time and `cpu_s` of
CPU time (by default the same number) per compile; the caller waits at most `timeout_s`. A compile that the
caller gave up on keeps going and lands in the cache, so a retry of the same schema is then free, unless it
runs past its limits itself: then its process is killed and every waiter gets GrammarTimeout. The cache is an
LRU of futures keyed by sha256(tenant, kind, value), so one tenant's concurrent requests for one schema share
one compile,
and no tenant's answer time tells whether another tenant compiled a schema (a cached schema answers in
milliseconds, a new one in seconds): each team compiles its own. It is bounded by the bytes of the
compiled grammars (xgrammar's `memory_size_bytes`), since one large schema takes 100+ MB.

A caller that must not hold a thread while a compile waits or runs (the worker's HTTP side) asks with
`pending=True`: a grammar not ready yet raises GrammarPending with its future, to be awaited elsewhere, and
the caller asks again once it is done.

A request's limit counts from when it asked or from when the tokenizer's vocabulary table was ready, whichever
is later: the table is the worker's own start-up work (0.35 s on a quiet core, 6 s at load 9), not the cost of
anyone's constraint, so a fresh worker's first structured request does not time out on a trivial schema.
Waiting for the table is bounded apart (VOCABULARY_WAIT_S).

There is one compile thread (and process) for every two cores (at least one; `compile_threads`): compiles
together never take more than half the machine from the engine, however many tenants send schemas. The
threads are shared fairly among tenants (fair_queue.py): one tenant runs at most all threads but one (one when
there is one) and keeps a few compiles waiting, beyond which it is told to retry later; its heavy schemas then cost its
own requests (for at most `timeout_s` each), not everyone's structured output.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING

from common.protocol import Constraint
from worker.decoding.grammar.fair_queue import FairQueue, TenantQueueFull
from worker.decoding.grammar.schema_check import SchemaError, parse_schema
from worker.decoding.grammar.vocabulary import tokenizer_table
from worker.threads import in_background

# xgrammar (and compile_process.py, which imports it) are imported where used: a worker that serves no structured
# output never loads them (~21 MB)
if TYPE_CHECKING:
    import xgrammar as xgr

    from worker.decoding.grammar.compile_process import CompileOverran, CompileProcess

VOCABULARY_WAIT_S = 600.0  # building the tokenizer's table: seconds of a core; a bound against a build that hangs


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message names the problem."""


class GrammarTimeout(GrammarError):
    pass


class GrammarBusy(GrammarError):
    """The tenant already has as many compiles waiting as it may: retry later."""


class GrammarPending(Exception):
    """Asked with `pending=True`: the grammar is being compiled (or waits its turn). Not a GrammarError, so it
    leaves every caller that maps those to a client error."""

    def __init__(self, future: Future, limit_s: float):
        super().__init__("the grammar is being compiled")
        self.future, self.limit_s = future, limit_s


@dataclass(frozen=True)
class Grammar:
    """A compiled constraint, shared by every row that uses the same one."""

    key: str
    kind: str
    compiled: xgr.CompiledGrammar
    stop_ids: tuple[int, ...]  # tokens that end the output once the grammar accepts


def compile_threads() -> int:
    """Compiles that may run at once: one for every two cores this process may use, at least one."""
    return max(1, len(os.sched_getaffinity(0)) // 2)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], *, timeout_s: float = 10.0,
                 cpu_s: float | None = None, cache_bytes: int = 256 * 2**20, threads: int | None = None,
                 waiting_per_tenant: int = 4, build_later: bool = False):
        """The tokenizer's vocabulary table (~0.35 s) and the compile processes (their fork server imports
        xgrammar and torch: ~2.4 s of a core, ~500 MB) are made in a low-priority thread now or, with
        `build_later`, by the first compile (a worker's engine: its first structured request, whose limit
        counts from when they are ready), so a worker that serves no structured output pays neither."""
        self.stop_ids = tuple(stop_ids)
        self.timeout_s, self.cache_bytes = timeout_s, cache_bytes
        self.cpu_s = timeout_s if cpu_s is None else cpu_s
        self._vocabulary = partial(tokenizer_table, tokenizer, vocab_size, stop_ids)
        self._xgr_ready: Future = Future()
        self._ready_at = 0.0  # time.monotonic() when the vocabulary table was built; 0 until then
        self._building = threading.Lock()
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._sizes: dict[str, int] = {}  # bytes of each compiled grammar in the cache
        self.cached_bytes = 0
        threads = compile_threads() if threads is None else threads
        self._processes: list[CompileProcess] = []  # every one started, for close()
        self._idle: list[CompileProcess] = []  # started and not yet taken by a thread
        self._threads = threads
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: FairQueue[tuple[str, Constraint, Future]] = FairQueue(max(1, threads - 1), waiting_per_tenant)
        self._closed = False
        for index in range(threads):  # daemons: a compile that never ends must not hold the process at exit
            threading.Thread(target=self._work, name=f"sluice-grammar-{index}", daemon=True).start()
        if not build_later:
            self.build_in_background()

    def build_in_background(self) -> None:
        from worker.decoding.grammar.compile_process import start_server

        start_server()  # here, in the caller's thread, not in the background one (compile_process.py)
        in_background(self._build_vocabulary, "sluice-grammar-vocabulary")

    def _build_vocabulary(self) -> None:
        from worker.decoding.grammar.compile_process import CompileProcess

        with self._building:  # a compile that comes first builds it, or waits for the thread doing so
            if self._xgr_ready.done():
                return
            try:
                vocabulary = self._vocabulary()
            except Exception as exc:  # reported by the first compile
                self._xgr_ready.set_exception(exc)
                return
            with self._lock:  # one compile process per thread, forked now rather than by the first compile
                if not self._closed:
                    self._idle.extend(CompileProcess(vocabulary[1], self.cpu_s).start() for _ in range(self._threads))
                    self._processes.extend(self._idle)
            self._ready_at = time.monotonic()
            self._xgr_ready.set_result(vocabulary)  # after the processes: whoever sees it ready sees them

    @property
    def _tokenizer(self) -> tuple[xgr.TokenizerInfo, bytes]:
        self._build_vocabulary()
        try:
            return self._xgr_ready.result()
        except Exception as exc:  # not the constraint's fault: say what is
            raise GrammarError(f"structured output is unavailable for this model's tokenizer: {exc}") from None

    @staticmethod
    def key(constraint: Constraint, tenant: str = "") -> str:
        return hashlib.sha256(f"{tenant}\0{constraint.kind}\0{constraint.value}".encode()).hexdigest()

    def compile(self, constraint: Constraint, timeout_s: float | None = None, tenant: str = "", *,
                pending: bool = False, waited_s: float = 0.0) -> Grammar:
        """The compiled grammar (from `tenant`'s cache when it compiled it before); GrammarError names what is
        wrong. A new constraint is compiled in `tenant`'s turn (GrammarBusy when it has too many waiting).
        `pending`: GrammarPending rather than a wait when it is not ready; `waited_s`: seconds of the limit
        spent waiting for it elsewhere."""
        asked = time.monotonic() - waited_s
        key = self.key(constraint, tenant)
        with self._lock:
            future = self._cache.get(key)
            if future is None:
                future = Future()
                try:
                    self._jobs.put(tenant, (key, constraint, future))
                except TenantQueueFull as exc:
                    raise GrammarBusy(f"{exc}; retry when they are done") from None
                self._ready.notify()
                self._cache[key] = future
            else:
                self._cache.move_to_end(key)
        limit = self.timeout_s if timeout_s is None else timeout_s
        if pending and not future.done():
            raise GrammarPending(future, limit if self._xgr_ready.done() else VOCABULARY_WAIT_S + limit)
        try:
            began = max(asked, self._vocabulary_ready_at(future))
            return future.result(timeout=max(0.0, limit - (time.monotonic() - began)))
        except FutureTimeout:
            raise GrammarTimeout(f"compiling the {constraint.kind} constraint took longer than {limit:g} s; "
                                 "simplify it or retry later") from None
        except CancelledError:
            raise GrammarError("the worker is shutting down") from None
        except GrammarError:
            with self._lock:  # do not keep failures: the cache is for grammars
                if self._cache.get(key) is future:
                    del self._cache[key]
            raise

    def _vocabulary_ready_at(self, compiled: Future) -> float:
        """When the vocabulary table was ready (waiting for it, or for `compiled` to end first); 0 while it is not
        built (a failed build: `compiled` reports it). GrammarTimeout past VOCABULARY_WAIT_S."""
        wait_for([self._xgr_ready, compiled], timeout=VOCABULARY_WAIT_S, return_when="FIRST_COMPLETED")
        if not self._xgr_ready.done() and not compiled.done():
            raise GrammarTimeout("structured output is not ready on this worker yet; retry later")
        return self._ready_at

    def _keep(self, key: str, future: Future, size: int) -> None:
        """Count a finished grammar's bytes; evict the least recently used ones while over `cache_bytes`."""
        if self._cache.get(key) is not future:
            return  # not cached (a failure, or closed)
        self._sizes[key] = size
        self.cached_bytes += size
        for old in [k for k in self._cache if k in self._sizes]:  # least recently used first; running ones stay
            if self.cached_bytes <= self.cache_bytes:
                break
            del self._cache[old]
            self.cached_bytes -= self._sizes.pop(old)

    def cached(self, constraint: Constraint, tenant: str = "") -> bool:
        future = self._cache.get(self.key(constraint, tenant))
        return future is not None and future.done() and future.exception() is None

    def backlog(self, tenant: str) -> tuple[int, int]:
        """(running, waiting) compiles of this tenant."""
        with self._lock:
            return self._jobs.backlog(tenant)

    def _work(self) -> None:
        process: CompileProcess | None = None  # this thread's own, taken by its first compile
        while True:
            with self._lock:
                while (taken := self._jobs.take()) is None:
                    if self._closed:
                        return
                    self._ready.wait()
            tenant, (key, constraint, future) = taken
            if future.set_running_or_notify_cancel():
                try:
                    if process is None:
                        process = self._new_process()
                    grammar = self._compile(process, key, constraint)
                except Exception as exc:  # the waiters get it (GrammarError names a bad constraint)
                    future.set_exception(exc)
                else:
                    with self._lock:  # counted (and older ones evicted) before any waiter sees it
                        self._keep(key, future, grammar.compiled.memory_size_bytes)
                    future.set_result(grammar)
            with self._lock:
                self._jobs.done(tenant)
                self._ready.notify_all()  # the tenant may run another one now

    def _new_process(self) -> CompileProcess:
        from worker.decoding.grammar.compile_process import CompileProcess

        table = self._tokenizer[1]  # builds the vocabulary (and the processes) if nothing did yet
        with self._lock:
            if self._idle:
                return self._idle.pop()
            process = CompileProcess(table, self.cpu_s)
            self._processes.append(process)
        return process

    def _compile(self, process: CompileProcess, key: str, constraint: Constraint) -> Grammar:
        import xgrammar as xgr

        from worker.decoding.grammar.compile_process import CompileFailed, CompileOverran

        kind, value = constraint.kind, constraint.value
        if kind not in _NAMES:
            raise GrammarError(f"unknown constraint kind {kind!r}")
        if kind == "json_schema":
            try:
                value = json.dumps(parse_schema(value))
            except SchemaError as exc:
                raise GrammarError(str(exc)) from None
        elif (kind == "regex" and not value) or (kind == "ebnf" and not value.strip()):
            raise GrammarError(f"the {_NAMES[kind]} is empty")
        try:
            text = process.compile(kind, value, self.timeout_s)
        except CompileOverran as exc:
            raise GrammarTimeout(f"compiling the {kind} constraint {_overran(exc)}; simplify it") from None
        except CompileFailed as exc:
            raise GrammarError(f"invalid {_NAMES[kind]}: {_clean(exc)}") from None
        return Grammar(key, kind, xgr.CompiledGrammar.deserialize_json(text, self._tokenizer[0]), self.stop_ids)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, _, future in self._jobs.clear():
                future.cancel()
            self._ready.notify_all()
            processes = list(self._processes)
        for process in processes:  # a compile running in one ends with it: its waiters get an error
            process.close()


_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object grammar", "regex": "regex", "ebnf": "EBNF grammar",
          "structural_tag": "structural tag"}


def _overran(exc: CompileOverran) -> str:
    """'took longer than 10 s and was stopped' / 'used more than 10 s of CPU and was stopped'."""
    return str(exc).removeprefix("the compile ").strip()


def _clean(exc: Exception) -> str:
    """Drop xgrammar's '[time] /project/cpp/file.cc:N: ' prefix and 'Check failed' noise."""
    text = str(exc).strip()
    if ".cc:" in text:
        text = text.split(".cc:", 1)[1].split(":", 1)[-1].strip()
    return text.replace("Check failed: (error.empty()) is false: ", "")
