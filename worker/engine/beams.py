"""The state of one beam search request: running beams, finished hypotheses, the stopping rule.

A request with `num_beams = k` owns k rows of the batch; beam slot j is the row whose Sequence has
`candidate == j`. Each step `BeamSearch.step` receives the [k, V] normalised log-probabilities of
those rows and answers, for every slot, the slot it continues from (its parent) and its new token;
the engine then rewrites the rows (decoding state and KV cache) accordingly.

DETERMINISTIC and NAIVE_SAMPLING follow transformers' beam search (5.x `_beam_search`):
`max(2, 1 + number of end tokens) * k` candidates per step, candidates ending in an end token or at
the length limit leave for a bounded set of k finished hypotheses scored `sum / length **
length_penalty` (only those ranked among the first k may enter), the k best others keep running, and
`early_stopping` (True / False / "never") decides when no running beam can still win.

STOCHASTIC is stochastic beam search (Kool, Hoogeboom & Welling 2019): every child gets a Gumbel
key conditioned on its parent's, the k largest keys among the children and the finished leaves
survive, and the search ends once all k survivors are finished; the result is k sequences sampled
without replacement, the first being an exact sample of the model's sequence distribution.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from common.protocol import FinishReason, SamplingParams
from worker.decoding.beam_select import (
    DEAD,
    accumulate,
    length_normalised,
    sampled_candidates,
    stochastic_candidates,
    top_candidates,
)


@dataclass
class Hypothesis:
    tokens: list[int]
    cumulative: float  # sum of the step log-probabilities the search ranked with
    score: float  # length-normalised
    key: float  # what the results are ordered by: the score, or the Gumbel key (STOCHASTIC)
    reason: FinishReason
    matched_stop: int | None = None


@dataclass
class StepResult:
    parents: list[int]  # slot j continues from slot parents[j]
    tokens: list[int]  # slot j's new token
    shared: int  # generated tokens every moved slot already shared with its parent (KV to keep)


def _common_prefix(a: list[int], b: list[int]) -> int:
    size = min(len(a), len(b))
    for i in range(size):
        if a[i] != b[i]:
            return i
    return size


class BeamSearch:
    def __init__(self, params: SamplingParams, beams: int, max_new_tokens: int, eos_ids: list[int], seed: int):
        self.kind = params.beam_search_type
        self.k = beams
        self.max_new = max_new_tokens
        self.eos = set(eos_ids)
        self.stop_ids = set(params.stop_token_ids)
        self.length_penalty = params.length_penalty
        self.early_stopping = params.early_stopping
        self.pre_normalization = params.beam_compat_pre_normalization
        self.post_normalization = not (params.beam_compat_pre_normalization
                                       and params.beam_compat_no_post_normalization)
        self.width = max(2, 1 + len(self.eos | self.stop_ids)) * beams
        self.generator = torch.Generator().manual_seed(seed)
        # slot 0 alone at first: the k rows hold the same prompt, so only one may expand
        self.running = torch.full((beams,), DEAD)
        self.running[0] = 0.0
        if self.kind == "STOCHASTIC":  # cumulative log-probs and Gumbel keys; dead slots are -inf
            self.running.fill_(-float("inf"))
            self.running[0] = 0.0
            self.keys = self.running.clone()
        self.tokens: list[list[int]] = [[] for _ in range(beams)]
        self.finished: list[Hypothesis] = []
        self.open = True  # transformers' "early-stop heuristic unsatisfied"
        self.generated = 0
        self.done = False

    @property
    def compute_tokens(self) -> int:
        return self.generated * self.k

    def _ends(self, token: int, length: int) -> tuple[FinishReason, int | None] | None:
        if token in self.eos:
            return "eos_token", None
        if token in self.stop_ids:
            return "stop_token", token
        if length >= self.max_new:
            return "length", None
        return None

    def step(self, logprobs: torch.Tensor) -> StepResult:
        """One step from the [k, V] log-probabilities of the slots (in slot order)."""
        if self.kind == "STOCHASTIC":
            result = self._step_stochastic(logprobs)
        else:
            result = self._step_beam(logprobs)
        return result

    def _step_beam(self, logprobs: torch.Tensor) -> StepResult:
        vocab = logprobs.shape[1]
        scores = accumulate(logprobs, self.running)
        if self.kind == "NAIVE_SAMPLING":
            values, index = sampled_candidates(scores, self.width, self.generator)
        else:
            values, index = top_candidates(scores, self.width)
        parents, tokens = (index // vocab).tolist(), (index % vocab).tolist()
        length = self.generated + 1
        ends = [self._ends(t, length) for t in tokens]
        hits = torch.tensor([e is not None for e in ends])
        # finished candidates among the first k may enter the finished set (transformers' rule)
        full = len(self.finished) >= self.k
        if self.open and not (full and self.early_stopping is True):
            normalised = length_normalised(values[: self.k], length, self.length_penalty).tolist()
            for j in range(min(self.k, len(tokens))):
                if ends[j] is not None and normalised[j] > DEAD:
                    self._finish(Hypothesis(self.tokens[parents[j]] + [tokens[j]], float(values[j]),
                                            normalised[j], normalised[j], *ends[j]))
        # the k best candidates that did not finish keep running
        penalised = values + hits.to(values.dtype) * DEAD
        keep = torch.topk(penalised, self.k).indices.tolist()
        self.running = penalised[keep]
        result = self._move([parents[i] for i in keep], [tokens[i] for i in keep])
        self.generated = length
        self._check_open()
        exists_open = not (len(self.finished) >= self.k and self.early_stopping is True)
        self.done = not (self.open and exists_open and not bool(hits.all()))
        return result

    def _finish(self, hypothesis: Hypothesis) -> None:
        """Bounded to k, best first; a newcomer enters only if it beats the worst kept."""
        self.finished.append(hypothesis)
        self.finished.sort(key=lambda h: h.key, reverse=True)
        del self.finished[self.k:]

    def _check_open(self) -> None:
        """Can the best running beam still beat the worst finished hypothesis? (transformers' heuristic:
        the best running score at the current length, or at the maximum length for "never" with a
        positive length penalty)."""
        if self.early_stopping == "never" and self.length_penalty > 0.0:
            best_length = self.max_new
        else:
            best_length = self.generated
        best = self.running[:1] / (best_length ** self.length_penalty)
        full = len(self.finished) >= self.k
        worst = min(h.score for h in self.finished) if full else DEAD
        self.open = self.open and bool((best > worst).any())

    def _step_stochastic(self, logprobs: torch.Tensor) -> StepResult:
        vocab = logprobs.shape[1]
        keys, cumulative, index = stochastic_candidates(logprobs, self.running, self.keys, self.k, self.generator)
        length = self.generated + 1
        pool: list[tuple[float, int, Hypothesis | None]] = [(h.key, -1, h) for h in self.finished]
        for i, key in enumerate(keys.tolist()):
            if key > -float("inf"):
                pool.append((key, i, None))
        pool.sort(key=lambda item: item[0], reverse=True)
        finished, running = [], []
        for key, i, hypothesis in pool[: self.k]:
            if hypothesis is not None:
                finished.append(hypothesis)
                continue
            parent, token = int(index[i]) // vocab, int(index[i]) % vocab
            ended = self._ends(token, length)
            cum = float(cumulative[i])
            if ended is None:
                running.append((parent, token, cum, key))
            else:
                tokens = self.tokens[parent] + [token]
                score = float(length_normalised(cum, length, self.length_penalty))
                finished.append(Hypothesis(tokens, cum, score, key, *ended))
        self.finished = finished
        parents = [p for p, _, _, _ in running]
        new_tokens = [t for _, t, _, _ in running]
        # dead slots keep their row (parent = itself, any token) with -inf scores
        dead = list(range(len(running), self.k))
        self.running = torch.tensor([c for _, _, c, _ in running] + [-float("inf")] * len(dead))
        self.keys = torch.tensor([g for _, _, _, g in running] + [-float("inf")] * len(dead))
        result = self._move(parents + dead, new_tokens + [0] * len(dead))
        self.generated = length
        self.done = not running
        return result

    def _move(self, parents: list[int], tokens: list[int]) -> StepResult:
        moved = [j for j in range(self.k) if parents[j] != j]
        shared = min((_common_prefix(self.tokens[j], self.tokens[parents[j]]) for j in moved), default=0)
        self.tokens = [self.tokens[p] + [t] for p, t in zip(parents, tokens)]
        return StepResult(parents, tokens, shared)

    def results(self, count: int) -> list[Hypothesis]:
        """The `count` best finished hypotheses (running beams fill in only if too few finished)."""
        ranked = list(self.finished)
        if len(ranked) < count:
            alive = [j for j in range(self.k) if bool(torch.isfinite(self.running[j])) and self.running[j] > DEAD]
            for j in alive[: count - len(ranked)]:
                cum = float(self.running[j])
                score = float(length_normalised(cum, max(len(self.tokens[j]), 1), self.length_penalty))
                ranked.append(Hypothesis(self.tokens[j], cum, score, score, "length"))
        return ranked[:count]
