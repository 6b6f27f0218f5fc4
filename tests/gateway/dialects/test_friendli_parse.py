"""Friendli routes: defaults, legacy stream detection, the 422 `detail` list, friendli-client's null body."""

from __future__ import annotations

import pytest

from gateway.dialects.openai.chat import OpenAIChat
from gateway.dialects.openai.completions import OpenAICompletions
from gateway.dialects.openai.friendli_legacy import LEGACY_KEYS, is_legacy
from gateway.errors import ValidationFailed

FRIENDLI = OpenAICompletions(friendli=True)
OPENAI = OpenAICompletions()
# what friendli-client 1.5.8 sends for `completions.create(model=..., prompt=..., max_tokens=5)`
CLIENT_15_KEYS = ("stream", "model", "prompt", "tokens", "timeout_microseconds", "max_tokens", "max_total_tokens",
                  "min_tokens", "min_total_tokens", "n", "num_beams", "length_penalty", "early_stopping",
                  "no_repeat_ngram", "encoder_no_repeat_ngram", "repetition_penalty", "encoder_repetition_penalty",
                  "frequency_penalty", "presence_penalty", "temperature", "top_k", "top_p", "stop", "stop_tokens",
                  "seed", "token_index_to_replace", "embedding_to_replace", "beam_search_type",
                  "beam_compat_pre_normalization", "beam_compat_no_post_normalization", "bad_words",
                  "bad_word_tokens", "include_output_logits", "include_output_logprobs", "forced_output_tokens",
                  "eos_token", "soft_prompts", "position_ids", "generation_offset")


def client_15_body(**values) -> dict:
    return {**dict.fromkeys(CLIENT_15_KEYS), **values}


def test_friendli_client_body_with_nulls_parses_and_selects_the_legacy_stream():
    for dialect in (FRIENDLI, OPENAI):
        parsed = dialect.parse(client_15_body(model="m", prompt="Hi", max_tokens=5, stream=True), "/v1/completions")
        assert parsed.options.legacy and parsed.stream
        assert parsed.requests[0].params.max_tokens == 5


@pytest.mark.parametrize("key", LEGACY_KEYS)
def test_each_legacy_key_even_null_selects_legacy(key):
    assert is_legacy({"model": "m", key: None}, None)
    assert OPENAI.parse({"model": "m", "prompt": "x", key: None}, "/v1/completions").options.legacy


def test_modern_bodies_and_header():
    assert not OPENAI.parse({"model": "m", "prompt": "x", "top_k": 3}, "/v1/completions").options.legacy
    assert is_legacy({}, "friendli-legacy") and not is_legacy({}, "openai")
    assert OpenAICompletions(legacy_header=True).parse({"model": "m", "prompt": "x"}, "/v1/completions").options.legacy


def test_friendli_routes_have_no_16_token_default_and_no_temperature_cap():
    params = FRIENDLI.parse({"model": "m", "prompt": "x", "temperature": 3.5}, "/serverless/v1/completions") \
        .requests[0].params
    assert params.max_tokens is None and params.temperature == 3.5


def test_friendli_422_keeps_the_openai_envelope_and_adds_detail():
    with pytest.raises(ValidationFailed) as info:
        FRIENDLI.parse({"model": "m", "prompt": "x", "max_tokens": 1, "max_total_tokens": 5}, "/serverless")
    status, body = FRIENDLI.error_body(info.value)
    assert status == 422
    assert body["error"]["param"] == "max_total_tokens"
    assert body["detail"][0]["loc"] == ["body", "max_total_tokens"]
    assert "detail" not in OPENAI.error_body(info.value)[1]
    chat_status, chat_body = OpenAIChat(friendli=True).error_body(info.value)
    assert chat_status == 422 and chat_body["detail"]


def test_dedicated_model_is_the_endpoint_id():
    assert FRIENDLI.parse({"model": "ep-123", "tokens": [1, 2]}, "/dedicated/v1/completions").model == "ep-123"


def test_legacy_container_client_may_omit_the_model_on_v1():
    from gateway.dialects.openai.completions import OpenAICompletions
    from gateway.serving.model_aliases import DEFAULT_MODEL

    legacy = {"prompt": "Hi", "model": None, "num_beams": None, "soft_prompts": None, "max_tokens": 3}
    assert OpenAICompletions().parse(legacy, "/v1/completions").model == DEFAULT_MODEL
    with pytest.raises(ValidationFailed) as refused:  # serverless names a model, legacy or not
        OpenAICompletions(friendli=True).parse(legacy, "/serverless/v1/completions")
    assert refused.value.param == "model"
    with pytest.raises(ValidationFailed):  # an OpenAI caller must name one
        OpenAICompletions().parse({"prompt": "Hi"}, "/v1/completions")
