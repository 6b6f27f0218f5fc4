"""Green-list watermark: generation with it is detected, plain generation is not."""

from __future__ import annotations

import torch

from common.protocol import Watermark
from tests.worker.decoding.helpers import spec
from worker.decoding import DecodingBatch, watermark_z_score
from worker.decoding.watermark import green_mask, is_green

V = 1000


def test_green_fraction_is_gamma():
    previous = torch.arange(200)
    for gamma in (0.25, 0.5):
        mask = green_mask(previous, V, torch.full((200,), gamma))
        assert abs(mask.float().mean().item() - gamma) < 0.01
        # the list really depends on the previous token
        assert not torch.equal(mask[0], mask[1])
        tokens = torch.randint(0, V, (200,))
        assert torch.equal(is_green(previous, tokens, gamma), mask[torch.arange(200), tokens])


def test_detector_separates_watermarked_from_plain():
    # a toy language model: next-token logits depend on the previous token only
    table = torch.randn(V, V, generator=torch.Generator().manual_seed(0)) * 2
    rows = [spec([5], seed=s, watermark=Watermark(gamma=0.25, delta=2.0)) for s in range(4)]
    rows += [spec([5], seed=10 + s) for s in range(4)]
    batch = DecodingBatch(V)
    for r in rows:
        batch.add(r)
    for _ in range(150):
        previous = torch.tensor([batch.history(i)[-1] for i in range(len(rows))])
        choice = batch.choose(batch.process(table[previous]))
        batch.append(choice.tokens)
    z = [watermark_z_score(batch.history(i)[1:], V, gamma=0.25, context=5) for i in range(len(rows))]
    assert all(score > 4 for score in z[:4]), z
    assert all(abs(score) < 3 for score in z[4:]), z


def test_greedy_rows_are_watermarked_too():
    logits = torch.zeros(1, V)
    batch = DecodingBatch(V)
    batch.add(spec([7], temperature=0.0, watermark=Watermark(gamma=0.5, delta=1.0)))
    token = batch.choose(batch.process(logits)).token_ids[0]
    assert is_green(torch.tensor([7]), torch.tensor([token]), 0.5).item()
