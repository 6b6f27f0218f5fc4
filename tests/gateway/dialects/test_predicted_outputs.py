"""OpenAI's Predicted Outputs (`prediction`) on chat, completions and Responses: every validation rule, what reaches the
worker, the usage it reports (`completion_tokens_details`, whole and streamed), the token reservation and the
worker's refusal of a prediction too long for the context (OpenAI's 400, never a 500), and the ledger record of a
predicted request (the accepted and rejected counts the client was told, read only by its own team). Parsing runs
on the dialects; the rest through the real gateway app in front of the protocol worker."""

from __future__ import annotations

import json

import pytest

from common.protocol import Done, Error, Finish, GenerateRequest, PromptOverhead, SamplingParams, Token
from gateway.dialects.openai.chat import OpenAIChat
from gateway.dialects.openai.completions import OpenAICompletions
from gateway.dialects.responses.dialect import OpenAIResponses
from gateway.errors import ValidationFailed
from gateway.limits.tokens import request_reservation
from testkit.protocol_worker import MODEL, Reply
from tests.gateway.test_request_scope import record_of

CHAT, COMPLETIONS, RESPONSES = OpenAIChat(), OpenAICompletions(), OpenAIResponses()
USER = [{"role": "user", "content": "Rename x to y"}]
CODE = "def f(x):\n    return x + 1\n"


def chat(prediction, **extra):
    return CHAT.parse({"model": "m", "messages": USER, "prediction": prediction, **extra}, "/v1/chat/completions")


def refused(prediction, dialect=CHAT) -> ValidationFailed:
    body = {"model": "m", "prediction": prediction}
    body.update({CHAT: {"messages": USER}, RESPONSES: {"input": "Hi"}}.get(dialect, {"prompt": "Hi"}))
    with pytest.raises(ValidationFailed) as info:
        dialect.parse(body, "/v1/chat/completions")
    return info.value


def test_text_and_text_parts_reach_the_worker():
    assert chat({"type": "content", "content": CODE}).requests[0].prediction == CODE
    parts = {"type": "content", "content": [{"type": "text", "text": "def f(x):\n"}, {"type": "text", "text": "  1"}]}
    assert chat(parts).requests[0].prediction == "def f(x):\n  1"
    assert chat({"type": "content", "content": ""}).requests[0].prediction is None
    assert chat(None).requests[0].prediction is None
    parsed = COMPLETIONS.parse({"model": "m", "prompt": ["a", "b"], "prediction": {"type": "content", "content": CODE}},
                               "/v1/completions")
    assert [r.prediction for r in parsed.requests] == [CODE, CODE] and parsed.options.predicted
    parsed = RESPONSES.parse({"model": "m", "input": "Rename x", "prediction": {"type": "content", "content": CODE}},
                             "/v1/responses")
    assert parsed.requests[0].prediction == CODE and parsed.options.predicted


@pytest.mark.parametrize("prediction", [
    {"type": "text", "content": CODE},  # the wrong type
    {"content": CODE},  # no type
    {"type": "content"},  # no content
    {"type": "content", "content": 42},  # not text
    {"type": "content", "content": [{"type": "image_url", "image_url": {"url": "http://x/y.png"}}]},
    {"type": "content", "content": [{"type": "text", "text": 5}]},
    {"type": "content", "content": ["plain string part"]},
    {"type": "content", "content": CODE, "extra": 1},
])
@pytest.mark.parametrize("dialect", [CHAT, COMPLETIONS, RESPONSES], ids=["chat", "completions", "responses"])
def test_a_malformed_prediction_is_refused_naming_it(prediction, dialect):
    assert refused(prediction, dialect).param == "prediction"


@pytest.mark.parametrize("dialect", [CHAT, RESPONSES], ids=["chat", "responses"])
def test_a_prediction_that_is_not_an_object_is_a_type_error(dialect):
    error = refused("just a string", dialect)
    assert error.param == "prediction" and error.code == "invalid_type"


def test_unlike_openai_it_works_with_stream_n_logprobs_penalties_and_tools():
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    parsed = chat({"type": "content", "content": CODE}, stream=True, n=3, logprobs=True, top_logprobs=2,
                  presence_penalty=0.5, frequency_penalty=0.2, tools=tools)
    request = parsed.requests[0]
    assert request.prediction == CODE and request.params.n == 3 and request.tools is not None and parsed.stream


def test_the_prediction_is_reserved_against_tpm_like_completion_tokens():
    plain = GenerateRequest(request_id="", model="m", prompt="Hi", params=SamplingParams(max_tokens=10, n=2))
    predicted = GenerateRequest(request_id="", model="m", prompt="Hi", prediction=CODE,
                                params=SamplingParams(max_tokens=10, n=2))
    overhead = PromptOverhead()
    assert request_reservation(predicted, 4096, overhead) - request_reservation(plain, 4096, overhead) == \
        2 * len(CODE.encode())  # rejected prediction tokens are billed per sequence, at most its tokens


PREDICTED = [Token(index=0, token_id=5, text="def"),
             Finish(index=0, reason="eos_token", text="def", token_ids=[5], seed=1),
             Done(prompt_tokens=9, completion_tokens=7, compute_tokens=7, accepted_prediction_tokens=1,
                  rejected_prediction_tokens=6)]
DETAILS = {"reasoning_tokens": 0, "audio_tokens": 0, "accepted_prediction_tokens": 1, "rejected_prediction_tokens": 6}


async def test_usage_reports_accepted_and_rejected_prediction_tokens(gateway_app, worker):
    body = {"model": MODEL, "messages": USER, "max_tokens": 8, "prediction": {"type": "content", "content": CODE}}
    worker.replies = [Reply(PREDICTED), Reply(PREDICTED), Reply(PREDICTED)]
    whole = await gateway_app.post("/v1/chat/completions", json=body, headers=gateway_app.key_headers)
    assert whole.status_code == 200, whole.text
    usage = whole.json()["usage"]
    assert usage["completion_tokens_details"] == DETAILS and usage["completion_tokens"] == 7
    assert worker.requests[-1]["prediction"] == CODE
    streamed = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                      json={**body, "stream": True, "stream_options": {"include_usage": True}})
    chunks = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert chunks[-1]["usage"]["completion_tokens_details"] == DETAILS
    completion = await gateway_app.post("/v1/completions", headers=gateway_app.key_headers,
                                        json={"model": MODEL, "prompt": "def", "max_tokens": 8,
                                              "prediction": {"type": "content", "content": CODE}})
    assert completion.json()["usage"]["completion_tokens_details"] == DETAILS


RESPONSE_DETAILS = {"reasoning_tokens": 0, "accepted_prediction_tokens": 1, "rejected_prediction_tokens": 6}


async def test_responses_usage_reports_them_whole_streamed_and_in_the_ledger(gateway_app, worker):
    body = {"model": MODEL, "input": "Rename x to y", "max_output_tokens": 8,
            "prediction": {"type": "content", "content": CODE}}
    worker.replies = [Reply(PREDICTED), Reply(PREDICTED), Reply(PREDICTED)]
    whole = await gateway_app.post("/v1/responses", json=body, headers=gateway_app.key_headers)
    assert whole.status_code == 200, whole.text
    usage = whole.json()["usage"]
    assert usage["output_tokens_details"] == RESPONSE_DETAILS and usage["output_tokens"] == 7
    assert worker.requests[-1]["prediction"] == CODE
    record = await record_of(gateway_app, whole.headers["x-request-id"])
    assert (record["accepted_prediction_tokens"], record["rejected_prediction_tokens"],
            record["completion_tokens"]) == (1, 6, 7)
    streamed = await gateway_app.post("/v1/responses", json={**body, "stream": True}, headers=gateway_app.key_headers)
    events = [json.loads(line[6:]) for line in streamed.text.splitlines() if line.startswith("data: {")]
    assert events[-1]["response"]["usage"]["output_tokens_details"] == RESPONSE_DETAILS
    plain = await gateway_app.post("/v1/responses", json={**body, "prediction": None}, headers=gateway_app.key_headers)
    assert plain.json()["usage"]["output_tokens_details"] == {"reasoning_tokens": 0}  # without one: its old shape


async def test_the_ledger_records_the_prediction_tokens_the_client_was_told(gateway_app, worker):
    # two prompts: two Done events, summed as the usage sums them
    worker.replies = [Reply(PREDICTED), Reply(PREDICTED), Reply(PREDICTED)]
    answers = [await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                      json={"model": MODEL, "messages": USER, "max_tokens": 8,
                                            "prediction": {"type": "content", "content": CODE}}),
               await gateway_app.post("/v1/completions", headers=gateway_app.key_headers,
                                      json={"model": MODEL, "prompt": ["def", "class"], "max_tokens": 8,
                                            "prediction": {"type": "content", "content": CODE}})]
    for answer in answers:
        assert answer.status_code == 200, answer.text
        told = answer.json()["usage"]
        record = await record_of(gateway_app, answer.headers["x-request-id"])
        assert (record["accepted_prediction_tokens"], record["rejected_prediction_tokens"],
                record["completion_tokens"]) == (told["completion_tokens_details"]["accepted_prediction_tokens"],
                                                 told["completion_tokens_details"]["rejected_prediction_tokens"],
                                                 told["completion_tokens"])
    assert [a.json()["usage"]["completion_tokens_details"]["rejected_prediction_tokens"] for a in answers] == [6, 12]
    # the team's own records carry them; another team's key sees none of them
    ids = {a.headers["x-request-id"] for a in answers}
    mine = (await gateway_app.get("/v1/usage/requests?limit=100", headers=gateway_app.key_headers)).json()["data"]
    assert {(r["accepted_prediction_tokens"], r["rejected_prediction_tokens"]) for r in mine
            if r["request_id"] in ids} == {(1, 6), (2, 12)}
    other_team = (await gateway_app.post("/admin/teams", headers=gateway_app.admin_headers,
                                         json={"name": "other"})).json()["id"]
    theirs = (await gateway_app.post("/admin/keys", headers=gateway_app.admin_headers,
                                     json={"name": "theirs", "team_id": other_team})).json()["key"]
    listed = await gateway_app.get("/v1/usage/requests?limit=100", headers={"authorization": f"Bearer {theirs}"})
    assert listed.status_code == 200 and not ids & {r["request_id"] for r in listed.json()["data"]}


async def test_prediction_counts_a_worker_overstates_are_cut_to_the_completion(gateway_app, worker):
    overstated = [*PREDICTED[:2], Done(prompt_tokens=9, completion_tokens=4, compute_tokens=4,
                                       accepted_prediction_tokens=3, rejected_prediction_tokens=9)]
    worker.replies = [Reply(overstated)]
    answer = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                    json={"model": MODEL, "messages": USER, "max_tokens": 8,
                                          "prediction": {"type": "content", "content": CODE}})
    assert answer.status_code == 200, answer.text
    record = await record_of(gateway_app, answer.headers["x-request-id"])
    assert (record["accepted_prediction_tokens"], record["rejected_prediction_tokens"]) == (0, 4)


@pytest.mark.parametrize("route, body", [("/v1/chat/completions", {"messages": USER}),
                                         ("/v1/responses", {"input": "Rename x to y"})], ids=["chat", "responses"])
async def test_a_malformed_prediction_gets_openais_400_envelope(gateway_app, worker, route, body):
    for prediction in ({"type": "content", "content": [{"type": "image_url"}]}, ["not", "an", "object"],
                       {"type": "file", "content": CODE}):
        response = await gateway_app.post(route, headers=gateway_app.key_headers,
                                          json={"model": MODEL, **body, "prediction": prediction})
        assert response.status_code == 400, response.text
        error = response.json()["error"]
        assert error["type"] == "invalid_request_error" and error["param"] == "prediction"
    assert worker.requests == []


async def test_without_a_prediction_usage_keeps_its_shape(gateway_app, worker):
    worker.replies = [Reply(PREDICTED[:2] + [Done(prompt_tokens=9, completion_tokens=1, compute_tokens=1)])]
    response = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                      json={"model": MODEL, "messages": USER, "max_tokens": 8})
    assert "completion_tokens_details" not in response.json()["usage"]


@pytest.mark.parametrize("route, body", [("/v1/chat/completions", {"messages": USER, "max_tokens": 8}),
                                         ("/v1/responses", {"input": "Rename x", "max_output_tokens": 8})],
                         ids=["chat", "responses"])
async def test_a_prediction_too_long_for_the_context_is_openais_400(gateway_app, worker, route, body):
    worker.replies = [Reply(status=422, error=Error(kind="too_long", field="prediction", max_context=4096,
                                                   message="the prediction has 5000 tokens; this model's context "
                                                           "is 4096 tokens"))]
    response = await gateway_app.post(route, headers=gateway_app.key_headers,
                                      json={"model": MODEL, **body,
                                            "prediction": {"type": "content", "content": "x " * 5000}})
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and "context" in error["message"], error
    assert error["code"] == "context_length_exceeded" and error["param"] == "prediction", error
