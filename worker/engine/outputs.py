"""Events a decode step produces, grouped per request so each sink is called once per step."""

from __future__ import annotations

from worker.engine.sequence import RequestState, Sequence
from worker.protocol import Event, Finish, SamplingParams, Token, TopLogprob


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
            event.top_logprobs = [TopLogprob(t, lp, tokenizer.decode([t])) for t, lp in top]
    if params.token_ids_logprob:  # the model's own distribution; ids outside the vocabulary are skipped
        logprobs = out.logits[position].float().log_softmax(dim=-1)
        event.token_ids_logprobs = [TopLogprob(t, logprobs[t].item(), tokenizer.decode([t]))
                                    for t in params.token_ids_logprob if 0 <= t < logprobs.shape[-1]]
    if params.return_hidden_states and out.hidden is not None:
        event.hidden_state = out.hidden[position].tolist()
    if params.include_output_logits:
        event.logits = out.logits[position].tolist()
    return event


def finish_event(row: Sequence, index: int) -> Finish:
    return Finish(index=index, reason=row.finish or "length", text=row.text, token_ids=list(row.output_ids),
                  seed=row.seed, matched_stop=row.matched_stop, cumulative_logprob=row.cumulative_logprob,
                  incomplete=row.incomplete)
