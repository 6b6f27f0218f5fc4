"""STOCHASTIC and NAIVE_SAMPLING beams on a tiny random model whose sequence probabilities we can
enumerate exactly. Seeds are fixed, so every statistic below is deterministic."""

from __future__ import annotations

import pytest
import torch

from tests.worker.beam.helpers import Collector, request, run_all
from tests.worker.beam.tiny import EOS, sequence_probabilities, tiny_model

PROMPT = [1, 2, 5]
MAX_TOKENS = 3


@pytest.fixture(scope="module")
def tiny():
    return tiny_model()


@pytest.fixture(scope="module")
def tiny_engine(tiny):
    from common.protocol import ModelConfig
    from worker.engine.engine import Engine

    running = Engine(tiny, ModelConfig(max_batch_size=64, max_context=64, max_queue=4096), "tiny-worker")
    running.start()
    yield running
    running.stop()


def chi_square_p_value(observed: list[int], expected: list[float]) -> float:
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64),
                                         torch.tensor(statistic / 2, dtype=torch.float64)))


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_beam_is_a_sample_of_the_sequence_distribution(tiny, tiny_engine, temperature):
    """Over 1500 seeds, how often each full output is the top STOCHASTIC beam matches its model
    probability (chi-square over every output expected at least 5 times, plus one bin for the rest)."""
    runs = 1500
    truth = sequence_probabilities(tiny.model, PROMPT, MAX_TOKENS, temperature)
    assert sum(truth.values()) == pytest.approx(1.0)
    results = run_all(tiny_engine, [request(PROMPT, num_beams=3, n=3, max_tokens=MAX_TOKENS, temperature=temperature,
                                            beam_search_type="STOCHASTIC", seed=[seed]) for seed in range(runs)])
    counts: dict[tuple[int, ...], int] = {}
    for collector in results:
        finishes = sorted(collector.finishes, key=lambda f: f.index)
        assert len(finishes) == 3
        outputs = [tuple(f.token_ids) for f in finishes]
        assert len(set(outputs)) == 3, "the k results are samples without replacement"
        assert all(o in truth for o in outputs)
        for finish in finishes:  # each result reports its own log-probability under the model
            assert finish.cumulative_logprob == pytest.approx(torch.tensor(truth[tuple(finish.token_ids)]).log().item(),
                                                              abs=1e-3)
            assert finish.reason == ("eos_token" if finish.token_ids[-1] == EOS else "length")
        counts[outputs[0]] = counts.get(outputs[0], 0) + 1
    frequent = [s for s, p in truth.items() if p * runs >= 5]
    assert len(frequent) >= 5, "the model should spread its mass over several outputs"
    observed = [counts.get(s, 0) for s in frequent] + [runs - sum(counts.get(s, 0) for s in frequent)]
    expected = [truth[s] * runs for s in frequent] + [runs * (1 - sum(truth[s] for s in frequent))]
    if expected[-1] < 5:  # too little mass left for its own bin
        observed, expected = observed[:-1], expected[:-1]
        observed[-1] += runs - sum(observed)
    assert chi_square_p_value(observed, expected) > 0.001, (observed, expected)


def test_stochastic_results_are_distinct_and_reproducible(tiny_engine):
    params = dict(num_beams=4, n=4, max_tokens=4, beam_search_type="STOCHASTIC")
    first = run_all(tiny_engine, [request(PROMPT, seed=[s], **params) for s in range(20)])
    again = run_all(tiny_engine, [request(PROMPT, seed=[s], **params) for s in range(20)])
    for a, b in zip(first, again):
        outputs = [tuple(f.token_ids) for f in a.finishes]
        assert len(set(outputs)) == 4
        assert outputs == [tuple(f.token_ids) for f in b.finishes]
    assert len({tuple(r.finishes[0].token_ids) for r in first}) > 1, "different seeds, different samples"


def test_naive_sampling_is_reproducible_by_seed(tiny_engine):
    params = dict(num_beams=2, n=2, max_tokens=5, beam_search_type="NAIVE_SAMPLING", temperature=1.5)
    seeds = list(range(12))
    first = run_all(tiny_engine, [request(PROMPT, seed=[s], **params) for s in seeds])
    # the same seeds again, now sharing the batch with other requests
    mixed = [request(PROMPT, seed=[s], **params) for s in seeds] + [
        request(PROMPT, max_tokens=5, temperature=1.0, seed=[99]),
        request(PROMPT, num_beams=2, max_tokens=5, beam_search_type="STOCHASTIC", seed=[5])]
    again = run_all(tiny_engine, mixed)
    for a, b in zip(first, again):
        assert [f.token_ids for f in a.finishes] == [f.token_ids for f in b.finishes]
        assert [f.score for f in a.finishes] == [f.score for f in b.finishes]
        scores = [f.score for f in a.finishes]
        assert scores == sorted(scores, reverse=True), "the n best come best first"
    assert len({tuple(tuple(f.token_ids) for f in r.finishes) for r in first}) > 1


def test_deterministic_matches_transformers_on_a_tiny_vocabulary(tiny, tiny_engine):
    """With 8 tokens and 4 beams the 2k candidates reach into the not-yet-used beams (transformers'
    -1e9 scores) and EOS ends beams early: the same results as transformers all the same."""
    for prompt in ([1, 2, 5], [1, 7, 7, 3], [1, 4]):
        for early in (False, True, "never"):
            [ours] = run_all(tiny_engine, [request(prompt, num_beams=4, n=4, max_tokens=6, early_stopping=early)])
            with torch.inference_mode():
                out = tiny.model.generate(torch.tensor([prompt]),
                                          attention_mask=torch.ones(1, len(prompt), dtype=torch.long),
                                          num_beams=4, num_return_sequences=4, do_sample=False, max_new_tokens=6,
                                          early_stopping=early, return_dict_in_generate=True, output_scores=True)
            expected = []
            for row in out.sequences[:, len(prompt):].tolist():
                expected.append(row[: row.index(EOS) + 1] if EOS in row else row)
            assert [f.token_ids for f in sorted(ours.finishes, key=lambda f: f.index)] == expected
            assert [f.score for f in ours.finishes] == pytest.approx(out.sequences_scores.tolist(), abs=1e-4)


def test_cancel_mid_search(tiny_engine):
    """A cancel that arrives while the beams run: usage for the steps done, no results, rows freed."""
    from common.protocol import Accepted

    class CancelOnAccept(Collector):
        def __call__(self, batch):
            super().__call__(batch)
            if any(isinstance(e, Accepted) for e in batch):  # engine thread: handled before step 2
                tiny_engine.cancel(generate.request_id)

    generate = request(PROMPT, num_beams=4, n=2, max_tokens=20, min_tokens=20)
    sink = CancelOnAccept()
    tiny_engine.submit(tiny_engine.prepare(generate), sink)
    assert sink.finished.wait(60)
    assert sink.finishes == []
    assert sink.done.completion_tokens == 0
    assert 0 < sink.done.compute_tokens < 4 * 20 and sink.done.compute_tokens % 4 == 0
    [after] = run_all(tiny_engine, [request(PROMPT, num_beams=4, n=4, max_tokens=3)])
    assert len(after.finishes) == 4
