"""Every beam search rule of `prepare`: a clear 422-kind RequestRejected naming the field, whatever the
dialect; and what stays allowed."""

from __future__ import annotations

import pytest

from common.protocol import Constraint, GenerateRequest, SamplingParams
from tests.worker.beam.helpers import request
from tests.worker.beam.tiny import tiny_model
from worker.engine.prepare import RequestRejected

PROMPT = [1, 2, 5]


@pytest.fixture(scope="module")
def engine():
    from common.protocol import ModelConfig
    from worker.engine.engine import Engine

    return Engine(tiny_model(), ModelConfig(max_batch_size=8, max_context=64))  # prepare needs no thread


REFUSED = [
    ("zero beams", dict(num_beams=0), "num_beams"),
    ("too many beams", dict(num_beams=32), "num_beams"),
    ("more beams than rows", dict(num_beams=9), "num_beams"),
    ("n above num_beams", dict(num_beams=2, n=3), "n"),
    ("best_of with beams", dict(num_beams=3, n=1, best_of=3), "best_of"),
    ("stop strings", dict(num_beams=2, stop=["red"]), "stop"),
    ("a seed per beam", dict(num_beams=2, seed=[1, 2]), "seed"),
    ("deterministic top_k", dict(num_beams=2, top_k=5), "top_k"),
    ("deterministic top_p", dict(num_beams=2, top_p=0.9), "top_p"),
    ("naive without temperature", dict(num_beams=2, beam_search_type="NAIVE_SAMPLING", temperature=0.0),
     "temperature"),
    ("stochastic without temperature", dict(num_beams=2, beam_search_type="STOCHASTIC", temperature=0.0),
     "temperature"),
    ("no post without pre", dict(num_beams=2, beam_compat_no_post_normalization=True),
     "beam_compat_no_post_normalization"),
    ("no post without pre, no beams", dict(beam_compat_no_post_normalization=True),
     "beam_compat_no_post_normalization"),
    ("structured output", dict(num_beams=2, constraint=Constraint("regex", "red+")), "response_format"),
]


@pytest.mark.parametrize("name,params,field", REFUSED, ids=[r[0] for r in REFUSED])
def test_refused(engine, name, params, field):
    with pytest.raises(RequestRejected) as caught:
        engine.prepare(request(PROMPT, max_tokens=4, **params))
    assert caught.value.kind == "validation"
    assert caught.value.field == field
    assert caught.value.message


def test_streaming_beams_refused(engine):
    streamed = GenerateRequest(request_id="s", model="m", prompt_ids=PROMPT, stream=True,
                               params=SamplingParams(num_beams=3, max_tokens=4))
    with pytest.raises(RequestRejected) as caught:
        engine.prepare(streamed)
    assert (caught.value.kind, caught.value.field) == ("validation", "stream")
    plain = GenerateRequest(request_id="s", model="m", prompt_ids=PROMPT, stream=True,
                            params=SamplingParams(max_tokens=4))
    assert engine.prepare(plain).candidates == 1


ALLOWED = [
    dict(num_beams=8, n=8),  # as many beams as the worker has rows
    dict(num_beams=4, beam_search_type="STOCHASTIC", top_k=3, top_p=0.9, temperature=0.5),
    dict(num_beams=4, beam_search_type="NAIVE_SAMPLING", top_k=3),
    dict(num_beams=2, beam_compat_pre_normalization=True),
    dict(num_beams=2, beam_compat_pre_normalization=True, beam_compat_no_post_normalization=True),
    dict(num_beams=2, seed=[7], n=2),
    dict(num_beams=1, stop=["red"], top_k=5),  # no beam search: no beam rules
]


@pytest.mark.parametrize("params", ALLOWED)
def test_allowed(engine, params):
    prepared = engine.prepare(request(PROMPT, **{"max_tokens": 4, **params}))
    assert prepared.candidates == params["num_beams"]
    if params["num_beams"] > 1:
        assert len(set(prepared.seeds)) == 1, "one search, one seed"
        if params.get("seed"):
            assert prepared.seeds[0] == params["seed"][0]
