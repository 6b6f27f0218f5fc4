"""The pure selection functions, checked against their definitions with fixed generators."""

from __future__ import annotations

import math

import torch

from worker.decoding.beam_select import (
    DEAD,
    accumulate,
    conditioned_gumbel,
    sampled_candidates,
    stochastic_candidates,
    top_candidates,
)


def test_accumulate_and_top_candidates_rank_beam_plus_token():
    logprobs = torch.log_softmax(torch.tensor([[1.0, 3.0, 0.0], [2.0, 2.5, 0.5]]), dim=-1)
    running = torch.tensor([0.0, -0.1])
    scores = accumulate(logprobs, running)
    values, index = top_candidates(scores, 4)
    expected = sorted(((float(logprobs[b, t] + running[b]), b * 3 + t) for b in range(2) for t in range(3)),
                      reverse=True)[:4]
    assert index.tolist() == [i for _, i in expected]
    assert values.tolist() == [v for v, _ in expected]


def test_sampling_without_replacement_follows_softmax():
    """The first of the sampled candidates is a plain draw from softmax(scores)."""
    scores = torch.log(torch.tensor([0.5, 0.25, 0.15, 0.1, 0.0]))
    generator = torch.Generator().manual_seed(0)
    counts = torch.zeros(5)
    draws = 4000
    for _ in range(draws):
        values, index = sampled_candidates(scores, 3, generator)
        assert len(set(index.tolist())) == 3, "without replacement"
        assert 4 not in index.tolist(), "a candidate without mass is never drawn while others are left"
        assert values.tolist() == sorted(values.tolist(), reverse=True)
        keys = scores[index]
        first = index[torch.argmax(keys)]  # the best of the sample has the highest score
        counts[first] += 1
    # the best-scoring of three draws without replacement is token 0 unless none of the 3 draws is 0
    p = [0.5, 0.25, 0.15, 0.1]
    miss_zero = sum(p[a] * p[b] / (1 - p[a]) * p[c] / (1 - p[a] - p[b])
                    for a in range(1, 4) for b in range(1, 4) for c in range(1, 4) if len({a, b, c}) == 3)
    assert abs(counts[0] / draws - (1 - miss_zero)) < 0.02


def test_sampling_reproducible_by_generator():
    scores = torch.randn(40, generator=torch.Generator().manual_seed(1))
    a = sampled_candidates(scores, 6, torch.Generator().manual_seed(5))
    b = sampled_candidates(scores, 6, torch.Generator().manual_seed(5))
    assert torch.equal(a[1], b[1])


def test_conditioned_gumbel_max_equals_parent_key():
    generator = torch.Generator().manual_seed(3)
    children = (torch.log_softmax(torch.randn(3, 10, generator=generator), dim=-1)
                + torch.tensor([[0.0], [-1.0], [-2.0]]))
    children[1, 4] = -float("inf")  # a banned token
    parents = torch.tensor([0.3, -0.7, -float("inf")])  # the last parent is dead
    keys = conditioned_gumbel(children, parents, generator)
    assert torch.allclose(keys[:2].amax(dim=-1), parents[:2], atol=1e-6)
    assert torch.all(keys[:2] <= parents[:2, None] + 1e-6)
    assert keys[1, 4] == -float("inf")
    assert torch.all(keys[2] == -float("inf"))


def test_stochastic_first_step_is_gumbel_max_sampling():
    """From the root (key 0), the child with the largest key is a draw from the step distribution."""
    probs = torch.tensor([0.6, 0.3, 0.1])
    logprobs = probs.log()[None, :]
    generator = torch.Generator().manual_seed(11)
    counts = [0, 0, 0]
    draws = 3000
    for _ in range(draws):
        keys, cumulative, index = stochastic_candidates(logprobs, torch.tensor([0.0]), torch.tensor([0.0]), 2,
                                                        generator)
        assert keys[0] == 0.0 or math.isclose(float(keys[0]), 0.0, abs_tol=1e-6)
        assert torch.allclose(cumulative, logprobs[0, index])
        counts[int(index[0])] += 1
    statistic = sum((c - p * draws) ** 2 / (p * draws) for c, p in zip(counts, probs.tolist()))
    assert statistic < 13.8  # chi-square, 2 degrees of freedom, p = 0.001


def test_dead_score_is_exact_in_float32():
    assert torch.tensor(DEAD, dtype=torch.float32).item() == DEAD
