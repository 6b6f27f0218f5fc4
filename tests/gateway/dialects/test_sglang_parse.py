"""SGLang `/generate` parsing: prompts and batches, sampling_params defaults and validation, refusals."""

from __future__ import annotations

import pytest

from gateway.dialects.sglang.dialect import SGLANG
from gateway.dialects.sglang.request import BodyInvalid
from gateway.errors import UpstreamFailed, ValidationFailed


def parse(body):
    return SGLANG.parse(body, "/generate")


def fails(body, field):
    with pytest.raises(BodyInvalid) as caught:
        parse(body)
    assert caught.value.param == field, caught.value.message
    status, envelope = SGLANG.error_body(caught.value)
    assert status == 400
    assert envelope == {"object": "error", "message": caught.value.message, "type": "Bad Request",
                        "param": field, "code": 400}
    return caught.value.message


def test_defaults():
    parsed = parse({"text": "Hello"})
    params = parsed.requests[0].params
    assert params.max_tokens == 128 and params.temperature == 1.0 and params.top_k == 0 and params.top_p == 1.0
    assert params.logprobs is None and params.prompt_logprobs is False and params.n == 1
    assert parsed.options.batch is False and parsed.stream is False
    assert parsed.options.ids[0]  # a generated rid


def test_sampling_mapping():
    params = parse({"text": "x", "sampling_params": {
        "max_new_tokens": 5, "min_new_tokens": 2, "temperature": 1e-7, "top_k": 4, "top_p": 0.5, "min_p": 0.1,
        "frequency_penalty": 1, "presence_penalty": -1, "repetition_penalty": 1.5, "stop": "END",
        "stop_token_ids": [2], "ignore_eos": True, "skip_special_tokens": False, "logit_bias": {"7": -5},
        "sampling_seed": 9, "regex": "[a-z]+", "stream_interval": 2}}).requests[0].params
    assert params.temperature == 0.0  # < 1e-6 means greedy
    assert (params.max_tokens, params.min_tokens, params.top_k, params.top_p, params.min_p) == (5, 2, 4, 0.5, 0.1)
    assert params.stop == ["END"] and params.stop_token_ids == [2] and params.ignore_eos is True
    assert params.skip_special_tokens is False and params.logit_bias == {7: -5} and params.seed == [9]
    assert params.constraint.kind == "regex" and params.constraint.value == "[a-z]+"
    schema = parse({"text": "x", "sampling_params": {"json_schema": '{"type": "object"}'}}).requests[0].params
    assert schema.constraint.kind == "json_schema" and schema.constraint.value == '{"type": "object"}'
    assert parse({"text": "x", "sampling_params": {"ebnf": "root ::= \"a\""}}).requests[0].params.constraint.kind \
        == "ebnf"


def test_batches_and_n():
    parsed = parse({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 1}, {"max_new_tokens": 2}]})
    assert [r.prompt for r in parsed.requests] == ["a", "b"]
    assert [r.params.max_tokens for r in parsed.requests] == [1, 2] and parsed.options.batch is True
    ids = parse({"input_ids": [[1, 2], [3]]})
    assert [r.prompt_ids for r in ids.requests] == [[1, 2], [3]] and ids.options.batch is True
    single = parse({"input_ids": [1, 2, 3], "sampling_params": {"n": 3}})
    assert single.requests[0].prompt_ids == [1, 2, 3] and single.requests[0].params.n == 3
    assert single.options.batch is True  # n > 1 answers an array
    embeds = parse({"input_embeds": [[0.1, 0.2], [0.3, 0.4]]})
    assert embeds.requests[0].input_embeds == [[0.1, 0.2], [0.3, 0.4]] and embeds.options.batch is False
    assert len(parse({"input_embeds": [[[0.1]], [[0.2]]]}).requests) == 2
    assert parse({"text": "x", "rid": "my-id"}).options.ids == ["my-id"]


def test_logprob_options():
    parsed = parse({"text": "x", "return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2,
                    "token_ids_logprob": [5, 6], "return_hidden_states": True})
    params = parsed.requests[0].params
    assert params.logprobs == 2 and params.prompt_logprobs is True and params.prompt_logprobs_start == 0
    assert params.token_ids_logprob == [5, 6] and params.return_hidden_states is True
    assert parsed.options.prompt_from == 0
    output_only = parse({"text": "x", "return_logprob": True}).requests[0].params
    assert output_only.logprobs == 0 and output_only.prompt_logprobs is False


@pytest.mark.parametrize("sampling, field", [
    ({"max_new_tokens": 0}, "max_new_tokens"),
    ({"max_new_tokens": 4, "min_new_tokens": 5}, "min_new_tokens"),
    ({"temperature": -0.1}, "temperature"),
    ({"top_p": 0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": 0}, "top_k"),
    ({"top_k": -2}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": -3}, "presence_penalty"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": 2.5}, "repetition_penalty"),
    ({"n": 0}, "n"),
    ({"stop": [""]}, "stop"),
    ({"stop_regex": "a+"}, "stop_regex"),
    ({"structural_tag": "{}"}, "structural_tag"),
    ({"custom_params": {"a": 1}}, "custom_params"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens"),
    ({"stream_interval": 0}, "stream_interval"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"json_schema": "{}", "regex": "a"}, "json_schema"),
    ({"json_schema": "not json"}, "json_schema"),
    ({"json_schema": "[1]"}, "json_schema"),
    ({"logit_bias": {"x": 1}}, "logit_bias"),
    ({"sampling_seed": -1}, "sampling_seed"),
])
def test_sampling_validation(sampling, field):
    fails({"text": "x", "sampling_params": sampling}, field)


@pytest.mark.parametrize("body, field", [
    ({"text": "x", "input_ids": [1]}, "text"),
    ({"sampling_params": {}}, "text"),
    ({"text": ""}, "text"),
    ({"text": []}, "text"),
    ({"input_ids": []}, "input_ids"),
    ({"input_ids": [1, "a"]}, "input_ids"),
    ({"input_ids": [[1], []]}, "input_ids"),
    ({"input_embeds": [["a"]]}, "input_embeds"),
    ({"text": ["a", "b"], "sampling_params": [{}]}, "sampling_params"),
    ({"text": ["a", "b"], "sampling_params": [{"n": 1}, {"n": 2}]}, "sampling_params"),
    ({"text": ["a", "b"], "rid": ["one"]}, "rid"),
    ({"text": "x", "top_logprobs_num": 21}, "top_logprobs_num"),
    ({"text": "x", "token_ids_logprob": [-3]}, "token_ids_logprob"),
    ({"text": "x", "logprob_start_len": -2}, "logprob_start_len"),
    ({"text": "x", "session_params": {"id": "s"}}, "session_params"),
    ({"text": 5}, "text"),
])
def test_body_validation(body, field):
    fails(body, field)


def test_refusals_say_why():
    assert "never executes code" in fails({"text": "x", "custom_logit_processor": "gASV..."},
                                          "custom_logit_processor")
    assert "filesystem path" in fails({"text": "x", "lora_path": "/models/adapter"}, "lora_path")
    assert "filesystem path" in fails({"text": "x", "lora_path": "../adapter"}, "lora_path")
    assert "not a registered adapter" in fails({"text": "x", "lora_path": "my-adapter"}, "lora_path")
    for field in ("image_data", "audio_data", "video_data"):
        assert "not supported by this model" in fails({"text": "x", field: "http://x/y.png"}, field)
    parse({"text": "x", "lora_path": None, "image_data": None})  # explicit nulls are unset


def test_engine_errors_use_the_engine_envelope():
    status, body = SGLANG.error_body(ValidationFailed("prompt too long", param="prompt"))
    assert status == 400 and body == {"error": {"message": "prompt too long"}}
    status, body = SGLANG.error_body(UpstreamFailed("worker died"))
    assert status == 502 and body == {"error": {"message": "worker died"}}
