"""The continuous-batching engine: one thread owns the model, the KV cache and the decoding batch.

HTTP handlers `prepare` a request (tokenize, validate) and `submit` or `cancel` it through a queue; the
engine thread takes what arrived, then runs a step: the scheduler plans it (scheduler.py: who joins the
batch, which prompt chunks to prefill, which rows decode), the executor runs the plan (executor.py: the
forwards, the logits pipeline, the token choice, the events), the step's events go out to each request's
sink, and the rows that finished leave the batch. Between a step's prefill forwards the engine takes new
submissions too (cancellations wait for the step's end), so a tenant running nothing that arrives mid-step
has its prompt next (scheduler.py `yield_to_newcomer`).
"""

from __future__ import annotations

import dataclasses
import functools
import queue
import threading
import time
from pathlib import Path

import structlog
import torch

from common.protocol import Done, EngineStats, Error, GenerateRequest, ModelConfig, SamplingParams, WorkerLoad
from worker.decoding.bad_words import tokenize_bad_words
from worker.decoding.grammar import GrammarCompiler
from worker.engine.executor import Executor
from worker.engine.native.install import install_native
from worker.engine.native.model import KV_DTYPE
from worker.engine.outputs import StepEvents
from worker.engine.prefix_cache import PrefixCache
from worker.engine.prepare import PreparedRequest, prepare
from worker.engine.prepare_errors import RequestRejected
from worker.engine.quiet_work import QuietWork
from worker.engine.runner import ModelRunner
from worker.engine.runner_choice import build_runner
from worker.engine.scheduler import Scheduler
from worker.engine.sequence import RequestState, Sequence
from worker.engine.slots import Slots
from worker.engine.w8a8 import quantize_runner
from worker.loading import LoadedModel, model_cache_dir, read_unread_weights
from worker.lora.store import AdapterStore
from worker.threads import decode_threads
from worker.token_bytes import max_token_bytes

log = structlog.get_logger(__name__)
WARM_UP_PROMPTS = ("Hello, how are you today?", "The capital of France is")  # a few tokens each: prefill forwards


class Engine:
    def __init__(self, loaded: LoadedModel, config: ModelConfig, worker_id: str = "", data_dir: Path = Path(".data"),
                 *, compile_later: bool = False, owns_model: bool = False):
        """`compile_later`: leave the scripted decode layers to `finish_start`, once the worker is warm:
        until then decode steps take the Python path (same logits, one row group). The grammar vocabulary
        is built by the first constrained request in any case. `owns_model`: nothing else
        uses `loaded.model` (a worker), so w8a8 and q4 may free the float32 weights they replace."""
        self.loaded, self.config, self.worker_id = loaded, config, worker_id
        self.tokenizer = loaded.tokenizer
        self.runner, loaded = build_runner(loaded, config, decode_threads(config),
                                           KV_DTYPE if loaded.quantization == "q4" else None)
        self.loaded = loaded
        if loaded.quantization == "q4":  # decode and prefill of rows without an adapter run natively
            loaded = self.loaded = self._start_native(loaded, owns_model, data_dir)
        if loaded.quantization == "w8a8":
            quantize_runner(self.runner, loaded.tokenizer, release=owns_model,
                            cache=model_cache_dir(data_dir), weights_id=loaded.weights_id)
        if compile_later:
            self.runner.defer_scripting()
        else:
            self.runner.scripted_layers()  # compiled now rather than on the first request
        self.max_rows = config.max_batch_size
        self.vocab_size = self.runner.vocab_size
        self.model_eos = _model_eos_ids(loaded)
        self.max_token_bytes = max_token_bytes(self.tokenizer)  # how much text a prompt may be (prompt_tokens.py)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.model_eos,
                                        timeout_s=config.grammar_compile_timeout_s,
                                        cache_bytes=config.grammar_cache_bytes, build_later=True)
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._later: list[tuple[str, object]] = []  # messages that arrived mid-step, for its end
        self.adapters = AdapterStore(self.runner.layers, self.runner.dtype, self.runner.device,
                                     capacity=config.max_loaded_adapters, max_rank=config.max_adapter_rank,
                                     data_dir=data_dir, retry_s=config.adapter_retry_s,
                                     wake=lambda: self.inbox.put(("wake", None)))
        self.slots = Slots(self.runner.cache, self.vocab_size)
        self.prefixes = PrefixCache(self.runner.cache, config.prefix_cache_bytes)
        self.scheduler = Scheduler(config, self.slots, self.adapters, self.prefixes)
        self.executor = Executor(self.runner, self.slots, self.prefixes, self.tokenizer, worker_id,
                                 prompt_lookup=config.prompt_lookup)
        self.quiet_work = QuietWork()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-engine", daemon=True)

    def _start_native(self, loaded: LoadedModel, owns_model: bool, data_dir: Path) -> LoadedModel:
        """The native forward on the runner, or, where `auto` picked q4 and it cannot start (the library
        does not build or load, the model has a part forward.c does not run), the fallback's model on a new
        runner, the weights q4 left unread read now: one line logged instead of a failed start. A configured
        q4 fails the start with its error."""
        try:
            install_native(self.runner, decode_threads(self.config) * torch.get_num_threads(), release=owns_model,
                           cache=model_cache_dir(data_dir), weights_id=loaded.weights_id, read=loaded.read_weight)
        except Exception as error:
            if loaded.fallback is None:
                raise
            reason = " ".join(str(error).split()) or type(error).__name__
            log.warning("native_forward_unavailable", fallback=loaded.fallback, reason=reason)
            loaded = dataclasses.replace(read_unread_weights(loaded), quantization=loaded.fallback, fallback=None)
            self.runner = ModelRunner(loaded.model, self.config.max_batch_size, self.config.max_context,
                                      decode_threads(self.config))
        return loaded

    @property
    def rows(self) -> list[Sequence]:
        return self.slots.rows

    @property
    def by_id(self) -> dict[str, RequestState]:
        return self.scheduler.requests

    @property
    def beam_budget(self):
        return self.scheduler.beam_budget

    @property
    def steps(self) -> int:
        return self.executor.steps

    # ---- called from the HTTP side (any thread) ----

    def prepare(self, request: GenerateRequest, *, pending: bool = False, waited_s: float = 0.0) -> PreparedRequest:
        """The request made ready to submit; it waits for its grammar's compile, or with `pending` raises
        GrammarPending for the caller to wait elsewhere and ask again (`waited_s` then says how long it waited)."""
        if request.adapter is not None and not self.runner.layers:
            raise RequestRejected(f"model {self.config.name} runs on transformers' forward, which serves no LoRA "
                                  "adapters", field="adapter")
        started = time.perf_counter()
        compile_grammar = functools.partial(self.grammars.compile, pending=pending, waited_s=waited_s)
        prepared = prepare(request, self.tokenizer, vocab_size=self.vocab_size, hidden_size=self.runner.hidden_size,
                           max_context=self.runner.max_context, max_rows=self.max_rows, model_eos=self.model_eos,
                           embed=self.runner.embed, tokenize_bad_words=tokenize_bad_words,
                           compile_grammar=compile_grammar, max_token_bytes=self.max_token_bytes)
        prepared.validation_s = time.perf_counter() - started
        return prepared

    def submit(self, prepared: PreparedRequest, sink, bounded: bool = True) -> None:
        self.scheduler.reserve_place(bounded)
        self.inbox.put(("submit", RequestState(prepared, sink)))

    def cancel(self, request_id: str) -> None:
        self.inbox.put(("cancel", request_id))

    def load(self) -> WorkerLoad:
        rows = len(self.slots.rows)
        return WorkerLoad(ready=self._thread.is_alive(), model=self.config.name, queued=self.scheduler.queued,
                          running_rows=rows, max_rows=self.max_rows,
                          free_cache_tokens=(self.max_rows - rows) * self.runner.max_context,
                          worker_id=self.worker_id, adapters=list(self.adapters.loaded_names),
                          prefix_cache=self.prefixes.stats(), engine=self._stats())

    def _stats(self) -> EngineStats:
        executor = self.executor
        held = sum(row.length for row in list(self.slots.rows))  # a copy: the engine thread changes the list
        return EngineStats(steps=executor.steps, step_seconds=executor.step_seconds,
                           prompt_tokens=executor.prompt_tokens, generated_tokens=executor.generated_tokens,
                           kv_cache_use=min(1.0, held / (self.max_rows * self.runner.max_context)))

    def start(self) -> None:
        self._thread.start()

    def finish_start(self) -> None:
        """What `compile_later` left, once the engine is warm: the scripted decode layers now, before the
        worker takes traffic (full speed from its first step: runner.script_now says why not beside it).
        Under the native forward (q4) the scripted layers decode only rows with an adapter: they wait for the
        engine's first quiet moment (quiet_work.py; in the engine thread, between steps), so the wake does not
        pay their compile. The grammar machinery waits for the first structured request (compiler.py)."""
        if self.runner.native is None:
            self.runner.script_now()
        else:
            self.quiet_work.add(self.runner.script_now, time.monotonic())

    def warm_up(self, timeout_s: float = 60.0) -> None:
        """Two tiny greedy requests through the whole path (tokenizer, a prefill forward each, decode steps
        of two rows, detokenizer) after `start` and before the worker takes traffic: the first real requests
        then pay no first-call costs, and the prefill pace (prefill_pace.py) has measured a prompt's forward
        and a decode step, so a burst that wakes the worker is admitted as a warm worker's would be."""
        finished = threading.Event()
        left = [len(WARM_UP_PROMPTS)]

        def sink(batch: list) -> None:  # the engine thread's
            if any(isinstance(event, (Done, Error)) for event in batch):
                left[0] -= 1
                if not left[0]:
                    finished.set()

        for index, prompt in enumerate(WARM_UP_PROMPTS):
            # the prompt's last tokens only, so that the smallest max_context allowed (2, spec.py) still holds it
            new = min(2, self.runner.max_context - 1)
            request = GenerateRequest(request_id=f"warm-up-{index}", model=self.config.name, prompt=prompt,
                                      params=SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True,
                                                            truncate=self.runner.max_context - new))
            self.submit(self.prepare(request), sink, bounded=False)  # the worker's own: never "queue full"
        finished.wait(timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        self._thread.join(timeout=10)

    # ---- engine thread ----

    def step(self) -> None:
        """Plan, execute, emit: then the rows that finished leave the batch."""
        plan = self.scheduler.schedule()
        events = StepEvents()

        def between(ran: int) -> None:  # a tenant running nothing that arrives mid-step goes next
            if self._take_arrivals():
                self.scheduler.yield_to_newcomer(plan, ran)

        report = self.executor.run(plan, events, between)
        events.deliver()
        self.scheduler.finish(plan, report)

    def _run(self) -> None:
        # Every tensor the engine touches (cache growth, row moves, processors) lives in inference
        # mode: mixing inference tensors with in-place updates outside it is an error.
        with torch.inference_mode():
            while not self._stop.is_set():
                took = self._take_inbox(block=self.scheduler.idle)
                if took or not self.scheduler.idle:
                    self.quiet_work.busy(time.monotonic())
                else:
                    self.quiet_work.run_if_quiet(time.monotonic())
                try:
                    self.step()
                except Exception as exc:  # the forward itself, or shared state: fail the batch, keep serving
                    log.exception("engine_step_failed")
                    self._fail_all(f"internal engine error: {type(exc).__name__}")

    def _take_inbox(self, block: bool) -> bool:
        """Take what arrived, and what a step set aside (waiting up to 0.5 s for something when `block`);
        whether anything was taken."""
        items, self._later = self._later, []
        if not items:
            try:
                items.append(self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait())
            except queue.Empty:
                return False
        while True:
            try:
                items.append(self.inbox.get_nowait())
            except queue.Empty:
                break
        for kind, payload in items:
            if kind == "submit":
                self.scheduler.add(payload)
            elif kind == "cancel":
                self._cancel(payload)
        return True

    def _take_arrivals(self) -> bool:
        """Mid-step: submissions join the queue (True when any did); cancellations wait for the step's end."""
        arrived = False
        while True:
            try:
                kind, payload = self.inbox.get_nowait()
            except queue.Empty:
                return arrived
            if kind == "submit":
                self.scheduler.add(payload)
                arrived = True
            else:
                self._later.append((kind, payload))

    def _cancel(self, request_id: str) -> None:
        state = self.scheduler.cancel(request_id)
        if state is not None:
            events = StepEvents()
            self.executor.complete(state, events)
            events.deliver()

    def _fail_all(self, message: str) -> None:
        for state in self.scheduler.clear():
            state.done = True
            state.sink([Error(kind="internal", message=message)])


def _model_eos_ids(loaded: LoadedModel) -> list[int]:
    ids = set()
    configured = getattr(loaded.model.generation_config, "eos_token_id", None) or loaded.model.config.eos_token_id
    if isinstance(configured, int):
        ids.add(configured)
    elif configured:
        ids.update(configured)
    if loaded.tokenizer.eos_token_id is not None:
        ids.add(loaded.tokenizer.eos_token_id)
    return sorted(ids)
