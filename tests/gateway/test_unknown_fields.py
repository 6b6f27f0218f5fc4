"""Unknown body keys, per dialect as its real server treats them: the OpenAI routes answer 400 (a misspelt
`max_token` must not pass for a request without it), Friendli's, MonsterAPI's, TGI's and DataCrunch's ignore
them (FastAPI / serde defaults), SGLang ignores unknown top-level keys and refuses unknown `sampling_params`."""

from __future__ import annotations

import openai
import pytest

from testkit.protocol_worker import MODEL
from tests.gateway.generation_bodies import body

OPENAI_ROUTES = ["/v1/completions", "/v1/chat/completions"]
IGNORING_ROUTES = ["/serverless/v1/completions", "/serverless/v1/chat/completions", "/v1/generate",
                   "/generate_stream", "/v1/completions/generate", "/generate"]


@pytest.mark.parametrize("path", OPENAI_ROUTES)
async def test_the_openai_routes_refuse_an_unknown_key(gateway_app, worker, path):
    response = await gateway_app.post(path, json=body(path, max_token=5), headers=gateway_app.key_headers)
    assert response.status_code == 400, response.text
    assert response.json()["error"] == {"message": "Unrecognized request argument supplied: max_token",
                                        "type": "invalid_request_error", "param": "max_token",
                                        "code": "unknown_parameter"}
    assert worker.requests == []


@pytest.mark.parametrize("path", OPENAI_ROUTES)
async def test_the_openai_routes_take_null_unknown_keys_and_openai_parameters_that_change_nothing(
        gateway_app, path):
    extras = {"tool_prompt": None, "store": False, "metadata": {"run": "7"}, "service_tier": "auto"}
    response = await gateway_app.post(path, json=body(path, **extras), headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", IGNORING_ROUTES)
async def test_the_other_dialects_ignore_unknown_top_level_keys(gateway_app, path):
    response = await gateway_app.post(path, json=body(path, max_token=5, misc={"a": 1}),
                                      headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text


@pytest.mark.parametrize("path", ["/generate_stream", "/v1/completions/generate"])
async def test_tgi_ignores_unknown_parameters(gateway_app, path):
    response = await gateway_app.post(path, json=body(path, parameters={"max_token": 5}),
                                      headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text


async def test_sglang_refuses_an_unknown_sampling_param(gateway_app, worker):
    for sampling in ({"max_tokens": 5}, [{"max_new_tokens": 2}, {"max_tokens": 5}]):
        text = "Hi" if isinstance(sampling, dict) else ["Hi", "there"]
        response = await gateway_app.post("/generate", json={"text": text, "sampling_params": sampling},
                                      headers=gateway_app.key_headers)
        assert response.status_code == 400, response.text
        assert response.json()["param"] == "max_tokens" and "unexpected keyword" in response.json()["message"]
    assert worker.requests == []


async def test_the_openai_sdk_gets_a_bad_request_for_a_misspelt_extra_body_key(gateway_app):
    client = openai.AsyncOpenAI(base_url=f"{gateway_app.base_url}/v1", api_key="unused", http_client=gateway_app,
                                default_headers=gateway_app.key_headers, max_retries=0)
    reply = await client.completions.create(model=MODEL, prompt="Hi", extra_body={"top_k": 5, "ignore_eos": True},
                                            stream_options=None)
    assert reply.choices[0].text
    with pytest.raises(openai.BadRequestError, match="max_token"):
        await client.completions.create(model=MODEL, prompt="Hi", extra_body={"max_token": 5})


async def test_the_openapi_document_says_which_routes_refuse_unknown_keys(gateway_app):
    paths = (await gateway_app.get("/openapi/openapi.json")).json()["paths"]

    def closed(path: str):
        return paths[path]["post"]["requestBody"]["content"]["application/json"]["schema"].get("additionalProperties")

    assert closed("/v1/completions") is False and closed("/v1/chat/completions") is False
    assert closed("/serverless/v1/completions") is None
