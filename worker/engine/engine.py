"""The continuous-batching engine: one thread owns the model, the KV cache and the decoding batch.

Each iteration: apply submissions and cancellations, prefill waiting prompts (tenants in fair turns,
fair_turns.py) within the token budget
(the prompt minus its last token goes into the cache; a request with several candidates is
prefilled once and its cache rows copied), then one decode step for the running rows: every row, or
only the ordinary ones while beam rows sit a step out (beam_budget.py). A stepping row feeds exactly
one token, so a freshly prefilled row simply joins the next step. Rows 0..B-1 of the cache, the
decoding batch and `self.rows` always line up, ordinary rows first (slots.py). With several decode
threads, contiguous row groups run their forward and choose their tokens in parallel (runner.py).
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter, deque
from pathlib import Path

import structlog
import torch

from common.protocol import (
    Accepted,
    Done,
    Error,
    Finish,
    GenerateRequest,
    ModelConfig,
    SamplingParams,
    WorkerLoad,
    floored_logprob,
)
from worker.decoding.bad_words import tokenize_bad_words
from worker.decoding.batch import DecodingBatch, RowSpec
from worker.decoding.detokenizer import IncrementalDetokenizer
from worker.decoding.finish import finish_reason
from worker.decoding.grammar import GrammarCompiler
from worker.decoding.sampling import Choice
from worker.decoding.stops import StopMatcher
from worker.engine.admission import next_admissible
from worker.engine.beam_budget import BeamBudget
from worker.engine.beam_rows import beam_events, new_beam_search, prenormalize, row_params, step_beams
from worker.engine.fair_turns import FairTurns, tenant_of
from worker.engine.outputs import StepEvents, accepted_event, failure_event, finish_event, requested_ids, token_event
from worker.engine.prepare import PreparedRequest, RequestRejected, prepare
from worker.engine.row_faults import broken_rows, choose_isolating
from worker.engine.runner import ModelRunner, StepOutput
from worker.engine.sequence import RequestState, Sequence
from worker.engine.slots import compacted_order, joining_swaps
from worker.engine.w8a8 import quantize_runner
from worker.loading import LoadedModel
from worker.lora.errors import AdapterError
from worker.lora.store import AdapterStore
from worker.threads import decode_threads

log = structlog.get_logger(__name__)


class Engine:
    def __init__(self, loaded: LoadedModel, config: ModelConfig, worker_id: str = "", data_dir: Path = Path(".data"),
                 *, compile_later: bool = False):
        """`compile_later`: leave the scripted decode layers and the grammar vocabulary to `finish_start`,
        once the worker is warm: until then decode steps take the Python path (same logits, one row
        group), and a first constrained request builds the vocabulary itself."""
        self.loaded, self.config, self.worker_id = loaded, config, worker_id
        self.tokenizer = loaded.tokenizer
        self.runner = ModelRunner(loaded.model, config.max_batch_size, config.max_context, decode_threads(config))
        if loaded.quantization == "w8a8":
            quantize_runner(self.runner, loaded.tokenizer)
        if compile_later:
            self.runner.defer_scripting()
        else:
            self.runner.scripted_layers()  # compiled now rather than on the first request
        self.max_rows = config.max_batch_size
        self.vocab_size = self.runner.vocab_size
        self.model_eos = _model_eos_ids(loaded)
        self.grammars = GrammarCompiler(self.tokenizer, self.vocab_size, self.model_eos,
                                        timeout_s=config.grammar_compile_timeout_s,
                                        cache_bytes=config.grammar_cache_bytes, build_later=compile_later)
        self.batch = DecodingBatch(self.vocab_size, "cpu")
        self.rows: list[Sequence] = []
        self.waiting: deque[RequestState] = deque()
        self.turns = FairTurns()
        self.prefilling: RequestState | None = None
        self.inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._queued = 0  # submitted and not yet started (in the inbox or waiting): max_queue bounds it
        self._queued_lock = threading.Lock()
        self.by_id: dict[str, RequestState] = {}
        self.steps = 0
        self.beam_budget = BeamBudget(config.ordinary_share_beside_beams)
        self.adapters = AdapterStore(self.runner.layers, self.runner.dtype, self.runner.device,
                                     capacity=config.max_loaded_adapters, max_rank=config.max_adapter_rank,
                                     data_dir=data_dir, retry_s=config.adapter_retry_s,
                                     wake=lambda: self.inbox.put(("wake", None)))
        self._waiting_for_adapters = False  # nothing waiting can start until an adapter load ends
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sluice-engine", daemon=True)

    # ---- called from the HTTP side (any thread) ----

    def prepare(self, request: GenerateRequest) -> PreparedRequest:
        started = time.perf_counter()
        prepared = prepare(request, self.tokenizer, vocab_size=self.vocab_size, hidden_size=self.runner.hidden_size,
                       max_context=self.runner.max_context, max_rows=self.max_rows, model_eos=self.model_eos,
                       embed=self.runner.embed, tokenize_bad_words=tokenize_bad_words,
                       compile_grammar=self.grammars.compile)
        prepared.validation_s = time.perf_counter() - started
        return prepared

    def submit(self, prepared: PreparedRequest, sink) -> None:
        with self._queued_lock:
            if self._queued >= self.config.max_queue:
                raise RequestRejected("the worker queue is full, retry later", kind="overloaded")
            self._queued += 1
        self.inbox.put(("submit", RequestState(prepared, sink)))

    def cancel(self, request_id: str) -> None:
        self.inbox.put(("cancel", request_id))

    def load(self) -> WorkerLoad:
        rows = len(self.rows)
        return WorkerLoad(ready=self._thread.is_alive(), model=self.config.name,
                          queued=self._queued + (self.prefilling is not None), running_rows=rows,
                          max_rows=self.max_rows,
                          free_cache_tokens=(self.max_rows - rows) * self.runner.max_context,
                          worker_id=self.worker_id, adapters=list(self.adapters.loaded_names))

    def start(self) -> None:
        self._thread.start()

    def finish_start(self) -> None:
        """What `compile_later` left: built in low-priority threads while the worker already serves."""
        self.runner.script_in_background()
        self.grammars.build_in_background()

    def warm_up(self, timeout_s: float = 60.0) -> None:
        """One tiny greedy request through the whole path (tokenizer, prefill, a decode step,
        detokenizer) after `start` and before the worker takes traffic: the first real request then
        pays no first-call costs."""
        finished = threading.Event()

        def sink(batch: list) -> None:
            if any(isinstance(event, (Done, Error)) for event in batch):
                finished.set()

        request = GenerateRequest(request_id="warm-up", model=self.config.name, prompt="Hello",
                                  params=SamplingParams(max_tokens=2, temperature=0.0, ignore_eos=True))
        self.submit(self.prepare(request), sink)
        finished.wait(timeout_s)

    def stop(self) -> None:
        self._stop.set()
        self.inbox.put(("wake", None))
        self._thread.join(timeout=10)

    # ---- engine thread ----

    def _run(self) -> None:
        # Every tensor the engine touches (cache growth, row moves, processors) lives in inference
        # mode: mixing inference tensors with in-place updates outside it is an error.
        with torch.inference_mode():
            while not self._stop.is_set():
                idle = not (self.rows or self.prefilling)
                self._drain_inbox(block=idle and (not self.waiting or self._waiting_for_adapters))
                try:
                    self._prefill()
                    if self.rows:
                        self._decode_step()
                except Exception as exc:  # the forward itself, or shared state: fail the batch, keep serving
                    log.exception("engine_step_failed")
                    self._fail_all(f"internal engine error: {type(exc).__name__}")

    def _drain_inbox(self, block: bool) -> None:
        try:
            item = self.inbox.get(timeout=0.5) if block else self.inbox.get_nowait()
        except queue.Empty:
            return
        while True:
            kind, payload = item
            if kind == "submit":
                self.waiting.append(payload)
                self.by_id[payload.request_id] = payload
            elif kind == "cancel":
                self._cancel(payload)
            try:
                item = self.inbox.get_nowait()
            except queue.Empty:
                return

    def _cancel(self, request_id: str) -> None:
        state = self.by_id.get(request_id)
        if state is None or state.done:
            return
        state.cancelled = True
        if state in self.waiting:
            self.waiting.remove(state)
            self._dequeued()
        if self.prefilling is state:
            self.prefilling = None
        gone = [i for i, row in enumerate(self.rows) if row.request is state]
        for i in gone:
            self.rows[i].finish = "cancelled"
        self._complete(state, StepEvents())
        self._compact(gone)

    def _prefill(self) -> None:
        budget = self.config.max_batched_tokens
        while budget > 0:
            if self.prefilling is None:
                self._take_turns()
                state = next_admissible(self.waiting, self.adapters, self._adapters_in_use(), self._refuse_adapter)
                self._waiting_for_adapters = state is None and bool(self.waiting)
                if state is None or len(self.rows) + state.prepared.candidates > self.max_rows:
                    return
                self.waiting.remove(state)
                self._dequeued()
                self.turns.started(state)
                deadline = state.prepared.request.deadline_unix
                if deadline is not None and time.time() > deadline:
                    self._reject(state, "the request's deadline passed before it could start", "timeout")
                    continue
                state.queue_s = time.perf_counter() - state.submitted
                self.prefilling = state
            state = self.prefilling
            prompt = state.prepared.prompt_ids
            target = len(prompt) - 1  # the last prompt token is fed by the first decode step
            chunk = min(budget, target - state.prefilled)
            budget -= max(chunk, 0)
            try:  # this request's own forward and first event: a failure there is its own
                if chunk > 0:
                    self._prefill_chunk(state, chunk)
                accepted = None if state.prefilled < target else accepted_event(state, self.tokenizer, self.worker_id)
            except Exception as exc:
                log.exception("prefill_failed", request_id=state.request_id)
                self.prefilling = None
                self.runner.cache.clear(len(self.rows))  # the slot it was prefilled into
                self._end(state, f"prefilling its prompt failed ({type(exc).__name__})")
                state.sink([failure_event(state)])
                continue
            if accepted is not None:
                self.prefilling = None
                if state.prepared.max_new_tokens == 0:
                    self._score_only(state, accepted)
                else:
                    self._start(state, accepted)

    def _take_turns(self) -> None:
        """Reorder the waiting queue so that tenants take turns at the free rows (fair_turns.py)."""
        if len(self.waiting) > 1:
            ordered = self.turns.order(self.waiting, Counter(tenant_of(row.request) for row in self.rows))
            self.waiting.clear()
            self.waiting.extend(ordered)

    def _dequeued(self) -> None:
        with self._queued_lock:
            self._queued -= 1

    def _prefill_chunk(self, state: RequestState, chunk: int) -> None:
        prepared = state.prepared
        start = state.prefilled
        ids = prepared.prompt_ids[start:start + chunk]
        embeds = None if prepared.prompt_embeds is None else prepared.prompt_embeds[start:start + chunk]
        params = prepared.request.params
        out = self.runner.prefill(len(self.rows), ids, start=start, embeds=embeds, all_logits=params.prompt_logprobs,
                                  adapter=state.adapter)
        if params.prompt_logprobs:
            self._record_prompt_logprobs(state, out.logits, start, chunk)
        state.prefilled += chunk

    def _record_prompt_logprobs(self, state: RequestState, logits: torch.Tensor, start: int, chunk: int) -> None:
        """Position i's logits predict prompt token i+1: its logprob, and what SGLang and TGI can also ask
        for about that distribution (the top N and a list of chosen ids)."""
        prepared = state.prepared
        params = prepared.request.params
        following = torch.tensor(prepared.prompt_ids[start + 1:start + chunk + 1], device=logits.device)
        logprobs = torch.log_softmax(logits[: len(following)].float(), dim=-1)
        state.prompt_logprobs += logprobs.gather(1, following[:, None])[:, 0].tolist()
        if params.logprobs:
            values, indices = logprobs.topk(min(params.logprobs, logprobs.shape[-1]), dim=-1)
            state.prompt_top += [list(zip(i, v)) for i, v in zip(indices.tolist(), values.tolist())]
        wanted = requested_ids(params.token_ids_logprob, logprobs.shape[-1])
        if wanted:
            state.prompt_ids_logprobs += [list(zip(wanted, row)) for row in logprobs[:, wanted].tolist()]

    def _start(self, state: RequestState, accepted: Accepted) -> None:
        prepared = state.prepared
        params = prepared.request.params
        state.beam = new_beam_search(state)
        slot = len(self.rows)
        ordinary = self._ordinary_rows()
        for extra in range(1, prepared.candidates):
            self.runner.cache.move(slot, slot + extra, state.prefilled)
        for candidate in range(prepared.candidates):
            seed = prepared.seeds[candidate]
            sequence = Sequence(state, candidate, seed, length=len(prepared.prompt_ids) - 1,
                                next_input=prepared.prompt_ids[-1],
                                detokenizer=IncrementalDetokenizer(self.tokenizer, prepared.prompt_ids,
                                                                   params.skip_special_tokens),
                                stopper=StopMatcher(params.stop),
                                call_parser=prepared.tools.parser(candidate) if prepared.tools else None)
            state.sequences.append(sequence)
            self.rows.append(sequence)
            self.batch.add(RowSpec(row_params(params), prepared.prompt_ids, seed, prepared.eos_token_ids,
                                   prepared.bad_word_ids, grammar=prepared.grammar))
        if state.beam is None:
            self._move_ahead_of_beams(ordinary, slot)
        if prepared.prompt_embeds is not None:
            state.last_embed = prepared.prompt_embeds[-1]
        state.sink([accepted])

    def _score_only(self, state: RequestState, accepted: Accepted) -> None:
        """`max_tokens: 0` (OpenAI's echo scoring): the prefill gave every prompt logprob there is, so the request
        ends here, its choices empty; no row joins the batch and its cache slot is free again."""
        self.runner.cache.clear(len(self.rows))
        prepared = state.prepared
        finishes = [Finish(index=index, reason="length", text="", token_ids=[], seed=prepared.seeds[index])
                    for index in range(prepared.returned)]
        state.done = True
        self.by_id.pop(state.request_id, None)
        state.sink([accepted, *finishes, Done(prompt_tokens=len(prepared.prompt_ids), completion_tokens=0,
                                              compute_tokens=0, worker_id=self.worker_id)])

    def _ordinary_rows(self) -> int:
        """How many rows lead the batch before the first beam row."""
        return next((i for i, row in enumerate(self.rows) if row.request.beam is not None), len(self.rows))

    def _move_ahead_of_beams(self, ordinary: int, first_new: int) -> None:
        """Rows just added at first_new.. trade slots with beam rows so ordinary rows stay a prefix."""
        swaps = joining_swaps(ordinary, first_new, len(self.rows))
        if not swaps:
            return
        order = list(range(len(self.rows)))
        for first, second in swaps:
            length = max(self.rows[first].length, self.rows[second].length)
            self.runner.cache.swap(first, second, length)
            order[first], order[second] = second, first
        self.rows = [self.rows[i] for i in order]
        self.batch.reorder(order)

    def _decode_step(self) -> None:
        ordinary = self._ordinary_rows()
        mixed = 0 < ordinary < len(self.rows)
        full = not mixed or self.beam_budget.full_step()
        started = time.perf_counter()
        self._step(len(self.rows) if full else ordinary)
        if mixed:
            self.beam_budget.record(full, time.perf_counter() - started)

    def _step(self, count: int) -> None:
        """One token for each of the first `count` rows (all of them, or the ordinary ones)."""
        rows = self.rows[:count]
        batch = self.batch.prefix(count)
        want_hidden = any(r.request.prepared.request.params.return_hidden_states for r in rows)
        overrides = {i: r.request.last_embed for i, r in enumerate(rows)
                     if not r.output_ids and r.request.last_embed is not None}

        def choose(first: int, end: int, out: StepOutput):  # in each row group's thread, after its forward
            logits = prenormalize(rows[first:end], out.logits)
            scores, choice, faults = choose_isolating(batch.slice(first, end), logits)
            return out, scores, choice, {first + i: why for i, why in faults.items()}

        groups = self.runner.decode_groups([r.next_input for r in rows], [r.length for r in rows],
                                           want_hidden=want_hidden, embeds_override=overrides, then=choose,
                                           adapters=[r.request.adapter for r in rows])
        out = StepOutput.concat([group[0] for group in groups])
        scores = groups[0][1] if len(groups) == 1 else torch.cat([group[1] for group in groups])  # one group: no copy
        choice = Choice.concat([group[2] for group in groups])
        events = StepEvents()
        faults = {i: why for group in groups for i, why in group[3].items()} | broken_rows(choice, scores)
        for i, why in faults.items():
            self._fail(rows[i].request, why, events)
        failed = {id(r.request) for r in rows if r.request.done}
        for state, why in step_beams(rows, scores, batch, self.runner.cache, choice.tokens, failed):
            self._fail(state, why, events)  # beam rows: reorder, own tokens
        batch.append(choice.tokens)
        self.steps += 1
        for i, row in enumerate(rows):
            row.length += 1
            if row.request.beam is None and not row.request.done:  # beams stay private until the search ends
                try:
                    self._advance(i, row, choice, out, events)
                except Exception as exc:  # detokenizing, stop strings, its events: this request's own
                    log.exception("row_advance_failed", request_id=row.request.request_id)
                    self._fail(row.request, f"building its output failed ({type(exc).__name__})", events)
        now = time.time()
        for row in self.rows:
            deadline = row.request.prepared.request.deadline_unix
            if deadline is not None and now > deadline and row.finish is None:
                row.request.deadline_missed = True
        touched = {id(r.request): r.request for r in self.rows if r.finish or r.request.deadline_missed}
        for state in touched.values():
            if state.done:
                continue
            if state.deadline_missed:
                self._expire(state, events)
            elif all(s.finish for s in state.sequences):
                try:
                    self._complete(state, events)
                except Exception as exc:
                    log.exception("request_completion_failed", request_id=state.request_id)
                    self._fail(state, f"building its result failed ({type(exc).__name__})", events)
        events.deliver()
        self._compact([i for i, r in enumerate(self.rows) if r.finish])

    def _advance(self, i: int, row: Sequence, choice, out, events: StepEvents) -> None:
        token = choice.token_ids[i]
        spec = self.batch.rows[i].spec
        row.output_ids.append(token)
        row.cumulative_logprob += floored_logprob(choice.logprobs[i])  # a ruled-out forced token is -inf
        row.next_input = token
        grammar = self.batch.rows[i].grammar
        ended = finish_reason(spec, token, len(row.output_ids), self.runner.max_context, grammar)
        delta = ""
        if ended is None or ended[0] == "length":
            piece = row.detokenizer.push(token)
            delta, matched = row.stopper.push(piece)
            if matched is not None:
                ended = ("stop_sequence", matched)
        if ended is not None and ended[0] != "stop_sequence":
            tail, matched = row.stopper.push(row.detokenizer.flush())
            delta += tail + ("" if matched else row.stopper.flush())
            if matched is not None:
                ended = ("stop_sequence", matched)
        calls = []
        if row.call_parser is not None:  # text inside a tool call leaves the content
            delta, calls = row.call_parser.push(delta, final=ended is not None)
        row.text += delta
        if ended is not None:
            row.finish, row.matched_stop = ended
            row.incomplete = grammar is not None and not grammar.accepted  # cut before the grammar accepted
        state = row.request
        if state.streams_tokens:
            params = state.prepared.request.params
            events.add(state, token_event(row, token, delta, choice, i, out, params, self.tokenizer))
            for call in calls:
                events.add(state, call)
            if row.finish:
                events.add(state, finish_event(row, row.candidate))

    def _complete(self, state: RequestState, events: StepEvents) -> None:
        prepared = state.prepared
        if state.beam is not None:  # the n best beams, then usage; nothing was streamed
            for event in beam_events(state, self.tokenizer, self.worker_id):
                events.add(state, event)
        else:
            if not state.streams_tokens and not state.cancelled:
                best = sorted(state.sequences, key=lambda s: s.cumulative_logprob, reverse=True)[: prepared.returned]
                for index, sequence in enumerate(best):
                    events.add(state, finish_event(sequence, index))
            returned = state.sequences if state.streams_tokens else sorted(
                state.sequences, key=lambda s: s.cumulative_logprob, reverse=True)[: prepared.returned]
            events.add(state, Done(prompt_tokens=len(prepared.prompt_ids),
                                   completion_tokens=sum(len(s.output_ids) for s in returned),
                                   compute_tokens=sum(len(s.output_ids) for s in state.sequences),
                                   worker_id=self.worker_id))
        state.done = True
        self.by_id.pop(state.request_id, None)
        if state.cancelled:
            events.deliver()

    def _expire(self, state: RequestState, events: StepEvents) -> None:
        self._end(state)
        events.add(state, Error(kind="timeout", message="the request's deadline passed before it finished"))

    def _reject(self, state: RequestState, message: str, kind: str = "overloaded", field: str | None = None,
                retry_after_s: float | None = None) -> None:
        state.done = True
        self.by_id.pop(state.request_id, None)
        state.sink([Error(kind=kind, message=message, field=field, retry_after_s=retry_after_s)])

    def _refuse_adapter(self, state: RequestState, error: AdapterError) -> None:
        self._dequeued()
        self._reject(state, error.message, error.kind, "adapter", error.retry_after_s)

    def _adapters_in_use(self) -> set[tuple[str, str]]:
        """Adapters of the running rows: never evicted (admission runs when nothing is prefilling)."""
        return {row.request.adapter.key for row in self.rows if row.request.adapter is not None}

    def _fail(self, state: RequestState, reason: str, events: StepEvents) -> None:
        """One request fails alone: its rows leave at the end of the step, its events so far are dropped."""
        if state.done:
            return
        log.error("request_failed", request_id=state.request_id, reason=reason)
        for slot, row in enumerate(self.rows):
            if row.request is state:
                self.runner.cache.clear(slot)
        self._end(state, reason)
        events.replace(state, [failure_event(state)])

    def _end(self, state: RequestState, failure: str = "") -> None:
        state.end(failure)
        self.by_id.pop(state.request_id, None)

    def _compact(self, gone: list[int]) -> None:
        """Drop finished rows; later rows fill their slots so 0..B-1 stay dense, ordinary rows first."""
        if not gone:
            return
        gone_set = set(gone)
        survivors = [i for i in range(len(self.rows)) if i not in gone_set]
        order = compacted_order(survivors, [self.rows[i].request.beam is None for i in survivors])
        count = len(order)
        for target, source in enumerate(order):
            if source != target:
                self.runner.cache.move(source, target, self.rows[source].length)
        old_slot = len(self.rows)
        self.rows = [self.rows[i] for i in order]
        self.batch.reorder(order)
        if self.prefilling is not None and self.prefilling.prefilled and old_slot != count:
            self.runner.cache.move(old_slot, count, self.prefilling.prefilled)

    def _fail_all(self, message: str) -> None:
        states = {id(r.request): r.request for r in self.rows}
        if self.prefilling is not None:
            states[id(self.prefilling)] = self.prefilling
        for state in states.values():
            state.done = True
            self.by_id.pop(state.request_id, None)
            state.sink([Error(kind="internal", message=message)])
        for slot in range(len(self.rows) + 1):
            self.runner.cache.clear(slot)
        self.rows, self.prefilling = [], None
        self.batch = DecodingBatch(self.vocab_size, "cpu")


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
