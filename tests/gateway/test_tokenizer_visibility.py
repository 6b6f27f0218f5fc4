"""`/tokenize` (TGI and SGLang bodies) and `/detokenize` over the real app see the endpoints a generation sees:
another team's private endpoint does not exist for the caller (404, even named outright), a body that names no
model gets the first endpoint the caller may see (not the first one served), and the key's allow-list holds (403).
The first endpoint served here is another team's private one, on a worker that is never up: were it picked, the
call would wait for that worker until the endpoint's max_wait_seconds and answer a 503."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import msgspec
import pytest

from gateway.endpoints.spec import EndpointSpec, StaticProvisioning
from testkit.protocol_worker import MODEL
from testkit.sluice import create_team_offline
from tests.gateway.app_client import app_client, new_key
from tests.gateway.route_table import envelope

PRIVATE = "org/private"
DOWN = "http://127.0.0.1:9"  # the discard port: nothing listens there
TGI_SPANS = [{"id": 0, "text": "Hi", "start": 0, "stop": 2}, {"id": 1, "text": "there", "start": 3, "stop": 8}]
# (path, body, answer, a path whose error envelope the call answers in: a TGI body TGI's, an SGLang body SGLang's)
CALLS = [("/tokenize", {"inputs": "Hi there"}, TGI_SPANS, "/tokenize"),
         ("/tokenize", {"text": "Hi there"}, {"tokens": [0, 1], "count": 2, "max_model_len": 2048}, "/detokenize"),
         ("/detokenize", {"tokens": [5, 7]}, {"text": "<5> <7>"}, "/detokenize")]


@pytest.fixture
async def app_with_private_endpoint(gateway_settings, worker):
    another_team = create_team_offline(Path(gateway_settings.data_dir), "another-team")
    private = EndpointSpec(name=PRIVATE, provisioner=StaticProvisioning(urls=[DOWN]), team_id=another_team)
    models = [private, EndpointSpec(name=MODEL, provisioner=StaticProvisioning(urls=[worker.url]))]
    async with app_client(msgspec.structs.replace(gateway_settings, models=models)) as client:
        deadline = time.monotonic() + 120  # ready first: a call would wait for it (gateway/serving/worker_client.py)
        while (await client.get(f"/admin/endpoints/{MODEL}", headers=client.admin_headers)).json()["state"] != "ready":
            assert time.monotonic() < deadline, "the worker never became ready"
            await asyncio.sleep(0.02)
        yield client


@pytest.mark.parametrize(("path", "body", "answer", "dialect_path"), CALLS)
async def test_tokenizer_routes_see_what_a_generation_sees(app_with_private_endpoint, worker, path, body, answer,
                                                           dialect_path):
    reply = await app_with_private_endpoint.post(path, json=body, headers=app_with_private_endpoint.key_headers)
    assert reply.status_code == 200 and reply.json() == answer, reply.text
    assert worker.tokenizer_calls == [path]
    named = await app_with_private_endpoint.post(path, json={**body, "model": MODEL},
                                                 headers=app_with_private_endpoint.key_headers)
    assert named.status_code == 200 and named.json() == answer, named.text
    hidden = await app_with_private_endpoint.post(path, json={**body, "model": PRIVATE},
                                                  headers=app_with_private_endpoint.key_headers)
    assert hidden.status_code == 404 and PRIVATE in envelope(dialect_path, hidden.json())["message"], hidden.text
    barred = await app_with_private_endpoint.post(path, json=body, headers=await new_key(app_with_private_endpoint,
                                                                                         models=["some-other-model"]))
    assert barred.status_code == 403 and MODEL in envelope(dialect_path, barred.json())["message"], barred.text
    assert len(worker.tokenizer_calls) == 2


async def test_a_generation_that_names_no_model_gets_the_first_endpoint_the_caller_may_see(app_with_private_endpoint,
                                                                                           worker):
    for body in ({"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, {"text": "Hi"}):
        reply = await app_with_private_endpoint.post("/generate", json=body,
                                                     headers=app_with_private_endpoint.key_headers)
        assert reply.status_code == 200, reply.text
        assert worker.requests[-1]["model"] == MODEL
