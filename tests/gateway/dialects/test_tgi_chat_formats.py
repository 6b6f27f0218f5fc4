"""TGI's chat `response_format` as TGI reads it (issue #34): `{"type": "json_object", "value": schema}` — what
huggingface_hub's `chat_completion(response_format={"type": "json_schema", ...})` sends — and
`{"type": "json", "value": schema}` both constrain the worker to that schema; neither is dropped to "any JSON
object". Through the real gateway app; the protocol worker records the request the worker would run."""

from __future__ import annotations

import json

import pytest

from testkit.protocol_worker import MODEL

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Where?"}], "max_tokens": 8}


@pytest.mark.parametrize("kind", ["json_object", "json"])
async def test_tgi_response_format_constrains_to_its_schema(gateway_app, worker, kind):
    response = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                  json={**CHAT, "response_format": {"type": kind, "value": SCHEMA}})
    assert response.status_code == 200, response.text
    constraint = worker.requests[-1]["params"]["constraint"]
    assert constraint["kind"] == "json_schema" and json.loads(constraint["value"]) == SCHEMA


async def test_json_without_a_schema_is_refused_and_json_object_alone_is_any_object(gateway_app, worker):
    refused = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                                 json={**CHAT, "response_format": {"type": "json"}})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "response_format", refused.text
    assert worker.requests == []
    plain = await gateway_app.post("/v1/chat/completions", headers=gateway_app.key_headers,
                               json={**CHAT, "response_format": {"type": "json_object"}})
    assert plain.status_code == 200 and worker.requests[-1]["params"]["constraint"]["kind"] == "json_object"
