"""Events the engine produces: a request's Accepted, each step's (grouped per request so each sink is called
once per step), and a request's last ones."""

from __future__ import annotations

from collections.abc import Iterable

import structlog

from common.protocol import (
    Accepted,
    Done,
    Error,
    Event,
    Finish,
    PromptToken,
    SamplingParams,
    Token,
    ToolCall,
    TopLogprob,
)
from worker.engine.beam_rows import beam_events
from worker.engine.sequence import RequestState, Sequence

log = structlog.get_logger(__name__)


class StepEvents:
    def __init__(self) -> None:
        self._by_request: dict[int, tuple[RequestState, list[Event]]] = {}

    def add(self, state: RequestState, event: Event) -> None:
        self._by_request.setdefault(id(state), (state, []))[1].append(event)

    def replace(self, state: RequestState, events: list[Event]) -> None:
        """This step's events of `state` become `events` (a request that failed alone: only its Error)."""
        self._by_request[id(state)] = (state, list(events))

    def deliver(self) -> None:
        for state, events in self._by_request.values():
            try:
                state.sink(events)
            except Exception:  # its HTTP side is gone (loop closed): the other requests still get theirs
                log.exception("event_delivery_failed", request_id=state.request_id)
        self._by_request.clear()


def token_event(row: Sequence, token: int, delta: str, choice, position: int, out, params: SamplingParams,
                tokenizer, special_ids: frozenset[int]) -> Token:
    """Built in one call, so the protocol's checks (finite floats, floored logprobs) see every field.
    `special_ids`: the tokenizer's `all_special_ids`, which it builds anew on each read."""
    fields = {}
    if params.logprobs is not None:
        fields["logprob"] = choice.logprobs[position]
        fields["piece"] = tokenizer.decode([token])
        top = choice.top_logprobs[position]
        if top is not None:
            fields["top_logprobs"] = with_pieces(top, tokenizer)
    if params.token_ids_logprob:  # the model's own distribution
        logprobs = out.logits[position].float().log_softmax(dim=-1)
        wanted = requested_ids(params.token_ids_logprob, logprobs.shape[-1])
        fields["token_ids_logprobs"] = with_pieces(zip(wanted, logprobs[wanted].tolist()), tokenizer)
    if params.return_hidden_states and out.hidden is not None:
        fields["hidden_state"] = out.hidden[position].tolist()
    if params.include_output_logits:
        fields["logits"] = out.logits[position].tolist()
    return Token(index=row.candidate, token_id=token, text=delta, special=token in special_ids,
                 **fields)


def requested_ids(ids: list[int], vocab: int) -> list[int]:
    """The ids of SamplingParams.token_ids_logprob inside the vocabulary; the others are skipped."""
    return [t for t in ids if 0 <= t < vocab]


def with_pieces(pairs: Iterable[tuple[int, float]], tokenizer) -> list[TopLogprob]:
    """(token id, logprob) pairs as TopLogprob entries, each token decoded on its own."""
    return [TopLogprob(t, lp, tokenizer.decode([t])) for t, lp in pairs]


def finish_event(row: Sequence, index: int) -> Finish:
    reason = row.finish or "length"
    calls = [] if row.call_parser is None else [ToolCall(c.id, c.name, c.arguments) for c in row.call_parser.calls]
    if calls and reason in _ENDED_WELL and not row.call_parser.open:
        reason = "tool_calls"
    return Finish(index=index, reason=reason, text=row.text, token_ids=list(row.output_ids),
                  seed=row.seed, matched_stop=row.matched_stop, cumulative_logprob=row.cumulative_logprob,
                  incomplete=row.incomplete, tool_calls=calls)


_ENDED_WELL = ("eos_token", "stop_token", "stop_sequence")  # with calls made, these end as "tool_calls"


def final_events(state: RequestState, tokenizer, worker_id: str) -> list[Event]:
    """The last events of a request whose rows all finished, or that was cancelled: the Finish events nothing
    streamed yet (the n best candidates of best_of, or the n best beams), then Done with the usage."""
    if state.beam is not None:
        return beam_events(state, tokenizer, worker_id)
    prepared = state.prepared
    events: list[Event] = []
    returned = state.sequences
    if not state.streams_tokens:
        returned = sorted(state.sequences, key=lambda s: s.cumulative_logprob, reverse=True)[: prepared.returned]
        if not state.cancelled:
            events += [finish_event(sequence, index) for index, sequence in enumerate(returned)]
    # rejected prediction tokens are billed as completion tokens, as OpenAI bills them: per sequence at most the
    # prediction's length (what the gateway reserved for them), however often a stretch of it was drafted again
    most = len(prepared.prediction_ids or ())
    rejected = {id(s): min(s.drafter.rejected_prediction, most) for s in state.sequences if s.drafter is not None}
    events.append(Done(prompt_tokens=len(prepared.prompt_ids),
                       completion_tokens=sum(len(s.output_ids) + rejected.get(id(s), 0) for s in returned),
                       compute_tokens=sum(len(s.output_ids) for s in state.sequences) + sum(rejected.values()),
                       worker_id=worker_id, cached_tokens=state.cached_tokens,
                       accepted_prediction_tokens=sum(s.drafter.accepted_prediction for s in returned
                                                      if s.drafter is not None),
                       rejected_prediction_tokens=sum(rejected.get(id(s), 0) for s in returned)))
    return events


def failure_event(state: RequestState) -> Error:
    """The last event of a request that failed alone (RequestState.failure says why)."""
    return Error(kind="internal", message=f"generation failed for this request: {state.failure}")


def accepted_event(state: RequestState, tokenizer, worker_id: str) -> Accepted:
    """The first event of a request whose prompt is prefilled: what the worker made of the prompt."""
    prepared = state.prepared
    prompt_text = None
    if prepared.request.return_prompt_text:
        prompt_text = prepared.request.prompt
        if prompt_text is None:
            prompt_text = tokenizer.decode(prepared.prompt_ids, skip_special_tokens=False)
    return Accepted(len(prepared.prompt_ids), prepared.prompt_ids, prepared.seeds[: prepared.returned],
                    _prompt_details(state, tokenizer), prompt_text, validation_time_s=prepared.validation_s,
                    queue_time_s=state.queue_s, worker_id=worker_id)


def _prompt_details(state: RequestState, tokenizer) -> list[PromptToken] | None:
    prepared = state.prepared
    params = prepared.request.params
    if not params.prompt_logprobs:
        return None
    start = max(1, params.prompt_logprobs_start)
    details = [PromptToken(token, tokenizer.decode([token]), None) for token in prepared.prompt_ids[:start]]
    for i in range(start, len(prepared.prompt_ids)):
        before = i - 1  # the logits of position i-1 predicted token i
        token = prepared.prompt_ids[i]
        details.append(PromptToken(
            token, tokenizer.decode([token]), state.prompt_logprobs[before],
            with_pieces(state.prompt_top[before], tokenizer) if state.prompt_top else None,
            with_pieces(state.prompt_ids_logprobs[before], tokenizer) if state.prompt_ids_logprobs else None))
    return details
