"""Compile a `Constraint` into an xgrammar grammar, off the engine thread, cached by its hash.

xgrammar was chosen over llguidance by measurement on the SmolLM2 tokenizer (bench/grammar_engines.py):
much lower per-token mask cost, the dominant cost once a schema is cached.

Compiles run on a few daemon threads; the caller waits at most `timeout_s`. A compile that overruns
keeps going and lands in the cache, so a retry of the same schema is then free. The cache is an LRU
of futures keyed by sha256(kind, value), so concurrent requests for one schema share one compile.

xgrammar cannot stop a compile, so the threads are shared fairly among tenants (fair_queue.py): one
tenant runs at most all threads but one and keeps a few compiles waiting, beyond which it is told to
retry later; its heavy schemas then cost its own requests, not everyone's structured output. A
compile in a process of its own could be killed instead, but a compiled grammar crosses a process
boundary as xgrammar's JSON: 61 ms to serialize and 26 ms to load (2 MB) for a 230 ms compile of an
eight-field schema on the SmolLM2 tokenizer, a third more per cold compile, plus a resident process.
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import OrderedDict
from concurrent.futures import CancelledError, Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
from functools import partial

import xgrammar as xgr

from worker.decoding.grammar.fair_queue import FairQueue, TenantQueueFull
from worker.decoding.grammar.schema_check import SchemaError, parse_schema
from worker.threads import in_background
from common.protocol import Constraint

_OBJECT = '{"type": "object"}'


class GrammarError(ValueError):
    """The constraint cannot be compiled; the message names the problem."""


class GrammarTimeout(GrammarError):
    pass


class GrammarBusy(GrammarError):
    """The tenant already has as many compiles waiting as it may: retry later."""


@dataclass(frozen=True)
class Grammar:
    """A compiled constraint, shared by every row that uses the same one."""

    key: str
    kind: str
    compiled: xgr.CompiledGrammar
    stop_ids: tuple[int, ...]  # tokens that end the output once the grammar accepts


def _xgr_compiler(tokenizer, vocab_size: int, stop_ids: list[int]) -> xgr.GrammarCompiler:
    info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=vocab_size, stop_token_ids=stop_ids)
    return xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)


class GrammarCompiler:
    def __init__(self, tokenizer, vocab_size: int, stop_ids: list[int], *, timeout_s: float = 10.0,
                 cache_size: int = 256, threads: int = 2, waiting_per_tenant: int = 4, build_later: bool = False):
        """The tokenizer's vocabulary table takes ~0.35 s: it is built in a low-priority thread, now or,
        with `build_later`, when `build_in_background` is called (a worker does once it is warm)."""
        self.stop_ids = tuple(stop_ids)
        self.timeout_s, self.cache_size = timeout_s, cache_size
        self._vocabulary = partial(_xgr_compiler, tokenizer, vocab_size, stop_ids)
        self._xgr_ready: Future = Future()
        self._building = threading.Lock()
        self._cache: OrderedDict[str, Future] = OrderedDict()
        self._lock = threading.Lock()
        self._ready = threading.Condition(self._lock)
        self._jobs: FairQueue[tuple[str, Constraint, Future]] = FairQueue(max(1, threads - 1), waiting_per_tenant)
        self._closed = False
        for index in range(threads):  # daemons: a compile that never ends must not hold the process at exit
            threading.Thread(target=self._work, name=f"sluice-grammar-{index}", daemon=True).start()
        if not build_later:
            self.build_in_background()

    def build_in_background(self) -> None:
        in_background(self._build_vocabulary, "sluice-grammar-vocabulary")

    def _build_vocabulary(self) -> None:
        with self._building:  # a compile that comes first builds it, or waits for the thread doing so
            if self._xgr_ready.done():
                return
            try:
                self._xgr_ready.set_result(self._vocabulary())
            except Exception as exc:  # reported by the first compile
                self._xgr_ready.set_exception(exc)

    @property
    def _xgr(self) -> xgr.GrammarCompiler:
        self._build_vocabulary()
        try:
            return self._xgr_ready.result()
        except Exception as exc:  # not the constraint's fault: say what is
            raise GrammarError(f"structured output is unavailable for this model's tokenizer: {exc}") from None

    @staticmethod
    def key(constraint: Constraint) -> str:
        return hashlib.sha256(f"{constraint.kind}\0{constraint.value}".encode()).hexdigest()

    def compile(self, constraint: Constraint, timeout_s: float | None = None, tenant: str = "") -> Grammar:
        """The compiled grammar (from the cache when seen before); GrammarError names what is wrong.
        A new constraint is compiled in `tenant`'s turn (GrammarBusy when it has too many waiting)."""
        key = self.key(constraint)
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
                while len(self._cache) > self.cache_size:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        limit = self.timeout_s if timeout_s is None else timeout_s
        try:
            return future.result(timeout=limit)
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

    def cached(self, constraint: Constraint) -> bool:
        future = self._cache.get(self.key(constraint))
        return future is not None and future.done() and future.exception() is None

    def backlog(self, tenant: str) -> tuple[int, int]:
        """(running, waiting) compiles of this tenant."""
        with self._lock:
            return self._jobs.backlog(tenant)

    def _work(self) -> None:
        while True:
            with self._lock:
                while (taken := self._jobs.take()) is None:
                    if self._closed:
                        return
                    self._ready.wait()
            tenant, (key, constraint, future) = taken
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(self._compile(key, constraint))
                except Exception as exc:  # the waiters get it (GrammarError names a bad constraint)
                    future.set_exception(exc)
            with self._lock:
                self._jobs.done(tenant)
                self._ready.notify_all()  # the tenant may run another one now

    def _compile(self, key: str, constraint: Constraint) -> Grammar:
        try:
            compiled = self._build(constraint)
        except SchemaError as exc:
            raise GrammarError(str(exc)) from None
        except RuntimeError as exc:  # xgrammar reports parse errors as RuntimeError with a C++ prefix
            raise GrammarError(f"invalid {_NAMES[constraint.kind]}: {_clean(exc)}") from None
        return Grammar(key, constraint.kind, compiled, self.stop_ids)

    def _build(self, constraint: Constraint) -> xgr.CompiledGrammar:
        kind, value = constraint.kind, constraint.value
        if kind == "json_object":  # any JSON object, no whitespace runs the model could loop on
            return self._xgr.compile_json_schema(_OBJECT, any_whitespace=False, strict_mode=False)
        if kind == "json_schema":
            schema = parse_schema(value)
            text = json.dumps(schema)
            try:  # strict: unlisted properties/items are closed, which keeps outputs short
                return self._xgr.compile_json_schema(text, any_whitespace=False, strict_mode=True)
            except RuntimeError:  # some valid schemas contradict strict closing (e.g. minItems without items)
                return self._xgr.compile_json_schema(text, any_whitespace=False, strict_mode=False)
        if kind == "regex":
            if not value:
                raise GrammarError("the regex is empty")
            return self._xgr.compile_regex(value)
        if kind == "ebnf":
            if not value.strip():
                raise GrammarError("the EBNF grammar is empty")
            return self._xgr.compile_grammar(value)
        if kind == "structural_tag":  # built by the worker for tool calls (worker/tools/grammar.py)
            return self._xgr.compile_structural_tag(value)
        raise GrammarError(f"unknown constraint kind {kind!r}")

    def close(self) -> None:
        with self._lock:
            self._closed = True
            for _, _, future in self._jobs.clear():
                future.cancel()
            self._ready.notify_all()


_NAMES = {"json_schema": "JSON schema", "json_object": "JSON object grammar", "regex": "regex", "ebnf": "EBNF grammar",
          "structural_tag": "structural tag"}


def _clean(exc: Exception) -> str:
    """Drop xgrammar's '[time] /project/cpp/file.cc:N: ' prefix and 'Check failed' noise."""
    text = str(exc).strip()
    if ".cc:" in text:
        text = text.split(".cc:", 1)[1].split(":", 1)[-1].strip()
    return text.replace("Check failed: (error.empty()) is false: ", "")
