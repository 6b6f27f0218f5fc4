"""Structured output through the worker HTTP API of a real engine: valid requests stream valid JSON,
invalid constraints are a 422 naming the problem before anything reaches the batch."""

from __future__ import annotations

import json
import time

import msgspec
import pytest
from litestar.testing import AsyncTestClient

from common.protocol import (
    Constraint,
    Finish,
    GenerateRequest,
    ModelInfo,
    SamplingParams,
    decode_event,
)
from tests.worker.grammar.helpers import HANG_GUARD_S, compiles_held
from worker.server import create_worker_app

PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 20}}, "required": ["name"]}


@pytest.fixture(scope="module")
def app(grammar_engine):
    info = ModelInfo(model_id="smol", model_dtype="float32", device="cpu", quantization="none", max_context=768,
                     max_rows=16, vocab_size=grammar_engine.vocab_size, eos_token_ids=grammar_engine.model_eos)
    return create_worker_app(grammar_engine, info)


def body(kind: str, value: str = "", **params) -> bytes:
    request = GenerateRequest(request_id=f"http-{time.time_ns()}", model="smol", prompt="Answer:",
                              params=SamplingParams(max_tokens=60, constraint=Constraint(kind, value), **params))
    return msgspec.json.encode(request)


async def post(app, payload: bytes):
    async with AsyncTestClient(app=app, timeout=HANG_GUARD_S) as client:
        return await client.post("/generate", content=payload, headers={"content-type": "application/json"})


async def test_valid_schema_streams_a_valid_object(app):
    response = await post(app, body("json_schema", json.dumps(PERSON), temperature=0.0))
    assert response.status_code == 200
    events = [decode_event(line.encode()) for line in response.text.splitlines() if line]
    finish = next(e for e in events if isinstance(e, Finish))
    assert finish.reason == "eos_token" and not finish.incomplete
    assert isinstance(json.loads(finish.text)["name"], str)


INVALID = [
    ("json_schema", "{not json", "not valid JSON"),
    ("json_schema", "[1, 2]", "must be an object"),
    ("json_schema", '{"type": 5}', "invalid JSON schema"),
    ("json_schema", '{"type": "object", "properties": {"a": {"not": {"type": "string"}}}}',
     "unsupported schema feature at #/properties/a/not"),
    ("json_schema", '{"type": "array", "uniqueItems": true}', "'uniqueItems' is not supported"),
    ("json_schema", '{"$ref": "https://example.com/schema.json"}', "only local references"),
    ("json_schema", '{"$ref": "#/$defs/missing"}', "missing"),
    ("json_schema", '{"type": "integer", "minimum": 5, "maximum": 1}', "minimum greater than maximum"),
    ("regex", "[a-", "invalid regex"),
    ("regex", "(?=a)b", "Lookahead is not supported"),
    ("regex", "", "the regex is empty"),
    ("ebnf", 'root ::= foo', 'Rule "foo" is not defined'),
    ("ebnf", "root := 'a'", "invalid EBNF grammar"),
]


@pytest.mark.parametrize("kind,value,needle", INVALID, ids=[f"{k}-{i}" for i, (k, _, _) in enumerate(INVALID)])
async def test_invalid_constraint_is_422(app, grammar_engine, kind, value, needle):
    rows_before = grammar_engine.load().running_rows + grammar_engine.load().queued
    response = await post(app, body(kind, value))
    assert response.status_code == 422, response.text
    error = response.json()
    assert error["kind"] == "validation" and error["field"] == "response_format"
    assert needle in error["message"], error["message"]
    assert grammar_engine.load().running_rows + grammar_engine.load().queued <= rows_before


async def test_beam_search_with_a_constraint_is_refused(app):
    response = await post(app, body("json_object", num_beams=2, n=1))
    assert response.status_code == 422, response.text
    error = response.json()  # decided: refused (the beam rules check this before the grammar is compiled)
    assert error["field"] in ("response_format", "constraint"), error
    assert "beam search" in error["message"] and "structured output" in error["message"]


async def test_min_tokens_with_a_constraint_is_refused(app):
    response = await post(app, body("regex", "(yes|no)", min_tokens=3))
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "min_tokens"


async def test_compile_time_limit_is_a_422(app, grammar_engine):
    schema = {"type": "object", "properties": {f"k{i}": {"type": "string", "format": "date-time"} for i in range(20)},
              "title": f"slow-{time.time_ns()}"}  # a schema never compiled before
    saved = grammar_engine.grammars.timeout_s
    grammar_engine.grammars.timeout_s = 0.000001
    try:
        with compiles_held(grammar_engine.grammars):  # the compile cannot beat the limit on any machine
            response = await post(app, body("json_schema", json.dumps(schema)))
    finally:
        grammar_engine.grammars.timeout_s = saved
    assert response.status_code == 422, response.text
    assert response.json()["field"] == "response_format"
    assert "took longer than" in response.json()["message"]
