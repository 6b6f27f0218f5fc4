"""Each dialect refuses a bad request as its real server does (issue #34): OpenAI's routes with a 400
`invalid_request_error` naming `param` (the openai SDK's BadRequestError, never FastAPI's 422) and a context
overflow as `context_length_exceeded` in OpenAI's words; Friendli and MonsterAPI keep their FastAPI 422; TGI's
`error_type` only where TGI itself has one, so huggingface_hub raises its typed errors. Through the real gateway
app in front of the protocol worker."""

from __future__ import annotations

import pytest

from common.protocol import Error
from testkit.protocol_worker import MODEL, Reply

CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}]}
COMPLETION = {"model": MODEL, "prompt": "Hi"}


def overflow(max_tokens: int | None) -> Reply:
    """The worker's refusal of a prompt over a 2048-token context, with the sizes it reports."""
    return Reply(status=422, error=Error(kind="too_long", message="the prompt is too long", field="prompt",
                                         max_context=2048, prompt_tokens=3000 if max_tokens is None else 2000,
                                         max_tokens=max_tokens))


@pytest.mark.parametrize(("path", "body", "param", "code"), [
    ("/v1/chat/completions", {**CHAT, "temperature": 9}, "temperature", "invalid_value"),
    ("/v1/completions", {**COMPLETION, "top_p": 0}, "top_p", "invalid_value"),
    ("/v1/completions", {**COMPLETION, "max_tokens": "ten"}, "max_tokens", "invalid_type"),
    ("/v1/chat/completions", {"messages": CHAT["messages"]}, "model", "missing_required_parameter"),
    ("/v1/chat/completions", {"model": MODEL}, "messages", "missing_required_parameter"),
    ("/v1/completions", {"model": MODEL}, "prompt", "missing_required_parameter"),
    ("/v1/completions", {**COMPLETION, "max_token": 3}, "max_token", "unknown_parameter"),
])
async def test_openai_routes_refuse_invalid_requests_with_400(gateway_app, worker, path, body, param, code):
    response = await gateway_app.post(path, json=body, headers=gateway_app.key_headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code), error
    assert worker.requests == []


async def test_a_worker_validation_refusal_is_a_400_on_openai_routes(gateway_app, worker):
    worker.replies = [Reply.refused(422, "validation", "token id 99999 is outside the vocabulary")]
    for stream in (False, True):  # a stream's headers wait for the first event: the refusal keeps its status
        response = await gateway_app.post("/v1/completions", json={**COMPLETION, "stream": stream},
                                      headers=gateway_app.key_headers)
        assert response.status_code == 400, response.text
        assert response.json()["error"]["type"] == "invalid_request_error"


@pytest.mark.parametrize(("path", "body", "max_tokens", "message", "param"), [
    ("/v1/chat/completions", CHAT, None,
     "This model's maximum context length is 2048 tokens. However, your messages resulted in 3000 tokens. "
     "Please reduce the length of the messages.", "messages"),
    ("/v1/chat/completions", CHAT, 100,
     "This model's maximum context length is 2048 tokens. However, you requested 2100 tokens (2000 in the "
     "messages, 100 in the completion). Please reduce the length of the messages or completion.", "messages"),
    ("/v1/completions", COMPLETION, 100,
     "This model's maximum context length is 2048 tokens, however you requested 2100 tokens (2000 in your "
     "prompt; 100 for the completion). Please reduce your prompt; or completion length.", "prompt"),
])
async def test_a_context_overflow_is_worded_as_openai_words_it(gateway_app, worker, path, body, max_tokens, message,
                                                               param):
    worker.replies = [overflow(max_tokens)]
    response = await gateway_app.post(path, json=body, headers=gateway_app.key_headers)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error == {"message": message, "type": "invalid_request_error", "param": param,
                     "code": "context_length_exceeded"}


@pytest.mark.parametrize("path", ["/serverless/v1/chat/completions", "/v1/generate"])
async def test_friendli_and_monster_keep_their_fastapi_422(gateway_app, path):
    body = {**CHAT, "temperature": -1} if "chat" in path else {**COMPLETION, "temperature": -1}
    response = await gateway_app.post(path, json=body, headers=gateway_app.key_headers)
    assert response.status_code == 422, response.text
    assert response.json()["error"]["param"] == "temperature"


async def test_tgi_sends_error_type_only_where_tgi_has_one(gateway_app, worker):
    invalid = await gateway_app.post("/generate", json={"inputs": "Hi", "parameters": {"temperature": 0}},
                                 headers=gateway_app.key_headers)
    assert invalid.status_code == 422 and invalid.json()["error_type"] == "validation", invalid.text
    worker.replies = [overflow(None)]
    too_long = await gateway_app.post("/generate", json={"inputs": "Hi"}, headers=gateway_app.key_headers)
    assert too_long.status_code == 422 and too_long.json()["error_type"] == "validation", too_long.text
    # before TGI (a key, a model): no error_type, so huggingface_hub raises its HTTP error of that status, not an
    # UnknownError
    anonymous = await gateway_app.post("/generate", json={"inputs": "Hi"})
    assert anonymous.status_code == 401 and set(anonymous.json()) == {"error"}, anonymous.text
    unknown = await gateway_app.post("/v1/completions/generate", json={"model": "nope", "inputs": "Hi"},
                                 headers=gateway_app.key_headers)
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}, unknown.text
