"""The token choice's row reductions in C (worker/engine/native/logit_stats.c) against torch's: the first maximum
exactly, logsumexp within float roundings, the same special values, and a row's results alone equal to its
results in any batch."""

from __future__ import annotations

import math

import pytest
import torch

from worker.decoding import logit_stats
from worker.decoding.logit_stats import argmax_and_logsumexp, use_native
from worker.engine.native.build import NativeUnavailable, load_library

INF, NAN = float("inf"), float("nan")


@pytest.fixture
def native(monkeypatch):
    try:
        library = load_library()
    except NativeUnavailable as error:
        pytest.skip(str(error))
    monkeypatch.setattr(logit_stats, "_native", None)  # restored after the test
    use_native(library)
    assert logit_stats._native is not None


def _torchs(scores: torch.Tensor, logprob_scores: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    return scores.argmax(dim=-1).tolist(), torch.logsumexp(logprob_scores, dim=-1)


def _same_lse(got: torch.Tensor, want: torch.Tensor) -> bool:
    for g, w in zip(got.tolist(), want.tolist()):
        if math.isnan(w) or math.isinf(w):
            if not (math.isnan(g) and math.isnan(w) or g == w):
                return False
        elif abs(g - w) > 2e-6 * max(1.0, abs(w)):
            return False
    return True


@pytest.mark.parametrize("vocab", [4, 5, 16, 17, 49_153, 262_144])
def test_the_c_reductions_equal_torchs_on_ties_special_values_and_any_width(native, vocab):
    generator = torch.Generator().manual_seed(vocab)
    rows = (torch.randn(12, vocab, generator=generator) * 8).round(decimals=0)  # many ties at the maximum
    rows[1, vocab // 2] = NAN  # the first NaN is the maximum; logsumexp NaN
    rows[2] = -INF  # every token ruled out: index 0, logsumexp -inf
    rows[3, vocab - 1] = INF  # +inf wins, logsumexp +inf
    rows[4, ::3] = -INF  # banned tokens beside live ones
    rows[5, -1] = NAN
    rows[5, 0] = INF
    rows[6] = rows[6] * 1e-3 + 80  # large logits: the shift keeps e^x finite
    rows[7, : vocab // 2] = -INF  # the maximum in the second half
    for scores, logprob_scores in ((rows, rows), (rows[3:9], rows[3:9]), (rows, rows.flip(0).contiguous())):
        best, lse = argmax_and_logsumexp(scores, logprob_scores)
        want_best, want_lse = _torchs(scores, logprob_scores)
        assert best.dtype == torch.long and best.tolist() == want_best
        assert _same_lse(lse, want_lse), (lse, want_lse)


def test_a_row_alone_gets_the_bits_it_gets_in_a_batch(native):
    batch = torch.randn(16, 262_144, generator=torch.Generator().manual_seed(7)) * 5
    best, lse = argmax_and_logsumexp(batch, batch)
    for i in (0, 7, 15):
        alone_best, alone_lse = argmax_and_logsumexp(batch[i:i + 1], batch[i:i + 1].clone())
        assert alone_best.tolist() == best[i:i + 1].tolist() and alone_lse.tolist() == lse[i:i + 1].tolist()


def test_what_the_c_pass_does_not_take_goes_to_torch(native):
    """Rows apart in memory, other dtypes, mismatched shapes: torch's reductions, with the same answers."""
    base = torch.randn(4, 64, generator=torch.Generator().manual_seed(3))
    for scores, logprob_scores in ((base[:, ::2], base[:, ::2]), (base.double(), base.double()),
                                   (base, base[:, :32].repeat(1, 2)[:, :64].t().contiguous().t())):
        best, lse = argmax_and_logsumexp(scores, logprob_scores)
        want_best, want_lse = _torchs(scores, logprob_scores)
        assert best.tolist() == want_best and torch.allclose(lse.double(), want_lse.double())


def test_without_the_library_torch_reduces(monkeypatch):
    monkeypatch.setattr(logit_stats, "_native", None)  # a runner other than q4's never hands it over
    scores = torch.tensor([[0.0, 2.0, 2.0, -INF], [NAN, 1.0, 0.0, 0.0]])
    best, lse = argmax_and_logsumexp(scores, scores)
    assert best.tolist() == [1, 0] and _same_lse(lse, torch.logsumexp(scores, dim=-1))
