"""One generated sequence (a row of the batch) and the request that owns one or more of them."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from common.protocol import Event, FinishReason, floored_logprob
from worker.decoding.detokenizer import IncrementalDetokenizer
from worker.decoding.finish import finish_reason
from worker.decoding.grammar import GrammarState
from worker.decoding.rows import RowSpec
from worker.decoding.stops import StopMatcher
from worker.engine.drafts import Drafter
from worker.engine.prepare import PreparedRequest
from worker.tools import CallParser


@dataclass
class Sequence:
    request: RequestState
    candidate: int  # 0..candidates-1
    seed: int
    length: int  # positions already in the KV cache
    next_input: int  # token fed at the next decode step
    detokenizer: IncrementalDetokenizer
    stopper: StopMatcher
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    cumulative_logprob: float = 0.0
    finish: FinishReason | None = None
    matched_stop: str | int | None = None
    incomplete: bool = False  # a constrained output that ended before its grammar accepted
    call_parser: CallParser | None = None  # splits the text into content and tool calls when tools may be called
    drafter: Drafter | None = None  # its draft tokens (speculation.py); None: it never drafts (beams, hidden states)

    def take(self, token: int, logprob: float, spec: RowSpec, grammar: GrammarState | None,
             max_context: int) -> tuple[str, list]:
        """The step's token joins the sequence: returns the text it adds (held back while it may begin a stop
        string; tool calls cut out) and the tool calls it completed. Sets `finish` when the sequence ends."""
        self.output_ids.append(token)
        self.cumulative_logprob += floored_logprob(logprob)  # a ruled-out forced token is -inf
        self.next_input = token
        ended = finish_reason(spec, token, len(self.output_ids), max_context, grammar)
        delta = ""
        if ended is None or ended[0] == "length":
            delta, matched = self.stopper.push(self.detokenizer.push(token))
            if matched is not None:
                ended = ("stop_sequence", matched)
        if ended is not None and ended[0] != "stop_sequence":
            tail, matched = self.stopper.push(self.detokenizer.flush())
            delta += tail + ("" if matched else self.stopper.flush())
            if matched is not None:
                ended = ("stop_sequence", matched)
        calls = []
        if self.call_parser is not None:  # text inside a tool call leaves the content
            delta, calls = self.call_parser.push(delta, final=ended is not None)
        self.text += delta
        if ended is not None:
            self.finish, self.matched_stop = ended
            self.incomplete = grammar is not None and not grammar.accepted  # cut before the grammar accepted
        return delta, calls


@dataclass
class RequestState:
    prepared: PreparedRequest
    sink: Callable[[list[Event]], None]  # called on the engine thread with each step's events
    sequences: list[Sequence] = field(default_factory=list)
    prefilled: int = 0  # prompt positions written to the cache so far
    cached_tokens: int = 0  # of those, copied from the prefix cache (prefix_cache.py) instead of computed
    prompt_logprobs: list[float] = field(default_factory=list)  # of prompt tokens 1..L-1
    prompt_top: list[list] = field(default_factory=list)  # per prompt token 1..L-1: [(id, logprob)], top N
    prompt_ids_logprobs: list[list] = field(default_factory=list)  # per token 1..L-1: [(requested id, logprob)]
    last_embed: object = None  # embedding of the last prompt token when embeddings replace ids
    beam: object = None  # BeamSearch (worker/engine/beams.py) when num_beams > 1
    adapter: object = None  # worker.lora.adapter.LoraAdapter once admitted with one
    parked: list = field(default_factory=list)  # slots.Parked rows set aside while preempted, waiting to resume
    set_aside: object = None  # a partly prefilled prompt's cache positions (a tensor) while a newcomer goes first
    admitted: int = 0  # admission order (the newest is preempted first)
    submitted: float = field(default_factory=time.perf_counter)
    queue_s: float = 0.0  # waited before its prefill started
    cancelled: bool = False
    deadline_missed: bool = False
    done: bool = False
    failure: str = ""  # why it failed alone in a step (executor.py, row_faults.py)

    def end(self, failure: str = "") -> None:
        """It ends without a result (it failed alone, or its deadline passed): its rows leave the batch."""
        for sequence in self.sequences:
            sequence.finish = sequence.finish or "error"
        self.failure = failure
        self.done = True

    @property
    def rows_wanted(self) -> int:
        """The rows it takes when it (next) starts: those it has parked, else one per candidate."""
        return len(self.parked) or self.prepared.candidates

    @property
    def request_id(self) -> str:
        return self.prepared.request.request_id

    @property
    def streams_tokens(self) -> bool:
        """best_of > n keeps candidates private until the best are known."""
        return self.prepared.candidates == self.prepared.returned
