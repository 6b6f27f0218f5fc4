"""Candidate selection for one beam request: pure tensor functions, one per beam search type.

Every function looks at the k beams of one request at once: `logprobs` is [k, V] (each beam's
processed, normalised next-token log-probabilities) and returns candidates as flat indices into
k * V, so `index // V` is the parent beam and `index % V` the token.
"""

from __future__ import annotations

import torch

DEAD = -1.0e9  # transformers' score for an unused beam: finite, so arithmetic on it stays finite


def accumulate(logprobs: torch.Tensor, running: torch.Tensor) -> torch.Tensor:
    """[k, V] step log-probabilities + [k] running scores -> [k * V] candidate scores."""
    return (logprobs + running[:, None]).reshape(-1)


def top_candidates(scores: torch.Tensor, count: int) -> tuple[torch.Tensor, torch.Tensor]:
    """DETERMINISTIC: the `count` best candidates, best first (ties as torch.topk orders them)."""
    values, index = torch.topk(scores, count)
    return values, index


def gumbel(shape, generator: torch.Generator, device) -> torch.Tensor:
    """Standard Gumbel noise from a CPU generator (so a seed gives the same draws on any device)."""
    uniform = torch.rand(shape, generator=generator, dtype=torch.float64)
    return (-torch.log(-torch.log(uniform))).to(device=device, dtype=torch.float32)


def sampled_candidates(scores: torch.Tensor, count: int, generator: torch.Generator
                       ) -> tuple[torch.Tensor, torch.Tensor]:
    """NAIVE_SAMPLING: `count` candidates drawn without replacement from softmax(scores), as
    transformers' beam sample does with `multinomial`; Gumbel-top-k is the same distribution and
    never fails when fewer than `count` candidates have mass. Returned best score first."""
    count = min(count, scores.numel())
    keys = scores + gumbel(scores.shape, generator, scores.device)
    index = torch.topk(keys, count).indices
    values = scores[index]
    order = torch.argsort(values, descending=True, stable=True)
    return values[order], index[order]


def _log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, accurate near 0 and for very negative x (Maechler 2012)."""
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def conditioned_gumbel(children: torch.Tensor, parent_keys: torch.Tensor, generator: torch.Generator
                       ) -> torch.Tensor:
    """Kool et al. 2019, eq. (10) and appendix B: perturb each child's log-probability `children`
    [k, V] with Gumbel noise, then shift every beam's children so their maximum equals the parent's
    own perturbed key `parent_keys` [k] (the truncated Gumbel). Dead parents give -inf."""
    perturbed = children + gumbel(children.shape, generator, children.device)
    top = perturbed.amax(dim=-1, keepdim=True)
    target = parent_keys[:, None]
    with torch.no_grad():
        v = target - perturbed + _log1mexp(perturbed - top)
        keys = target - v.clamp(min=0) - torch.log1p(torch.exp(-v.abs()))
    alive = torch.isfinite(perturbed) & torch.isfinite(top) & torch.isfinite(target)
    return torch.where(alive, keys, torch.full_like(keys, -float("inf")))


def stochastic_candidates(logprobs: torch.Tensor, cumulative: torch.Tensor, keys: torch.Tensor, count: int,
                          generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """STOCHASTIC: the `count` children with the largest conditioned Gumbel keys.

    Returns (keys, cumulative log-probabilities, flat indices) of those children, best key first."""
    children = logprobs + cumulative[:, None]
    child_keys = conditioned_gumbel(children, keys, generator).reshape(-1)
    count = min(count, child_keys.numel())
    top_keys, index = torch.topk(child_keys, count)
    return top_keys, children.reshape(-1)[index], index


def length_normalised(score: float | torch.Tensor, generated: int, length_penalty: float):
    """transformers' finished-hypothesis score: sum of log-probabilities / length ** length_penalty."""
    return score / (generated ** length_penalty)
