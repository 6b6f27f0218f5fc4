"""The scheduler: which requests wait, which join the batch, and what each engine step runs (a `StepPlan`).

A step plans, in order: the waiting queue in tenants' fair turns (fair_turns.py); when the head's tenant
runs no rows and the batch is full, rows of the most-served tenant parked to make room (preemption.py);
the head admitted when its candidates (`n`, `best_of` or `num_beams`) fit in the rows left free (admission.py
steps around requests waiting for their LoRA adapter; a request whose deadline passed while it waited is
dropped; a parked request resumes in a zero-token "prefill");
admitted prompts prefilled one at a time, at most `max_batched_tokens` prompt tokens per step and, while rows
decode, about what one decode step costs (prefill_pace.py), so a long prompt takes several steps (chunked
prefill) while the running rows decode between its chunks, and the KV cache grows for it a layer a step; a
request of a tenant that runs nothing is the step's last prefill, so its first token waits for no other
prompt (nor does an interactive request's wait for a batch prompt: batch requests, `GenerateRequest.priority`,
come after every interactive one in the queue, their rows are parked first for one, and their prompts step
aside for one as below): another tenant's prompt partly prefilled steps aside for it (its cache positions kept,
it goes on where it stopped), and one that arrives while the step runs its prefills takes the step's rest, the
prompts planned after the forward in flight back at the queue's front (`yield_to_newcomer`); then one decode step
for the running rows, all of them or only the ordinary ones while beam rows sit the step out (beam_budget.py), or,
in the step that completes the prompt of an ordinary request rows were parked for, that request's rows alone: the
others sit that step out, so its first token waits for a forward of its own rows, not of the full batch (SmolLM2
float32, 8 rows: 84 ms against 51; a beam search's rows join the batch's step, as beam bookkeeping counts slots
from 0). A row that sits a step out decodes the same tokens one step later. A prompt
whose prefill completes counts as running from that step on: the next admission and the decode step of the same
step see its rows. After the step, finished rows leave (slots.py).

A prompt's prefill starts after its longest cached prefix (prefix_cache.py): the scheduler looks it up at
admission, the executor copies it into the slot; those tokens cost no prefill budget.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections import Counter, deque
from dataclasses import dataclass, field

from common.protocol import Error, ModelConfig
from worker.engine.admission import next_admissible
from worker.engine.beam_budget import BeamBudget
from worker.engine.fair_turns import FairTurns, is_batch, lane_of
from worker.engine.preemption import choose_victims
from worker.engine.prefill_pace import Allowance, PrefillPace
from worker.engine.prefix_cache import PrefixCache, PrefixHit
from worker.engine.prepare_errors import RequestRejected
from worker.engine.sequence import RequestState
from worker.engine.slots import Slots
from worker.lora.errors import AdapterError
from worker.lora.store import AdapterStore


@dataclass
class Prefill:
    """One chunk of a prompt to write into the free slot: positions start..start+count-1."""
    state: RequestState
    start: int
    count: int
    last: bool  # the prompt but its last token is then in the cache: the request starts (or, scoring only, ends)
    reuse: PrefixHit | None = None  # cached prefix blocks copied into the slot first (positions 0..start-1)


@dataclass
class StepPlan:
    prefills: list[Prefill] = field(default_factory=list)
    grow: int = 0  # KV cache layers grow to this capacity (prefill_pace.py says why)...
    grow_layers: int = 0  # ...this many of them in this step
    dropped: list[tuple[RequestState, Error]] = field(default_factory=list)  # waiting requests that never start
    beams_sit_out: bool = False  # with ordinary rows beside them, beam rows skip this decode step
    rows_ahead: int = 0  # with prefills: the rows the batch will hold once what waits has joined (<= max_rows)
    others_wait: bool = False  # a prompt waits or is partly prefilled after this step: rows draft nothing (drafts.py)
    first_token_alone: RequestState | None = None  # its rows alone decode this step (the others sit it out)


@dataclass
class StepReport:
    """What the executor tells the scheduler about a decode step it ran."""
    mixed: bool = False  # ordinary and beam rows were both running
    full: bool = True  # the beam rows decoded too
    decoded: bool = False  # a decode step ran
    alone: bool = False  # of a newcomer's rows alone (plan.first_token_alone)
    seconds: float = 0.0  # the decode step's
    prefills: list[tuple[int, float]] = field(default_factory=list)  # (prompt tokens, seconds) of each forward
    growth: tuple[int, float] | None = None  # (bytes, seconds) of the KV cache layers' growth


class Scheduler:
    def __init__(self, config: ModelConfig, slots: Slots, adapters: AdapterStore, prefixes: PrefixCache):
        self.max_rows, self.max_queue = config.max_batch_size, config.max_queue
        self.slots, self.adapters, self.prefixes = slots, adapters, prefixes
        self.waiting: deque[RequestState] = deque()
        self.requests: dict[str, RequestState] = {}  # every request from submission to its end, by id
        self.prefilling: RequestState | None = None  # admitted, its prompt partly in the cache
        self.turns = FairTurns()
        self.beam_budget = BeamBudget(config.ordinary_share_beside_beams)
        self.pace = PrefillPace(config.max_batched_tokens)
        self.waiting_for_adapters = False  # nothing waiting can start until an adapter load ends
        self.preemptions = 0  # requests parked (in whole or in part) so far
        self.made_room_for: RequestState | None = None  # rows were parked for it: its first token comes alone
        self._admissions = itertools.count(1)
        self._queued = 0  # submitted and not yet admitted: max_queue bounds it
        self._queued_lock = threading.Lock()

    # ---- any thread ----

    def reserve_place(self, bounded: bool = True) -> None:
        """A place in the queue for a request about to be submitted, or the refusal when the queue is full.

        `max_queue` bounds the requests that would wait for a row: those submitted beyond the rows free now (the
        gateway counts a replica's room the same way, max_batch_size + max_queue), so 0 means "no waiting" and
        still serves up to max_batch_size rows. `bounded=False`: the worker's own requests (its warm-up)."""
        with self._queued_lock:
            if bounded and self._queued + self._busy_rows() >= self.max_rows + self.max_queue:
                raise RequestRejected("the worker queue is full, retry later", kind="overloaded")
            self._queued += 1

    def _busy_rows(self) -> int:
        """Rows of requests not ended yet: a row whose request just sent its Done leaves the batch only after the
        step, and the gateway may already send the next request for it. A snapshot (read by other threads)."""
        return sum(not row.request.done for row in list(self.slots.rows))

    @property
    def queued(self) -> int:
        return self._queued + (self.prefilling is not None)

    # ---- engine thread ----

    @property
    def idle(self) -> bool:
        """Nothing to run until a submission, a cancellation or an adapter load arrives."""
        return not (self.slots.rows or self.prefilling) and (not self.waiting or self.waiting_for_adapters)

    def add(self, state: RequestState) -> None:
        self.waiting.append(state)
        self.requests[state.request_id] = state

    def cancel(self, request_id: str) -> RequestState | None:
        """The request leaves the queue, its prefill or its rows at once; None when it already ended."""
        state = self.requests.pop(request_id, None)
        if state is None or state.done:
            return None
        state.cancelled = True
        self._no_room_kept_for(state)
        if state in self.waiting:
            self.waiting.remove(state)
            self._dequeued()
        for parked in state.parked:  # rows outside the batch: they end there
            parked.sequence.finish = "cancelled"
        state.parked = []
        if self.prefilling is state:
            self.prefilling = None
        for row in self.slots.rows:
            if row.request is state:
                row.finish = "cancelled"
        self.slots.leave(self.prefilling)
        return state

    def schedule(self) -> StepPlan:
        plan = StepPlan()
        if self.prefilling is not None and self.prefilling.done:  # its prefill failed
            self.prefilling = None
        if self.prefilling is not None and self.waiting:
            self._give_way(plan, [])
        if self.prefilling is None and self.waiting:  # no partial prompt sits in the free slot
            self._make_room(plan)
        starting: list[RequestState] = []  # their prefill completes in this step and their rows join
        decoding = bool(self.slots.rows)
        prompts = len(self.waiting) + (self.prefilling is not None)  # a burst waits: prefill_pace.py
        self._plan_prefills(plan, self.pace.allowance(decoding, prompts), starting)
        self._first_token_alone(plan)
        if plan.prefills:
            plan.rows_ahead = self._rows_ahead(plan)
        rows = len(self.slots.rows) + sum(state.rows_wanted for state in starting)
        ordinary = self.slots.ordinary() + sum(s.rows_wanted for s in starting
                                               if s.prepared.request.params.num_beams <= 1)
        plan.beams_sit_out = 0 < ordinary < rows and not self.beam_budget.full_step()
        plan.others_wait = bool(self.waiting) or self.prefilling is not None
        return plan

    def yield_to_newcomer(self, plan: StepPlan, ran: int) -> None:
        """Between two forwards of the step (the first `ran` prefills of `plan` have run, their rows joined):
        when the queue's head in fair turns is a request that arrived for a tenant running nothing, the prompts
        planned after them go back to the queue's front, in order, and the newcomer's prompt takes the rest of
        the step, so its first token waits for no prompt planned before it arrived."""
        tail = plan.prefills[ran:]
        if not self._give_way(plan, tail):
            return
        del plan.prefills[ran:]
        if any(prefill.state is self.prefilling for prefill in tail):
            self.prefilling = None
        for prefill in reversed(tail):
            self._requeue(prefill.state)
        self._make_room(plan)
        self._plan_prefills(plan, self.pace.allowance(bool(self.slots.rows)), [])
        self._first_token_alone(plan)

    def _give_way(self, plan: StepPlan, tail: list[Prefill]) -> bool:
        """Whether the queue's head outranks every prompt still to prefill in this step (those of `tail`, planned,
        not run, and one partly prefilled) and can start now; if so, the partial prompt steps aside: its positions
        leave the free slot and it waits at the queue's front, to go on where it stopped. Ranks: interactive
        before batch, then a newcomer (its tenant runs no rows of its priority) before the others. With nothing
        left to prefill, only an interactive newcomer takes the step's rest."""
        running = self._running([])

        def rank(state: RequestState) -> tuple[bool, bool]:
            return is_batch(state), bool(running[lane_of(state)])

        partial = None if any(p.state is self.prefilling for p in tail) else self.prefilling
        pending = [prefill.state for prefill in tail] + ([partial] if partial is not None else [])
        head = self._head([], plan)
        if head is None or head.parked or rank(head) >= min(map(rank, pending), default=(False, True)):
            return False
        if len(self.slots.rows) + head.rows_wanted > self.max_rows and \
                not choose_victims(head, self.slots.rows, self.max_rows, self._parked_rows()):
            return False
        if partial is not None:
            self.slots.set_aside(partial)
            self.prefilling = None
            self._requeue(partial)
        return True

    def _plan_prefills(self, plan: StepPlan, allowance: Allowance, starting: list[RequestState]) -> None:
        """Prompt chunks for the step, one forward each, while `allowance` lasts; `starting` gathers the requests
        whose prefill completes."""
        decoding = bool(self.slots.rows)
        interactive = False  # an interactive prompt is planned: no batch prompt delays its first token
        while allowance.open:
            reuse = None
            if self.prefilling is None:
                state = self._admit(starting, plan, batch=not interactive)
                if state is None:
                    break
                if state.done:  # dropped
                    continue
                # reused blocks cost no budget; a parked request, or a prompt set aside, goes on with its own cache
                own = bool(state.parked) or state.prefilled
                self.prefilling, reuse = state, None if own else self.prefixes.lookup(state)
            state = self.prefilling
            interactive = interactive or not is_batch(state)
            newcomer = not self._running(starting)[lane_of(state)]
            start = state.prefilled if reuse is None else reuse.tokens
            target = len(state.prepared.prompt_ids) - 1  # the last prompt token is fed by the first decode step
            wanted = max(target - start, 0)
            room = self._grow_ahead(target + 1, start, plan, allowance) - 1 - start if decoding and wanted else wanted
            chunk = allowance.grant(min(wanted, max(room, 0)))
            if chunk < wanted and room < wanted:  # the rest waits for the cache to grow
                allowance.close()
            last = start + chunk >= target
            plan.prefills.append(Prefill(state, start, chunk, last, reuse))
            if last:
                self.prefilling = None
                if state.prepared.max_new_tokens > 0:
                    starting.append(state)
            if newcomer and self.slots.rows:  # a tenant running nothing: no other prompt delays its first token
                allowance.close()

    def finish(self, plan: StepPlan, report: StepReport) -> None:
        """After the step: the beam budget and the prefill pace learn its times, finished rows leave, ended
        requests are forgotten."""
        if report.mixed:
            self.beam_budget.record(report.full, report.seconds)
        for tokens, seconds in report.prefills:
            self.pace.record_prefill(tokens, seconds)
        if report.decoded and not report.alone:  # a step of some rows alone is not what the batch's costs
            self.pace.record_decode(report.seconds)
        if report.growth is not None:
            self.pace.record_growth(*report.growth)
        left = self.slots.leave(None if self.prefilling is None or self.prefilling.done else self.prefilling)
        for state in [row.request for row in left] + [prefill.state for prefill in plan.prefills]:
            if state.done:
                self.requests.pop(state.request_id, None)
                self._no_room_kept_for(state)
                if state.parked:  # it ended (deadline, failure) while some of its rows were parked
                    self._forget_parked(state)

    def clear(self) -> list[RequestState]:
        """The whole batch failed: every request admitted is forgotten, those not yet ended are returned."""
        waiting = {id(state) for state in self.waiting}
        in_batch = {id(row.request) for row in self.slots.rows}  # a request partly parked lost its other rows
        started = [state for state in self.requests.values() if id(state) not in waiting or id(state) in in_batch]
        for state in started:
            self.requests.pop(state.request_id, None)
            if state.parked:
                self._forget_parked(state)
        self.slots.reset()
        self.prefilling = None
        self.made_room_for = None
        return [state for state in started if not state.done]

    def _head(self, starting: list[RequestState], plan: StepPlan) -> RequestState | None:
        """The waiting request that starts next if it fits (fair turns, then admission.py), or None."""
        self._take_turns(starting)
        in_use = {s.adapter.key for s in [row.request for row in self.slots.rows] + starting if s.adapter is not None}
        state = next_admissible(self.waiting, self.adapters, in_use, lambda s, error: self._refuse(s, error, plan))
        self.waiting_for_adapters = state is None and bool(self.waiting)
        return state

    def _make_room(self, plan: StepPlan) -> None:
        """Park rows for a head whose tenant runs nothing (preemption.py); they wait at the queue's front."""
        head = self._head([], plan)
        if head is None:
            return
        victims = choose_victims(head, self.slots.rows, self.max_rows, self._parked_rows())
        if not victims:
            return
        queued = {id(state) for state in self.waiting}
        self.slots.park(victims)
        self.made_room_for = head if head.prepared.request.params.num_beams <= 1 else None
        for state in {id(row.request): row.request for row in victims}.values():  # newest first: the oldest in front
            if id(state) not in queued:  # a request partly parked before waits where it is
                self._requeue(state)
            self.preemptions += 1

    def _first_token_alone(self, plan: StepPlan) -> None:
        """When the prompt of the request rows were parked for completes in this step, its rows decode alone."""
        state = self.made_room_for
        if state is not None and any(p.state is state and p.last for p in plan.prefills):
            self.made_room_for = None
            if state.prepared.max_new_tokens > 0:
                plan.first_token_alone = state

    def _no_room_kept_for(self, state: RequestState) -> None:
        """A request that ended before its first token: no later step waits on it (nor keeps it alive)."""
        if self.made_room_for is state:
            self.made_room_for = None

    def _parked_rows(self) -> int:
        return sum(len(state.parked) for state in self.waiting)

    def _forget_parked(self, state: RequestState) -> None:
        """A request that ended leaves the queue with the rows it had parked."""
        state.parked = []
        for index, queued in enumerate(self.waiting):
            if queued is state:
                del self.waiting[index]
                self._dequeued()
                return

    def _requeue(self, state: RequestState) -> None:
        """Back at the queue's front (parked, or planned and not run); not refused when the queue is full."""
        self.waiting.appendleft(state)
        with self._queued_lock:
            self._queued += 1

    def _admit(self, starting: list[RequestState], plan: StepPlan, batch: bool = True) -> RequestState | None:
        """The next request to prefill, taken from the queue (done when it was dropped), or None (also for a batch
        request when `batch` is False)."""
        state = self._head(starting, plan)
        running = len(self.slots.rows) + sum(s.rows_wanted for s in starting)
        if state is None or running + state.rows_wanted > self.max_rows or (is_batch(state) and not batch):
            return None
        self.waiting.remove(state)
        self._dequeued()
        self.turns.started(state)
        state.admitted = next(self._admissions)
        deadline = state.prepared.request.deadline_unix
        if deadline is not None and time.time() > deadline:
            self._drop(state, Error(kind="timeout", message="the request's deadline passed before it could start"),
                       plan)
            return state
        if not state.parked and not state.prefilled:  # a resumed request keeps its first wait
            state.queue_s = time.perf_counter() - state.submitted
        return state

    def _rows_ahead(self, plan: StepPlan) -> int:
        """The rows running, starting and waiting, up to max_rows: the KV cache makes room for them at once,
        one growth of its slot axis for a burst rather than one per few rows joining (kv_cache.py)."""
        rows = len(self.slots.rows)
        for state in itertools.chain({id(p.state): p.state for p in plan.prefills}.values(), self.waiting):
            rows += state.rows_wanted
            if rows >= self.max_rows:
                return self.max_rows
        return rows

    def _take_turns(self, starting: list[RequestState]) -> None:
        """Reorder the waiting queue so that tenants take turns at the free rows (fair_turns.py)."""
        if len(self.waiting) > 1:
            ordered = self.turns.order(self.waiting, self._running(starting))
            self.waiting.clear()
            self.waiting.extend(ordered)

    def _grow_ahead(self, length: int, start: int, plan: StepPlan, allowance: Allowance) -> int:
        """While rows decode, the cache grows layer by layer toward holding a prompt of `length` positions (its
        first decode step included), from its first chunk on: at least a layer a step, as many as fit in half the
        step's allowance (all of it while the prompt waits for them); the positions every layer holds now."""
        cache = self.slots.cache
        if length > cache.capacity and not plan.grow_layers:
            plan.grow = cache.grown(length)
            layer_s = self.pace.growth_s(cache.layer_bytes(plan.grow))
            share = allowance.seconds if start + 1 >= cache.capacity else allowance.seconds / 2
            layers = int(share / layer_s) if share is not None and layer_s > 0 else 1
            plan.grow_layers = max(1, min(layers, sum(held < plan.grow for held in cache.capacities)))
            allowance.reserve(plan.grow_layers * layer_s)
        return cache.capacity

    def _running(self, starting: list[RequestState]) -> Counter[tuple[bool, str]]:
        """Rows each lane (priority, tenant: fair_turns.py) runs, counting those of the requests starting in this
        step."""
        running = Counter(lane_of(row.request) for row in self.slots.rows)
        for state in starting:
            running[lane_of(state)] += state.rows_wanted
        return running

    def _refuse(self, state: RequestState, error: AdapterError, plan: StepPlan) -> None:
        """Its adapter failed to load: it leaves the queue (admission.py has taken it out)."""
        self._dequeued()
        self._drop(state, Error(kind=error.kind, message=error.message, field="adapter",
                                retry_after_s=error.retry_after_s), plan)

    def _drop(self, state: RequestState, error: Error, plan: StepPlan) -> None:
        state.done = True
        self.requests.pop(state.request_id, None)
        plan.dropped.append((state, error))

    def _dequeued(self) -> None:
        with self._queued_lock:
            self._queued -= 1
