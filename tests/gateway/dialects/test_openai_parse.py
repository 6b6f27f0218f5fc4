"""OpenAI completions and chat bodies -> internal requests: defaults, mappings and every validation rule."""

from __future__ import annotations

import json

import pytest

from common.protocol import Constraint
from gateway.dialects.openai.chat import OpenAIChat
from gateway.dialects.openai.completions import OpenAICompletions
from gateway.errors import ValidationFailed

M = "m"
COMPLETIONS = OpenAICompletions()
CHAT = OpenAIChat()
USER = [{"role": "user", "content": "Hi"}]


def parse(body: dict, dialect=COMPLETIONS):
    return dialect.parse(body, "/v1/completions")


def refused(body: dict, dialect=COMPLETIONS) -> str:
    with pytest.raises(ValidationFailed) as info:
        dialect.parse(body, "/v1/completions")
    return info.value.param


def test_completion_defaults():
    parsed = parse({"model": M, "prompt": "Hi"})
    request = parsed.requests[0]
    assert request.prompt == "Hi" and request.prompt_ids is None
    params = request.params
    assert (params.max_tokens, params.temperature, params.top_p, params.n, params.best_of) == (16, 1.0, 1.0, 1, None)
    assert params.constraint is None and request.deadline_unix is None
    assert parsed.stream is False


def test_explicit_nulls_mean_unset():
    body = {"model": M, "prompt": "Hi"}
    nulls = {k: None for k in ("max_tokens", "temperature", "top_p", "n", "best_of", "stream", "stream_options",
                               "stop", "seed", "logprobs", "echo", "presence_penalty", "frequency_penalty",
                               "logit_bias", "user", "suffix", "top_k", "min_p", "response_format", "watermark")}
    assert parse({**body, **nulls}).requests[0].params == parse(body).requests[0].params


@pytest.mark.parametrize(("prompt", "expected"), [
    ("a", [("a", None)]),
    (["a", "b"], [("a", None), ("b", None)]),
    ([1, 2, 3], [(None, [1, 2, 3])]),
    ([[1, 2], [3]], [(None, [1, 2]), (None, [3])]),
])
def test_prompt_forms(prompt, expected):
    requests = parse({"model": M, "prompt": prompt}).requests
    assert [(r.prompt, r.prompt_ids) for r in requests] == expected


def test_n_best_of_seed_stop_logprobs_echo():
    parsed = parse({"model": M, "prompt": "x", "n": 2, "best_of": 3, "seed": 7, "stop": "\n", "logprobs": 2,
                    "echo": True, "logit_bias": {"42": -100}})
    params = parsed.requests[0].params
    assert (params.n, params.best_of, params.seed, params.stop, params.logprobs) == (2, 3, [7], ["\n"], 2)
    assert params.logit_bias == {42: -100} and parsed.requests[0].return_prompt_text


def test_stream_options_include_usage():
    parsed = parse({"model": M, "prompt": "x", "stream": True, "stream_options": {"include_usage": True}})
    assert parsed.stream and parsed.options.include_usage and parsed.requests[0].stream


def test_friendli_extensions_map_to_sampling_params():
    params = parse({"model": M, "prompt": "x", "top_k": 5, "min_p": 0.1, "typical_p": 0.9, "repetition_penalty": 1.2,
                    "encoder_repetition_penalty": 1.1, "no_repeat_ngram": 3, "encoder_no_repeat_ngram": 2,
                    "min_tokens": 2, "bad_words": ["foo"], "bad_word_tokens": [{"tokens": [5, 6]}],
                    "stop_tokens": [{"tokens": [7]}], "eos_token": [9], "ignore_eos": True,
                    "include_output_logits": True, "include_output_logprobs": True, "forced_output_tokens": [1, 2],
                    "xtc_threshold": 0.1, "xtc_probability": 0.5, "watermark": True}).requests[0].params
    assert (params.top_k, params.min_p, params.typical_p, params.repetition_penalty) == (5, 0.1, 0.9, 1.2)
    assert (params.encoder_repetition_penalty, params.no_repeat_ngram_size, params.encoder_no_repeat_ngram_size) \
        == (1.1, 3, 2)
    assert params.min_tokens == 2 and params.bad_words == ["foo"] and params.bad_word_tokens == [[5, 6]]
    assert params.stop_token_ids == [7] and params.eos_token_ids == [9] and params.ignore_eos
    assert params.include_output_logits and params.logprobs == 0 and params.forced_output_tokens == [1, 2]
    assert (params.xtc_threshold, params.xtc_probability) == (0.1, 0.5)
    assert params.watermark is not None and params.watermark.gamma == 0.5


def test_no_repeat_ngram_one_is_off_and_top_k_zero_is_off():
    params = parse({"model": M, "prompt": "x", "no_repeat_ngram": 1, "top_k": 0}).requests[0].params
    assert params.no_repeat_ngram_size == 0 and params.top_k == 0


def test_tokens_prompt_and_embedding_replacement():
    request = parse({"model": M, "tokens": [1, 2, 3], "token_index_to_replace": [1],
                     "embedding_to_replace": [0.5, 0.25]}).requests[0]
    assert request.prompt_ids == [1, 2, 3] and request.token_index_to_replace == [1]
    assert request.embedding_to_replace == [0.5, 0.25]


def test_max_total_tokens_drops_the_16_default():
    params = parse({"model": M, "prompt": "x", "max_total_tokens": 40, "min_total_tokens": 5}).requests[0].params
    assert (params.max_tokens, params.max_total_tokens, params.min_total_tokens) == (None, 40, 5)


def test_seed_list_one_per_choice():
    assert parse({"model": M, "prompt": "x", "n": 2, "seed": [1, 2]}).requests[0].params.seed == [1, 2]


def test_timeout_microseconds_sets_a_deadline():
    import time

    before = time.time()
    request = parse({"model": M, "prompt": "x", "timeout_microseconds": 2_000_000}).requests[0]
    assert before + 1.9 < request.deadline_unix < time.time() + 2.1


def test_beam_fields_are_wired_through():
    params = parse({"model": M, "prompt": "x", "num_beams": 4, "n": 2, "beam_search_type": "STOCHASTIC",
                    "length_penalty": 0.8, "early_stopping": True, "beam_compat_pre_normalization": True,
                    "beam_compat_no_post_normalization": True}).requests[0].params
    assert (params.num_beams, params.n, params.beam_search_type, params.length_penalty) == (4, 2, "STOCHASTIC", 0.8)
    assert params.early_stopping and params.beam_compat_pre_normalization and params.beam_compat_no_post_normalization


@pytest.mark.parametrize(("response_format", "expected"), [
    ({"type": "text"}, None),
    ({"type": "json_object"}, Constraint("json_object", "")),
    ({"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}},
     Constraint("json_schema", json.dumps({"type": "object"}, separators=(",", ":")))),
    ({"type": "json_object", "schema": '{"type":"object"}'}, Constraint("json_schema", '{"type":"object"}')),
    ({"type": "json_schema", "schema": '{"type":"array"}'}, Constraint("json_schema", '{"type":"array"}')),
    ({"type": "regex", "schema": "[0-9]+"}, Constraint("regex", "[0-9]+")),
])
def test_response_format_to_constraint(response_format, expected):
    assert parse({"model": M, "prompt": "x", "response_format": response_format}).requests[0].params.constraint \
        == expected
    assert parse({"model": M, "messages": USER, "response_format": response_format}, CHAT).requests[0] \
        .params.constraint == expected


@pytest.mark.parametrize(("extra", "param"), [
    ({"model": None}, "model"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 5, "max_total_tokens": 9}, "max_total_tokens"),
    ({"min_tokens": 1, "min_total_tokens": 9}, "min_total_tokens"),
    ({"min_tokens": 20, "max_tokens": 5}, "min_tokens"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
    ({"min_p": 2}, "min_p"),
    ({"typical_p": 0}, "typical_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"encoder_repetition_penalty": -1}, "encoder_repetition_penalty"),
    ({"presence_penalty": 3}, "presence_penalty"),
    ({"frequency_penalty": -3}, "frequency_penalty"),
    ({"no_repeat_ngram": 0}, "no_repeat_ngram"),
    ({"n": 0}, "n"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"best_of": 3, "stream": True}, "best_of"),
    ({"seed": -1}, "seed"),
    ({"seed": [1, 2, 3], "n": 2}, "seed"),
    ({"seed": []}, "seed"),
    ({"stop": ["a"] * 5}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"logprobs": 21}, "logprobs"),
    ({"logit_bias": {"abc": 1}}, "logit_bias"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"suffix": "x"}, "suffix"),
    ({"tokens": [1]}, "tokens"),
    ({"num_beams": 32}, "num_beams"),
    ({"num_beams": 2, "n": 3}, "n"),
    ({"num_beams": 2, "stream": True}, "stream"),
    ({"num_beams": 2, "stop": ["x"]}, "stop"),
    ({"num_beams": 2, "top_k": 5}, "beam_search_type"),
    ({"num_beams": 2, "best_of": 3}, "best_of"),
    ({"beam_search_type": "GREEDY"}, "beam_search_type"),
    ({"beam_compat_no_post_normalization": True}, "beam_compat_no_post_normalization"),
    ({"response_format": {"type": "xml"}}, "response_format"),
    ({"response_format": {"type": "regex"}}, "response_format"),
    ({"response_format": {"type": "json_schema", "json_schema": {"schema": "nope"}}}, "response_format"),
    ({"response_format": {"type": "json_object"}, "min_tokens": 3}, "min_tokens"),
    ({"timeout_microseconds": 0}, "timeout_microseconds"),
    ({"timeout_microseconds": 2**31}, "timeout_microseconds"),
    ({"stop_tokens": [{"tokens": []}]}, "stop_tokens"),
    ({"bad_word_tokens": [{"tokens": [-1]}]}, "bad_word_tokens"),
    ({"eos_token": [-2]}, "eos_token"),
    ({"soft_prompts": [1]}, "soft_prompts"),
    ({"generation_offset": 3}, "generation_offset"),
    ({"watermark": "yes"}, "watermark"),
    ({"max_tokens": "ten"}, "max_tokens"),
    ({"stream": "yes"}, "stream"),
])
def test_completion_validation_names_the_field(extra, param):
    assert refused({"model": M, "prompt": "x", **extra}) == param


def test_prompt_errors():
    assert refused({"model": M}) == "prompt"
    assert refused({"model": M, "prompt": []}) == "prompt"
    assert refused({"model": M, "prompt": [1, "a"]}) == "prompt"
    assert refused({"model": M, "tokens": []}) == "tokens"


# ---- chat ----


def test_chat_maps_messages_and_lengths():
    parsed = parse({"model": M, "messages": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                    "max_completion_tokens": 9, "n": 2, "seed": [3, 4], "stop": ["\n"]}, CHAT)
    request = parsed.requests[0]
    assert request.messages == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    assert request.prompt is None
    assert (request.params.max_tokens, request.params.n, request.params.seed) == (9, 2, [3, 4])


def test_chat_default_max_tokens_is_the_context():
    assert parse({"model": M, "messages": USER}, CHAT).requests[0].params.max_tokens is None


def test_chat_logprobs():
    assert parse({"model": M, "messages": USER, "logprobs": True, "top_logprobs": 3}, CHAT) \
        .requests[0].params.logprobs == 3
    assert parse({"model": M, "messages": USER, "logprobs": True}, CHAT).requests[0].params.logprobs == 0
    assert parse({"model": M, "messages": USER, "logprobs": False}, CHAT).requests[0].params.logprobs is None


def test_chat_accepts_friendli_client_nulls_and_tool_choice_auto():
    body = {"model": M, "messages": USER, "tools": None, "tool_choice": "auto", "logit_bias": None,
            "timeout_microseconds": None, "response_format": None, "top_logprobs": None}
    assert parse(body, CHAT).requests[0].messages == USER


@pytest.mark.parametrize(("extra", "param"), [
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": [{"role": "robot", "content": "x"}]}, "messages"),
    ({"messages": ["hi"]}, "messages"),
    ({"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]}, "messages"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"functions": [{"name": "f"}]}, "functions"),
    ({"top_logprobs": 3}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    ({"max_tokens": 3, "max_completion_tokens": 4}, "max_completion_tokens"),
    ({"temperature": 3}, "temperature"),
    ({"chat_template_kwargs": {"tools": 1}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"x": [1]}}, "chat_template_kwargs"),
    ({"chat_template_kwargs": {"bad name": 1}}, "chat_template_kwargs"),
    ({"continue_final_message": True}, "continue_final_message"),  # the last message is the user's
    ({"continue_final_message": True, "add_generation_prompt": True}, "continue_final_message"),
    ({"n": 200}, "n"),
])
def test_chat_validation_names_the_field(extra, param):
    assert refused({"model": M, "messages": USER, **extra}, CHAT) == param


def test_deprecated_functions_refusal_is_clear():
    with pytest.raises(ValidationFailed) as info:
        CHAT.parse({"model": M, "messages": USER, "functions": [{"name": "f"}]}, "/v1/chat/completions")
    assert "use tools" in info.value.message and info.value.status == 422
