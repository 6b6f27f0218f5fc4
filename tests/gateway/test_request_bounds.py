"""Bounds on one request (gateway/dialects/bounds.py), each rule in each dialect through the in-process gateway:
a breach is the dialect's validation error naming the field and the limit, and nothing reaches a worker."""

from __future__ import annotations

import pytest

from gateway.dialects import bounds
from testkit.protocol_worker import MODEL, Reply, tokens
from tests.gateway.generation_bodies import HI

LONG = "x" * (bounds.MAX_STOP_CHARS + 1)
MANY_BIASES = {str(i): 1.0 for i in range(bounds.MAX_LOGIT_BIAS + 1)}
COMPLETION = {"model": MODEL, "prompt": "Hi"}
CHAT = {"model": MODEL, "messages": HI}
SGLANG = {"text": "Hi"}
TGI = {"inputs": "Hi"}
MESSAGES = {"model": MODEL, "max_tokens": 4, "messages": [{"role": "user", "content": "Hi"}]}
RESPONSES = {"model": MODEL, "input": "Hi"}
MANY_TOOLS = [{"type": "function", "name": f"f{i}", "parameters": {"type": "object"}} for i in range(129)]
OVER = [  # (path, body, the field named, words of the message)
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": "Hi"}] * 1025}, "messages",
     "at most 1024 messages"),
    ("/v1/messages", {**MESSAGES, "stop_sequences": ["a"] * 17}, "stop_sequences", "at most 16 stop sequences"),
    ("/v1/messages", {**MESSAGES, "stop_sequences": [LONG]}, "stop_sequences", "at most 256 characters"),
    ("/v1/messages", {**MESSAGES, "messages": [{"role": "user", "content": [{"type": "text", "text": "a"}] * 1025}]},
     "messages.0.content", "at most 1024 blocks"),
    ("/v1/messages", {**MESSAGES, "tools": [{"name": f"f{i}", "input_schema": {"type": "object"}}
                                            for i in range(129)]}, "tools", "at most 128 functions"),
    ("/v1/messages/count_tokens", {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}] * 1025},
     "messages", "at most 1024 messages"),
    ("/v1/responses", {**RESPONSES, "input": [{"role": "user", "content": "Hi"}] * 1025}, "input",
     "at most 1024 items"),
    ("/v1/responses", {**RESPONSES, "tools": MANY_TOOLS}, "tools", "at most 128 functions"),
    ("/v1/completions", {**COMPLETION, "prompt": ["Hi"] * 10_000}, "prompt", "at most 128 prompts"),
    ("/v1/completions", {**COMPLETION, "prompt": [[1, 2]] * 129}, "prompt", "at most 128 prompts"),
    ("/v1/completions", {**COMPLETION, "prompt": ["Hi"] * 3, "n": 100}, "prompt", "at most 256"),
    ("/v1/completions", {**COMPLETION, "prompt": ["Hi"] * 9, "num_beams": 31}, "prompt", "at most 256"),
    ("/v1/completions", {**COMPLETION, "bad_words": ["no"] * 50_000}, "bad_words", "at most 64 words"),
    ("/v1/completions", {**COMPLETION, "bad_words": [LONG]}, "bad_words", "at most 256 characters"),
    ("/v1/completions", {**COMPLETION, "bad_word_tokens": [{"tokens": [5]}] * 65}, "bad_word_tokens", "at most 64"),
    ("/v1/completions", {**COMPLETION, "bad_word_tokens": [{"tokens": [5] * 33}]}, "bad_word_tokens",
     "at most 32 tokens"),
    ("/v1/completions", {**COMPLETION, "stop_tokens": [{"tokens": [5]}] * 257}, "stop_tokens", "at most 256"),
    ("/v1/completions", {**COMPLETION, "stop_tokens": [{"tokens": [5] * 33}]}, "stop_tokens", "at most 32 tokens"),
    ("/v1/completions", {**COMPLETION, "eos_token": [5] * 257}, "eos_token", "at most 256 token ids"),
    ("/v1/completions", {**COMPLETION, "stop": [LONG]}, "stop", "at most 256 characters"),
    ("/v1/completions", {**COMPLETION, "stop": ["a"] * 5}, "stop", "at most 4 stop sequences"),
    ("/v1/completions", {**COMPLETION, "logit_bias": MANY_BIASES}, "logit_bias", "at most 300 entries"),
    ("/v1/chat/completions", {**CHAT, "messages": HI * 1025}, "messages", "at most 1024 messages"),
    ("/v1/chat/completions", {**CHAT, "bad_words": ["no"] * 65}, "bad_words", "at most 64 words"),
    ("/v1/chat/completions", {**CHAT, "logit_bias": {"5": 101}}, "logit_bias", "between -100 and 100"),
    ("/serverless/v1/completions", {**COMPLETION, "prompt": ["Hi"] * 129}, "prompt", "at most 128 prompts"),
    ("/serverless/v1/chat/completions", {**CHAT, "bad_words": [LONG]}, "bad_words", "at most 256 characters"),
    ("/v1/generate", {"model": MODEL, "messages": HI * 1025}, "messages", "at most 1024 messages"),
    ("/v1/generate", {"model": MODEL, "prompt": "Hi", "use_beam_search": True, "best_of": 32}, "best_of",
     "at most 31 beams"),
    ("/generate_stream", {**TGI, "parameters": {"stop": [LONG]}}, "stop", "at most 256 characters"),
    ("/v1/completions/generate", {**TGI, "parameters": {"stop": [LONG]}}, "stop", "at most 256 characters"),
    ("/generate", {"text": ["Hi"] * 129}, "text", "at most 128 prompts"),
    ("/generate", {"input_ids": [[1, 2]] * 129}, "input_ids", "at most 128 prompts"),
    ("/generate", {"text": ["Hi"] * 10, "sampling_params": {"n": 64}}, "sampling_params", "at most 256"),
    ("/generate", {**SGLANG, "sampling_params": {"logit_bias": {"5": 101}}}, "logit_bias", "between -100 and 100"),
    ("/generate", {**SGLANG, "sampling_params": {"logit_bias": {"5": -1e6}}}, "logit_bias", "between -100 and 100"),
    ("/generate", {**SGLANG, "sampling_params": {"logit_bias": MANY_BIASES}}, "logit_bias", "at most 300"),
    ("/generate", {**SGLANG, "sampling_params": {"stop": ["a"] * 17}}, "stop", "at most 16 stop sequences"),
    ("/generate", {**SGLANG, "sampling_params": {"stop": LONG}}, "stop", "at most 256 characters"),
    ("/generate", {**SGLANG, "sampling_params": {"stop_token_ids": [5] * 257}}, "stop_token_ids", "at most 256"),
    ("/generate", {**SGLANG, "return_logprob": True, "token_ids_logprob": [5] * 257}, "token_ids_logprob",
     "at most 256"),
]


def named_field(path: str, answer: dict) -> str | None:
    if path in ("/generate_stream", "/v1/completions/generate") or path.startswith("/v1/messages"):
        return None  # TGI's and Anthropic's envelopes have no field: the message names it
    if path == "/generate":
        return answer["param"]
    return answer["error"]["param"]


@pytest.mark.parametrize(("path", "body", "field", "words"), OVER, ids=[f"{p} {f}" for p, _, f, _ in OVER])
async def test_a_request_over_a_bound_is_refused_naming_the_field_and_the_limit(gateway_app, worker, path, body,
                                                                               field, words):
    response = await gateway_app.post(path, json=body, headers=gateway_app.key_headers)
    # SGLang and OpenAI answer a bad body with 400; TGI, Friendli and MonsterAPI with 422
    status = 422 if path.startswith(("/serverless", "/generate_stream", "/v1/completions/generate", "/v1/generate")) \
        else 400
    assert response.status_code == status, response.text
    assert words in response.text and field in response.text
    assert named_field(path, response.json()) in (None, field)
    if path.startswith("/serverless"):
        assert response.json()["detail"][0]["loc"] == ["body", field]
    assert worker.requests == []


async def test_requests_at_the_bounds_are_served(gateway_app, worker):
    worker.replies = [Reply(tokens())]
    at_limit = {**COMPLETION, "prompt": ["Hi"] * bounds.MAX_PROMPTS, "max_tokens": 2,
                "bad_words": ["z" * bounds.MAX_BAD_WORD_CHARS] * bounds.MAX_BAD_WORDS,
                "logit_bias": {str(i): -100 for i in range(bounds.MAX_LOGIT_BIAS)}}
    response = await gateway_app.post("/v1/completions", json=at_limit, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    assert len(response.json()["choices"]) == bounds.MAX_PROMPTS
    assert len(worker.requests) == bounds.MAX_PROMPTS
    sglang = {"text": ["Hi"] * 4, "sampling_params": {"n": 64, "logit_bias": {"5": 100}}}
    assert (await gateway_app.post("/generate", json=sglang, headers=gateway_app.key_headers)).status_code == 200
