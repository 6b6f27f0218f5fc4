"""The schemathesis 502 of #19, through a real worker: a request whose numbers break float32 arithmetic
is refused with a 422 naming the field, and every event a valid request produces decodes on the gateway.

The cause: a repetition penalty every dialect accepted (> 0) that is 0 in float32 (1e-300, 5e-324)
divides the logits into NaN; the NaN cumulative logprob went out as `null` in a `float` field and the
gateway's `decode_event` raised ValidationError at the Finish event, after tokens had been relayed.
"""

from __future__ import annotations

import math
import time

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from common.protocol import (
    LOGPROB_FLOOR,
    Constraint,
    Error,
    Finish,
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    Token,
    Watermark,
    decode_event,
)
from tests.worker.engine.runs import generate, request
from worker.engine.prepare import RequestRejected
from worker.server import create_worker_app

PROMPT = "The capital of France is"


@pytest.fixture(scope="module")
def app(engine):
    info = ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none", max_context=2048,
                     max_rows=16, vocab_size=engine.vocab_size, eos_token_ids=engine.model_eos)
    return create_worker_app(engine, info)


async def post(app, **params) -> tuple[int, list]:
    body = msgspec.json.encode(GenerateRequest(request_id=f"bounds-{time.time_ns()}", model="smol", prompt=PROMPT,
                                               params=SamplingParams(max_tokens=4, **params)))
    async with AsyncTestClient(app=app) as client:
        response = await client.post("/generate", content=body, headers={"content-type": "application/json"})
    if response.status_code != 200:
        return response.status_code, [response.json()]
    return 200, [decode_event(line.encode()) for line in response.text.splitlines() if line]  # the gateway's decoder


@pytest.mark.parametrize("penalty", [1e-300, 5e-324])
async def test_the_19_reproduction_is_a_422_not_an_undecodable_stream(app, penalty):
    status, body = await post(app, repetition_penalty=penalty, temperature=0.0)
    assert status == 422 and body[0]["field"] == "repetition_penalty"


async def test_ruled_out_tokens_in_top_logprobs_decode_as_the_floor(app):
    """A regex allowing ten digits with 20 top logprobs: half of them are -inf, which once went out as null."""
    status, events = await post(app, constraint=Constraint("regex", "[0-9]"), temperature=0.0, logprobs=20)
    assert status == 200
    first = next(e for e in events if isinstance(e, Token))
    values = [top.logprob for top in first.top_logprobs]
    assert LOGPROB_FLOOR in values and all(math.isfinite(v) for v in values)
    assert math.isfinite(next(e for e in events if isinstance(e, Finish)).cumulative_logprob)


@pytest.mark.parametrize(("params", "field"), [
    ({"repetition_penalty": 1e-300}, "repetition_penalty"),
    ({"repetition_penalty": 1e5}, "repetition_penalty"),
    ({"encoder_repetition_penalty": 1e-9}, "encoder_repetition_penalty"),
    ({"temperature": 1e39}, "temperature"),
    ({"temperature": math.inf}, "temperature"),
    ({"top_p": math.nan}, "top_p"),
    ({"presence_penalty": math.nan}, "presence_penalty"),
    ({"logit_bias": {100: 1e39}}, "logit_bias"),
    ({"logit_bias": {100: 1.5e20}}, "logit_bias"),
    ({"logit_bias": {100: -math.inf}}, "logit_bias"),
    ({"logit_bias": {60000: 1.0}}, "logit_bias"),  # past the score columns: failed every request of the step
    ({"logit_bias": {-1: 1.0}}, "logit_bias"),
    ({"bad_word_tokens": [[60000]]}, "bad_word_tokens"),  # the same
    ({"num_beams": 2, "length_penalty": 1.5e20}, "length_penalty"),  # OverflowError in the beam scores
    ({"num_beams": 2, "length_penalty": -6.0}, "length_penalty"),
    ({"watermark": Watermark(0.5, 1e39)}, "watermark"),
    ({"input_embeds": [[1e39] * 576] * 2}, "input_embeds"),
    ({"token_index_to_replace": [0], "embedding_to_replace": [1e39] * 576}, "embedding_to_replace"),
])
def test_numbers_float32_cannot_hold_are_refused_naming_the_field(engine, params, field):
    prompt = None if "input_embeds" in params else PROMPT
    with pytest.raises(RequestRejected) as refused:
        engine.prepare(request(prompt, max_tokens=2, **params))
    assert refused.value.field == field and refused.value.kind == "validation"


def test_the_largest_values_inside_the_bounds_still_generate(engine):
    run = generate(engine, PROMPT, max_tokens=3, repetition_penalty=1e4, encoder_repetition_penalty=1e-4,
                   logit_bias={100: -1e4, 200: 1e4}, watermark=Watermark(0.5, 1e4), temperature=0.0, logprobs=3)
    assert not run.of(Error)
    finish = run.finishes[0]
    assert len(finish.token_ids) == 3 and finish.token_ids[0] == 200  # +1e4 forces it
    assert math.isfinite(finish.cumulative_logprob)


def test_a_positive_temperature_below_the_minimum_samples_at_the_minimum(engine):
    """1e-300 is 0 in float32: logits / 0 gave +-inf, and the sampler drew token 0 over and over."""
    prepared = engine.prepare(request(PROMPT, max_tokens=5, temperature=1e-300, seed=[3]))
    assert prepared.request.params.temperature == 0.01
    tiny = generate(engine, PROMPT, max_tokens=5, temperature=1e-300, seed=[3]).finishes[0]
    floor = generate(engine, PROMPT, max_tokens=5, temperature=0.01, seed=[3]).finishes[0]
    assert tiny.token_ids == floor.token_ids and set(tiny.token_ids) != {0}
