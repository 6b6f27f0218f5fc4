"""Events a decode step produces, grouped per request so each sink is called once per step."""

from __future__ import annotations

from collections.abc import Iterable

from worker.engine.sequence import RequestState, Sequence
from common.protocol import Event, Finish, SamplingParams, Token, ToolCall, TopLogprob


class StepEvents:
    def __init__(self) -> None:
        self._by_request: dict[int, tuple[RequestState, list[Event]]] = {}

    def add(self, state: RequestState, event: Event) -> None:
        self._by_request.setdefault(id(state), (state, []))[1].append(event)

    def deliver(self) -> None:
        for state, events in self._by_request.values():
            state.sink(events)
        self._by_request.clear()


def token_event(row: Sequence, token: int, delta: str, choice, position: int, out, params: SamplingParams,
                tokenizer) -> Token:
    event = Token(index=row.candidate, token_id=token, text=delta,
                  special=token in tokenizer.all_special_ids)
    if params.logprobs is not None:
        event.logprob = choice.logprobs[position]
        event.piece = tokenizer.decode([token])
        top = choice.top_logprobs[position]
        if top is not None:
            event.top_logprobs = with_pieces(top, tokenizer)
    if params.token_ids_logprob:  # the model's own distribution
        logprobs = out.logits[position].float().log_softmax(dim=-1)
        wanted = requested_ids(params.token_ids_logprob, logprobs.shape[-1])
        event.token_ids_logprobs = with_pieces(zip(wanted, logprobs[wanted].tolist()), tokenizer)
    if params.return_hidden_states and out.hidden is not None:
        event.hidden_state = out.hidden[position].tolist()
    if params.include_output_logits:
        event.logits = out.logits[position].tolist()
    return event


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
