"""The executor: runs the step the scheduler planned, on the model runner and the running rows' slots.

Prefill chunks write prompts into the free slot (with prompt logprobs when asked), after the prompt's cached
prefix is copied there (prefix_cache.py); a prompt fully in the cache is offered to the prefix cache and
starts its request: its rows join the batch (extra candidates copy its slot) and it hears `Accepted` at once.
Under the native forward the chunks of several prompts planned in one step run in one forward, each staged in
the slot its request takes once the ones before it have joined (`_prefill_together`), so a burst of short or
mostly cached prompts reads every weight once, not once per prompt.
Then one decode step, of every row, of the ordinary rows alone (beam_budget.py), or of one newcomer's rows alone
(its first token, when rows were parked to make room for it: scheduler.py): the forward in row groups (runner.py);
in each group's own thread its logits through the logits pipeline and the token choice (decoding/batch.py;
failures set apart per row, row_faults.py); beam bookkeeping (beam_rows.py); each row takes its token (finish
checks, detokenizing, stop strings, tool calls) and the step's events are built. A failure that belongs to one
request ends that request alone; the rest of the batch goes on.
"""

from __future__ import annotations

import time
from collections.abc import Callable

import structlog
import torch

from common.protocol import Accepted, Done, Error, Finish
from worker.decoding.batch import DecodingBatch, RowSpec
from worker.decoding.detokenizer import IncrementalDetokenizer
from worker.decoding.rows import RowState
from worker.decoding.sampling import Choice
from worker.decoding.stops import StopMatcher
from worker.engine.beam_rows import new_beam_search, prenormalize, row_params, step_beams
from worker.engine.host_load import HostLoad
from worker.engine.outputs import (
    StepEvents,
    accepted_event,
    failure_event,
    final_events,
    finish_event,
    requested_ids,
    token_event,
)
from worker.engine.prefix_cache import PrefixCache
from worker.engine.row_faults import broken_rows, choose_isolating
from worker.engine.runner import ModelRunner, PromptChunk, StepOutput
from worker.engine.scheduler import Prefill, StepPlan, StepReport
from worker.engine.sequence import RequestState, Sequence
from worker.engine.slots import Slots
from worker.engine.speculation import new_drafter, plan_drafts
from worker.engine.thread_choice import ThreadChoice
from worker.threads import intra_op_threads

log = structlog.get_logger(__name__)
# below this many rows a decode step's logits pipeline (a few vocabulary-wide ops per row) runs on one torch
# thread: waking the OpenMP team costs more than it saves (1 row of SmolLM2's 49k: 0.23 ms on one thread,
# 4 ms on two on a busy 2-core host), and its threads spin on the cores the next native forward needs
TEAM_LOGITS_ROWS = 8


def logits_threads(rows: int, team: int) -> int:
    """torch threads for the logits pipeline of a step of `rows` rows in one group, `team` being torch's own
    count (1 on a busy host: host_load.py)."""
    return 1 if rows < TEAM_LOGITS_ROWS else team


class Executor:
    def __init__(self, runner: ModelRunner, slots: Slots, prefixes: PrefixCache, tokenizer, worker_id: str,
                 prompt_lookup: bool = True):
        self.runner, self.slots, self.prefixes = runner, slots, prefixes
        self.prompt_lookup = prompt_lookup  # ModelConfig.prompt_lookup: drafts from n-gram matches (drafts.py)
        self.tokenizer, self.worker_id = tokenizer, worker_id
        self.special_ids = frozenset(tokenizer.all_special_ids)
        self.steps = 0  # decode steps run
        self.step_seconds = 0.0  # their time (EngineStats, read by the HTTP side: plain numbers, no lock)
        self.prompt_tokens = 0  # of the requests completed
        self.generated_tokens = 0
        self.host = HostLoad()
        self.thread_choice = ThreadChoice()

    def _looks_up(self, state: RequestState) -> bool:
        """Prompt lookup (unasked-for drafts) only where a verified token is bitwise the token of a step of its
        own: the native forward, rows without an adapter. Elsewhere a draft chunk rounds unlike a decode step, and
        a plain request's greedy tokens must not depend on what was drafted; a `prediction` drafts everywhere."""
        return self.prompt_lookup and self.runner.native is not None and state.prepared.request.adapter is None

    def run(self, plan: StepPlan, events: StepEvents, between: Callable[[int], None] | None = None) -> StepReport:
        """Run `plan`; the decode step's events go into `events`, the others to their sinks at once. After each
        prefill forward, `between(forwards run)` may replace the plan's prefills not yet run.

        Under the native forward the step's own torch work (the logits pipeline, cache copies, embeddings) runs on
        one thread: the native forward brings its own team, and an OpenMP team woken between its calls spins on
        the cores that team needs next (Gemma 3 270M, 16 streams of 64 tokens in-process with 2 torch threads on
        a loaded 2-core host: 11.8-13.3 -> 8.7-10.7 CPU seconds; a slot's KV copy 206 -> 1 ms, its 36 tensors
        each a parallel region). Torch forwards (adapter rows) set their own team (runner.group_threads)."""
        with intra_op_threads(1 if self.runner.native is not None else torch.get_num_threads()):
            return self._run(plan, events, between)

    def _run(self, plan: StepPlan, events: StepEvents, between: Callable[[int], None] | None) -> StepReport:
        told = 0  # dropped requests told so far
        for state, error in plan.dropped:
            state.sink([error])
            told += 1
        report = StepReport()
        if plan.grow_layers:
            started = time.perf_counter()
            grown = sum(self.runner.cache.grow_layer(plan.grow) for _ in range(plan.grow_layers))
            if grown:
                report.growth = (grown * self.runner.cache.layer_bytes(plan.grow), time.perf_counter() - started)
        if plan.rows_ahead > self.runner.cache.rows:  # slots for every row about to join, in one growth
            self.runner.cache.ensure(0, plan.rows_ahead)
        ran = 0
        while ran < len(plan.prefills):
            prefills = self._sharing(plan.prefills, ran)
            count = sum(prefill.count for prefill in prefills)
            if count:  # a growth the forward needs (nothing decodes) is not its cost
                self.runner.cache.ensure(max(p.start + p.count for p in prefills), self.slots.free + len(prefills))
            started = time.perf_counter()
            if len(prefills) > 1:
                self._prefill_together(prefills)
            else:
                self._prefill(prefills[0])
            if count:
                report.prefills.append((count, time.perf_counter() - started))
            ran += len(prefills)
            if between is not None:
                between(ran)
                for state, error in plan.dropped[told:]:
                    state.sink([error])
                told = len(plan.dropped)
        rows = len(self.slots.rows)
        if rows:
            first, end = 0, rows
            alone = self._newcomers_rows(plan.first_token_alone)
            if alone is not None:
                (first, end), report.alone = alone, True
            else:
                ordinary = self.slots.ordinary()
                report.mixed = 0 < ordinary < rows
                report.full = not (report.mixed and plan.beams_sit_out)
                end = rows if report.full else ordinary
            started = time.perf_counter()
            # while prompts wait to join, rows draft nothing: the prompts wait for each forward, and the batch grows
            self._decode(first, end, events, drafting=not plan.others_wait and alone is None)
            report.decoded, report.seconds = True, time.perf_counter() - started
            self.step_seconds += report.seconds
        return report

    def complete(self, state: RequestState, events: StepEvents) -> None:
        """Its rows all finished (or it was cancelled): its last events."""
        for event in final_events(state, self.tokenizer, self.worker_id):
            if isinstance(event, Done):
                self.prompt_tokens += event.prompt_tokens
                self.generated_tokens += event.compute_tokens
            events.add(state, event)
        state.done = True

    # ---- prefill ----

    def _prefill(self, prefill: Prefill) -> None:
        state, slot = prefill.state, self.slots.free
        if state.parked:  # preempted before: its rows come back as they were, nothing to prefill
            self.slots.resume(state)
            return
        try:  # this request's own forward and first event: a failure there is its own
            self.slots.take_back(state)
            self._restore(prefill, slot)
            if prefill.count > 0:
                self._prefill_chunk(state, prefill, slot)
        except Exception as exc:
            self._prefill_failed(state, slot, exc)
            return
        self._prefilled(prefill, slot)

    def _sharing(self, prefills: list[Prefill], first: int) -> list[Prefill]:
        """The prefills from `first` on whose chunks run in one forward (`_prefill_together`), else just the first.
        A chunk shares when the native forward runs it (no adapter) and its request's rows take exactly the next
        slot (one candidate, not parked or set aside) and want no prompt logprobs; a prompt not finished by its
        chunk ends the run, since the next one starts in its slot only once it has."""
        if self.runner.native is None:
            return prefills[first:first + 1]
        run: list[Prefill] = []
        for prefill in prefills[first:]:
            state = prefill.state
            if (state.adapter is not None or state.parked
                    or state.set_aside is not None or state.prepared.candidates != 1
                    or state.prepared.request.params.prompt_logprobs
                    or self.slots.free + len(run) + 1 > self.runner.cache.max_rows):
                break
            run.append(prefill)
            if not prefill.last:
                break
        return run if len(run) > 1 else prefills[first:first + 1]

    def _prefill_together(self, prefills: list[Prefill]) -> None:
        """Several prompts' chunks in one forward, each staged in the slot it takes when the ones before it have
        joined (free, free + 1, ...): every weight is read once for all of them."""
        first = self.slots.free
        try:
            chunks = []
            for offset, prefill in enumerate(prefills):
                self._restore(prefill, first + offset)
                if prefill.count:  # else its prompt but the last token was all cached
                    chunks.append(self._chunk(prefill, first + offset))
            if chunks:
                self.runner.prefill_together(chunks, self.host.prefill_threads(self.runner.prefill_threads))
        except Exception:
            log.exception("prefill_together_failed", request_ids=[p.state.request_id for p in prefills])
            for prefill in prefills:  # one forward each: a failure is then its own request's
                self._prefill(prefill)
            return
        for offset, prefill in enumerate(prefills):
            prefill.state.prefilled = prefill.start + prefill.count
            if first + offset != self.slots.free:  # one before it took no slot (scoring only, a failure)
                self.runner.cache.move(first + offset, self.slots.free, prefill.state.prefilled)
            self._prefilled(prefill, self.slots.free)

    def _restore(self, prefill: Prefill, slot: int) -> None:
        """Its cached prefix blocks, if the plan found any, copied into `slot`."""
        if prefill.reuse is not None:
            self.prefixes.restore(prefill.reuse, slot)
            prefill.state.prefilled = prefill.state.cached_tokens = prefill.reuse.tokens

    @staticmethod
    def _chunk(prefill: Prefill, slot: int) -> PromptChunk:
        prepared, start, end = prefill.state.prepared, prefill.start, prefill.start + prefill.count
        embeds = None if prepared.prompt_embeds is None else prepared.prompt_embeds[start:end]
        return PromptChunk(slot, prepared.prompt_ids[start:end], start, embeds)

    def _prefilled(self, prefill: Prefill, slot: int) -> None:
        """After its chunk: a prompt now in the cache up to its last token is offered to the prefix cache and
        starts its request (or, scoring only, ends it)."""
        if not prefill.last:
            return
        state = prefill.state
        try:
            self.prefixes.store(state, slot)
            accepted = accepted_event(state, self.tokenizer, self.worker_id)
        except Exception as exc:
            self._prefill_failed(state, slot, exc)
            return
        if state.prepared.max_new_tokens == 0:
            self._score_only(state, accepted, slot)
        else:
            self._start(state, accepted)

    def _prefill_failed(self, state: RequestState, slot: int, exc: Exception) -> None:
        """Called in the `except` of a failure that is this request's own: it ends, its slot cleared."""
        log.exception("prefill_failed", request_id=state.request_id)
        self.runner.cache.clear(slot)
        state.end(f"prefilling its prompt failed ({type(exc).__name__})")
        state.sink([failure_event(state)])

    def _prefill_chunk(self, state: RequestState, prefill: Prefill, slot: int) -> None:
        chunk, params = self._chunk(prefill, slot), state.prepared.request.params
        out = self.runner.prefill(slot, chunk.token_ids, start=chunk.start, embeds=chunk.embeds,
                                  all_logits=params.prompt_logprobs, adapter=state.adapter,
                                  threads=self.host.prefill_threads(self.runner.prefill_threads))
        if params.prompt_logprobs:
            self._record_prompt_logprobs(state, out.logits, chunk.start, prefill.count)
        state.prefilled = prefill.start + prefill.count

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
        """Its rows join the batch, one per candidate, each with its own seed; its last prompt token is the
        input of their first decode step."""
        prepared = state.prepared
        params = prepared.request.params
        state.beam = new_beam_search(state)
        specs = []
        for candidate in range(prepared.candidates):
            seed = prepared.seeds[candidate]
            state.sequences.append(Sequence(
                state, candidate, seed, length=len(prepared.prompt_ids) - 1, next_input=prepared.prompt_ids[-1],
                detokenizer=IncrementalDetokenizer(self.tokenizer, prepared.prompt_ids, params.skip_special_tokens),
                stopper=StopMatcher(params.stop),
                call_parser=prepared.tools.parser(candidate) if prepared.tools else None,
                drafter=new_drafter(state, self._looks_up(state))))
            specs.append(RowSpec(row_params(params), prepared.prompt_ids, seed, prepared.eos_token_ids,
                                 prepared.bad_word_ids, grammar=prepared.grammar))
        self.slots.join(state.sequences, specs, state.prefilled)
        if prepared.prompt_embeds is not None:
            state.last_embed = prepared.prompt_embeds[-1]
        state.sink([accepted])

    def _score_only(self, state: RequestState, accepted: Accepted, slot: int) -> None:
        """`max_tokens: 0` (OpenAI's echo scoring): the prefill gave every prompt logprob there is, so the request
        ends here, its choices empty; no row joins the batch and its cache slot is free again."""
        self.runner.cache.clear(slot)
        prepared = state.prepared
        finishes = [Finish(index=index, reason="length", text="", token_ids=[], seed=prepared.seeds[index])
                    for index in range(prepared.returned)]
        state.done = True
        state.sink([accepted, *finishes, Done(prompt_tokens=len(prepared.prompt_ids), completion_tokens=0,
                                              compute_tokens=0, worker_id=self.worker_id,
                                              cached_tokens=state.cached_tokens)])

    # ---- decode ----

    def _newcomers_rows(self, state: RequestState | None) -> tuple[int, int] | None:
        """The slots first..end-1 of the rows of `state` (an ordinary request that just joined), when other rows
        run beside them; None otherwise (the step decodes as usual)."""
        if state is None or state.done:
            return None
        slots = [i for i, row in enumerate(self.slots.rows) if row.request is state]
        if not slots or len(slots) == len(self.slots.rows) or slots[-1] - slots[0] + 1 != len(slots):
            return None
        return slots[0], slots[-1] + 1

    def _decode(self, first: int, end: int, events: StepEvents, drafting: bool = True) -> None:
        """One token for each row of slots first..end-1 (every row, the ordinary ones, or one newcomer's: never
        beam rows after others, whose bookkeeping counts slots from 0); more for rows whose draft tokens
        (speculation.py) are taken, where `drafting` (only from slot 0)."""
        rows, count = self.slots.rows[first:end], end - first
        batch = self.slots.batch.slice(first, end)
        want_hidden = any(r.request.prepared.request.params.return_hidden_states for r in rows)
        overrides = {i: r.request.last_embed for i, r in enumerate(rows)
                     if not r.output_ids and r.request.last_embed is not None}

        drafts = plan_drafts(rows, self.runner.cache.capacity, self.runner.vocab_size) \
            if drafting and first == 0 and any(r.drafter is not None for r in rows) else {}
        tokens = count + sum(len(draft) for draft in drafts.values())
        threads = self.host.prefill_threads(self.runner.prefill_threads)
        native = self.runner.native is not None and all(r.request.adapter is None for r in rows)
        if native:  # one native call: 1 thread or the team, whichever this host ran faster lately
            threads = self.thread_choice.pick(tokens, threads)
        began = time.perf_counter()

        def choose(first: int, end: int, out: StepOutput):  # in each row group's thread, after its forward
            logits = prenormalize(rows[first:end], out.logits)
            team = torch.get_num_threads()  # parallel row groups leave it: their threads share the setting
            with intra_op_threads(team if end - first < count else logits_threads(count, min(threads, team))):
                scores, choice, faults = choose_isolating(batch.slice(first, end), logits)
            return out, scores, choice, {first + i: why for i, why in faults.items()}

        inputs, lengths = [r.next_input for r in rows], [r.length for r in rows]
        if drafts and native:  # every row's tokens, drafts included, in one forward
            first, later = self.runner.decode_with_drafts(inputs, lengths, drafts, want_hidden, overrides, threads)
            groups = [choose(0, count, first)]
        else:
            groups = self.runner.decode_groups(inputs, lengths, want_hidden=want_hidden, embeds_override=overrides,
                                               then=choose, adapters=[r.request.adapter for r in rows],
                                               threads=threads, first_slot=first)
            later = {i: self.runner.prefill(i, draft, start=rows[i].length + 1, all_logits=True,  # its own chunk
                                            adapter=rows[i].request.adapter).logits for i, draft in drafts.items()}
        if native:
            self.thread_choice.record(tokens, threads, time.perf_counter() - began)
        out = StepOutput.concat([group[0] for group in groups])
        scores = groups[0][1] if len(groups) == 1 else torch.cat([group[1] for group in groups])  # one group: no copy
        choice = Choice.concat([group[2] for group in groups])
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
                    self._advance(i, row, choice, out, events, batch.rows[i])
                except Exception as exc:  # detokenizing, stop strings, its events: this request's own
                    log.exception("row_advance_failed", request_id=row.request.request_id)
                    self._fail(row.request, f"building its output failed ({type(exc).__name__})", events)
        for i, draft in drafts.items():
            self._check_drafts(rows[i], batch.slice(i, i + 1), draft, later[i], events)
        self._end_requests(events)

    def _check_drafts(self, row: Sequence, single: DecodingBatch, draft: list[int], logits: torch.Tensor,
                      events: StepEvents) -> None:
        """While the row's last token equals the next draft token, the logits at that draft's position choose its
        next token, through the row's own logits pipeline (speculation.py)."""
        accepted = 0
        for index, token in enumerate(draft):
            if row.finish or row.request.done or row.output_ids[-1] != token:
                break
            accepted += 1
            out = StepOutput(logits[index:index + 1], None)
            # one torch thread, as a step of a few rows has (logits_threads): a team splits a row's sums over the
            # vocabulary and rounds them otherwise, and costs more to wake than it saves
            with intra_op_threads(1):
                scores, choice, faults = choose_isolating(single, out.logits)
            faults = faults or broken_rows(choice, scores)
            if faults:
                self._fail(row.request, faults[0], events)
                break
            single.append(choice.tokens)
            row.length += 1
            try:
                self._advance(0, row, choice, out, events, single.rows[0])
            except Exception as exc:
                log.exception("row_advance_failed", request_id=row.request.request_id)
                self._fail(row.request, f"building its output failed ({type(exc).__name__})", events)
                break
        row.drafter.verified(draft, accepted)

    def _advance(self, i: int, row: Sequence, choice: Choice, out: StepOutput, events: StepEvents,
                 batch_row: RowState) -> None:
        """Row `i` of the step's choice is `row`'s next token; `batch_row` is its decoding state."""
        token = choice.token_ids[i]
        delta, calls = row.take(token, choice.logprobs[i], batch_row.spec, batch_row.grammar, self.runner.max_context)
        state = row.request
        if state.streams_tokens:
            params = state.prepared.request.params
            events.add(state, token_event(row, token, delta, choice, i, out, params, self.tokenizer,
                                              self.special_ids))
            for call in calls:
                events.add(state, call)
            if row.finish:
                events.add(state, finish_event(row, row.candidate))

    def _end_requests(self, events: StepEvents) -> None:
        """Requests whose rows all finished complete; those past their deadline end with a timeout."""
        now = time.time()
        for row in self.slots.rows:
            deadline = row.request.prepared.request.deadline_unix
            if deadline is not None and now > deadline and row.finish is None:
                row.request.deadline_missed = True
        touched = {id(r.request): r.request for r in self.slots.rows if r.finish or r.request.deadline_missed}
        for state in touched.values():
            if state.done:
                continue
            if state.deadline_missed:
                state.end()
                events.add(state, Error(kind="timeout", message="the request's deadline passed before it finished"))
            elif all(s.finish for s in state.sequences):
                try:
                    self.complete(state, events)
                except Exception as exc:
                    log.exception("request_completion_failed", request_id=state.request_id)
                    self._fail(state, f"building its result failed ({type(exc).__name__})", events)

    def _fail(self, state: RequestState, reason: str, events: StepEvents) -> None:
        """One request fails alone: its rows leave at the end of the step, its events so far are dropped."""
        if state.done:
            return
        log.error("request_failed", request_id=state.request_id, reason=reason)
        self.slots.clear(state)
        state.end(reason)
        events.replace(state, [failure_event(state)])
