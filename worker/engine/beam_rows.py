"""Where beam requests meet the batch: their rows run in the same forward as every other row, and
after each step only their own rows are rewritten (decoding state and KV cache) by parent index.

Normalisation (see README_beam.md): by default the logits processors see raw logits and each beam
row is log-softmaxed afterwards; `beam_compat_pre_normalization` log-softmaxes before the
processors (as transformers does), and `beam_compat_no_post_normalization` then skips the second
log-softmax, which together reproduce transformers' scores exactly.
"""

from __future__ import annotations

import msgspec
import structlog
import torch

from common.protocol import Done, Event, Finish, SamplingParams
from worker.decoding.batch import DecodingBatch
from worker.decoding.detokenizer import IncrementalDetokenizer
from worker.engine.beams import BeamSearch
from worker.engine.kv_cache import KVCache
from worker.engine.sequence import RequestState, Sequence

log = structlog.get_logger(__name__)


def new_beam_search(state: RequestState) -> BeamSearch | None:
    prepared = state.prepared
    params = prepared.request.params
    if params.num_beams <= 1:
        return None
    return BeamSearch(params, params.num_beams, prepared.max_new_tokens, prepared.eos_token_ids, prepared.seeds[0])


def row_params(params: SamplingParams) -> SamplingParams:
    """What the decoding batch applies to a beam row: DETERMINISTIC never warps (temperature and the
    like apply only when sampling, as in transformers), so its rows are greedy rows there."""
    if params.num_beams > 1 and params.beam_search_type == "DETERMINISTIC":
        return msgspec.structs.replace(params, temperature=0.0)
    return params


def _blocks(rows: list[Sequence], skip: set[int]) -> list[tuple[BeamSearch, list[int]]]:
    """Each beam request with its row positions in slot order (rows move when others leave), but the
    requests whose id() is in `skip`."""
    found: dict[int, tuple[BeamSearch, list[int | None]]] = {}
    for position, row in enumerate(rows):
        beam = row.request.beam
        if beam is not None and id(row.request) not in skip:
            found.setdefault(id(beam), (beam, [None] * beam.k))[1][row.candidate] = position
    return list(found.values())


def prenormalize(rows: list[Sequence], logits: torch.Tensor) -> torch.Tensor:
    """Log-softmax the raw logits of the beam rows that ask for pre-normalisation."""
    picked = [i for i, row in enumerate(rows) if row.request.beam is not None and row.request.beam.pre_normalization]
    if not picked:
        return logits
    index = torch.tensor(picked, device=logits.device)
    logits = logits.clone()
    logits[index] = torch.log_softmax(logits[index], dim=-1)
    return logits


def step_beams(rows: list[Sequence], scores: torch.Tensor, batch: DecodingBatch, cache: KVCache,
               tokens: torch.Tensor, skip: set[int] = frozenset()) -> list[tuple[RequestState, str]]:
    """Advance every beam request by one step: choose its beams, move its rows, and write each
    beam row's new token into `tokens` (the step's tokens, in row order) before they are appended.
    Requests in `skip` (by id()) stay where they are; those whose beam step fails are returned with
    the reason, untouched too, for the engine to fail them alone."""
    order = list(range(len(rows)))
    targets, sources, start, end = [], [], None, 0
    positions_all, tokens_all = [], []
    failed = []
    for beam, positions in _blocks(rows, skip):
        block = scores[torch.tensor(positions, device=scores.device)]
        if beam.post_normalization:
            block = torch.log_softmax(block, dim=-1)
        try:
            result = beam.step(block)
        except Exception as exc:  # this request's beam state is broken; the others are not
            log.exception("beam_step_failed")
            failed.append((rows[positions[0]].request, f"its beam step failed ({type(exc).__name__})"))
            continue
        moved = [j for j in range(beam.k) if result.parents[j] != j]
        if moved:
            for j in moved:
                order[positions[j]] = positions[result.parents[j]]
                targets.append(positions[j])
                sources.append(positions[result.parents[j]])
            first = rows[positions[0]]
            # positions before prompt + shared tokens hold the same keys in a moved row and its parent
            shared = len(first.request.prepared.prompt_ids) + result.shared
            start = shared if start is None else min(start, shared)
            end = max(end, first.length + 1)
        for j, position in enumerate(positions):
            rows[position].next_input = result.tokens[j]
            if beam.done:
                rows[position].finish = "length"  # the rows leave; the results come from the beam state
        positions_all += positions
        tokens_all += result.tokens
    if targets:
        # one copy for all requests: outside a request's own window the copied keys are either equal
        # (its shared prefix) or past its length (never read), so the widest window is safe
        cache.copy_rows(targets, sources, start, end)
        batch.reorder(order)
    if positions_all:
        tokens[torch.tensor(positions_all, device=tokens.device)] = torch.tensor(tokens_all, device=tokens.device)
    return failed


def beam_events(state: RequestState, tokenizer, worker_id: str) -> list[Event]:
    """The n best finished beams as Finish events, then the usage (every beam row's tokens)."""
    prepared = state.prepared
    beam: BeamSearch = state.beam
    events: list[Event] = []
    completion = 0
    if not state.cancelled:
        params = prepared.request.params
        for index, hypothesis in enumerate(beam.results(prepared.returned)):
            shown = hypothesis.tokens
            if hypothesis.reason in ("eos_token", "stop_token"):
                shown = shown[:-1]  # the end token has no text, as for ordinary rows
            detokenizer = IncrementalDetokenizer(tokenizer, prepared.prompt_ids, params.skip_special_tokens)
            text = "".join(detokenizer.push(t) for t in shown) + detokenizer.flush()
            events.append(Finish(index=index, reason=hypothesis.reason, text=text, token_ids=list(hypothesis.tokens),
                                 seed=prepared.seeds[0], matched_stop=hypothesis.matched_stop,
                                 cumulative_logprob=hypothesis.cumulative, score=hypothesis.score))
            completion += len(hypothesis.tokens)
    events.append(Done(prompt_tokens=len(prepared.prompt_ids), completion_tokens=completion,
                       compute_tokens=beam.compute_tokens, worker_id=worker_id, cached_tokens=state.cached_tokens))
    return events
