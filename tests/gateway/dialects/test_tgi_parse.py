"""TGI / DataCrunch request parsing: defaults, TGI's validation rules (422 naming the field), mapping."""

from __future__ import annotations

import json

import pytest

from gateway.dialects.tgi.dialect import TGI
from gateway.errors import ValidationFailed

GENERATE = TGI(100, stream=False)
STREAM = TGI(100, stream=True)
COMPAT = TGI(100, compat=True)
DATACRUNCH = TGI(20, stream=False)


def parse(parameters=None, dialect=GENERATE, **top):
    return dialect.parse({"inputs": "Hello", "parameters": parameters, **top}, "/generate")


def test_defaults_are_greedy_100_tokens_without_details():
    parsed = parse()
    params = parsed.requests[0].params
    assert params.max_tokens == 100 and params.temperature == 0.0 and params.n == 1
    assert parsed.options.details is False and parsed.options.prefill is False
    assert parsed.stream is False
    assert parsed.requests[0].prompt == "Hello"


def test_datacrunch_default_is_20_tokens_and_model_selects():
    parsed = DATACRUNCH.parse({"model": "m1", "inputs": "Hi"}, "/v1/completions/generate")
    assert parsed.requests[0].params.max_tokens == 20
    assert parsed.model == "m1"


def test_explicit_nulls_mean_unset():
    """text-generation 0.7 sends every parameter, null when unset."""
    nulls = {k: None for k in ("repetition_penalty", "frequency_penalty", "seed", "temperature", "top_k", "top_p",
                               "truncate", "typical_p", "best_of", "top_n_tokens", "grammar", "max_new_tokens")}
    parsed = parse({**nulls, "do_sample": False, "return_full_text": False, "stop": [], "watermark": False,
                    "details": True, "decoder_input_details": False})
    params = parsed.requests[0].params
    assert params.max_tokens == 100 and params.temperature == 0.0 and params.constraint is None
    assert parsed.options.details is True


def test_sampling_is_implied_by_warpers():
    assert parse({"top_k": 5}).requests[0].params.temperature == 1.0
    assert parse({"temperature": 0.7}).requests[0].params.temperature == 0.7
    assert parse({"do_sample": True}).requests[0].params.temperature == 1.0
    params = parse({"top_p": 0.9, "typical_p": 0.5, "top_k": 3}).requests[0].params
    assert (params.top_p, params.typical_p, params.top_k) == (0.9, 0.5, 3)


@pytest.mark.parametrize("parameters, field", [
    ({"temperature": 0}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.0}, "top_p"),
    ({"top_p": 0}, "top_p"),
    ({"typical_p": 1.0}, "typical_p"),
    ({"typical_p": 0}, "typical_p"),
    ({"top_k": 0}, "top_k"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"frequency_penalty": 2.5}, "frequency_penalty"),
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"truncate": 0}, "truncate"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"seed": -1}, "seed"),
    ({"top_n_tokens": 6}, "top_n_tokens"),
    ({"best_of": 0}, "best_of"),
    ({"best_of": 5, "do_sample": True}, "best_of"),
    ({"best_of": 2}, "best_of"),  # requires sampling
    ({"best_of": 2, "do_sample": True, "seed": 3}, "seed"),
    ({"grammar": {"type": "xml", "value": "x"}}, "grammar"),
    ({"grammar": {"type": "json", "value": "{not json"}}, "grammar"),
    ({"grammar": {"type": "json", "value": 3}}, "grammar"),
    ({"grammar": {"type": "regex", "value": ""}}, "grammar"),
    ({"adapter_id": "my-lora"}, "adapter_id"),
    ({"max_new_tokens": "ten"}, "max_new_tokens"),
])
def test_validation_rules(parameters, field):
    with pytest.raises(ValidationFailed) as caught:
        parse(parameters)
    # nested type errors name the top-level key in `param` and the full path in the message
    assert caught.value.param == field or f"parameters.{field}" in caught.value.message, caught.value.message
    status, body = GENERATE.error_body(caught.value)
    assert status == 422 and body["error_type"] == "validation" and body["error"]


def test_stream_only_rules():
    for parameters, field in (({"decoder_input_details": True}, "decoder_input_details"),
                              ({"best_of": 2, "do_sample": True}, "best_of")):
        parse(parameters)  # fine when not streamed
        with pytest.raises(ValidationFailed) as caught:
            parse(parameters, STREAM)
        assert caught.value.param == field
    with pytest.raises(ValidationFailed):
        parse({"decoder_input_details": True}, COMPAT, stream=True)


@pytest.mark.parametrize("body, field", [
    ({"inputs": ""}, "inputs"),
    ({"parameters": {}}, "inputs"),
    ({"inputs": 3}, "inputs"),
    ({"inputs": "x", "parameters": []}, "parameters"),
])
def test_body_shape(body, field):
    with pytest.raises(ValidationFailed) as caught:
        GENERATE.parse(body, "/generate")
    assert caught.value.param == field


def test_compat_stream_flag_and_route_stream():
    assert parse(None, COMPAT, stream=True).stream is True
    assert parse(None, COMPAT).stream is False
    assert parse(None, STREAM).stream is True
    assert parse(None, GENERATE, stream=True).stream is False  # /generate never streams


def test_outputs_mapping():
    parsed = parse({"details": True, "decoder_input_details": True, "top_n_tokens": 3, "truncate": 7,
                    "watermark": True, "seed": 2**64 - 1, "do_sample": True, "stop": ["\n"],
                    "repetition_penalty": 1.2, "frequency_penalty": 0.5, "return_full_text": True})
    params = parsed.requests[0].params
    assert params.logprobs == 3 and params.prompt_logprobs is True and params.truncate == 7
    assert params.watermark is not None and params.seed == [2**64 - 1] and params.stop == ["\n"]
    assert params.repetition_penalty == 1.2 and params.frequency_penalty == 0.5
    assert parsed.options.full_text == "Hello"


def test_best_of_runs_every_candidate():
    parsed = parse({"best_of": 3, "do_sample": True})
    assert parsed.requests[0].params.n == 3 and parsed.options.best_of == 3


def test_grammar_maps_to_constraints():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}}
    constraint = parse({"grammar": {"type": "json", "value": schema}}).requests[0].params.constraint
    assert constraint.kind == "json_schema" and json.loads(constraint.value) == schema
    text = parse({"grammar": {"type": "json", "value": json.dumps(schema)}}).requests[0].params.constraint
    assert json.loads(text.value) == schema
    regex = parse({"grammar": {"type": "regex", "value": "[0-9]+"}}).requests[0].params.constraint
    assert (regex.kind, regex.value) == ("regex", "[0-9]+")
