"""huggingface_hub's InferenceClient against the real `sluice serve` (issue #34): its `chat_completion`
`response_format` forms constrain the worker to their schema (TGI's `{"type": "json", "value"}` and the
`json_schema` form, which the client sends on as `json_object` with `value`), and TGI error bodies carry the
`error_type` values it maps to typed errors: a validation error is its `ValidationError`, while a bad key is its
HTTP 401 error, not an `UnknownError`. The gateway serves the protocol worker: this is about the wire."""

from __future__ import annotations

import json

import pytest
from huggingface_hub import InferenceClient
from huggingface_hub.errors import HfHubHTTPError, UnknownError, ValidationError

from testkit.protocol_worker import Reply, tokens

SCHEMA = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}


@pytest.mark.parametrize("response_format", [
    {"type": "json", "value": SCHEMA},
    {"type": "json_schema", "json_schema": {"name": "place", "schema": SCHEMA}},
])
def test_chat_completion_response_format_constrains_to_the_schema(wire_served, response_format):
    server, worker = wire_served
    worker.replies = [Reply(tokens('{"city": "Paris"}'))]
    client = InferenceClient(base_url=server.url, api_key=server.api_key)
    reply = client.chat_completion(messages=[{"role": "user", "content": "Where?"}], max_tokens=8,
                                   response_format=response_format)
    assert json.loads(reply.choices[0].message.content) == {"city": "Paris"}
    constraint = worker.requests[-1]["params"]["constraint"]
    assert constraint["kind"] == "json_schema" and json.loads(constraint["value"]) == SCHEMA


def test_typed_errors(wire_served):
    server, worker = wire_served
    client = InferenceClient(base_url=server.url, api_key=server.api_key)
    with pytest.raises(ValidationError):
        client.text_generation("Hi", max_new_tokens=4, temperature=-1.0)
    bad = InferenceClient(base_url=server.url, api_key="sk-sluice-000000000000-nope")
    with pytest.raises(HfHubHTTPError) as info:
        bad.text_generation("Hi", max_new_tokens=4)
    assert info.value.response.status_code == 401 and not isinstance(info.value, UnknownError)
