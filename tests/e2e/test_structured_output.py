"""Structured output end to end through every dialect: `sluice serve`, the real model, outputs validated.

OpenAI (`response_format`, with the real openai SDK), Friendli (`response_format`, object schema and regex),
SGLang (`sampling_params.json_schema` as a string, `regex`, `ebnf`), TGI (`parameters.grammar`).
A representative slice of the corpus goes through each dialect (the full corpus runs against the engine in
tests/worker/grammar); a cut output (finish "length") is accepted only when it is the length limit.
"""

from __future__ import annotations

import json
import re

import httpx
import jsonschema
import openai
import pytest

from testkit.corpora.grammar import EBNF, EBNF_PATTERN, REGEXES, SCHEMAS
from testkit.sluice import MODEL

pytestmark = pytest.mark.slow

PICKED = {"person", "nested_address", "color_enum", "bounded_int", "ref_defs", "format_date", "array_of_objects",
          "optional_fields"}
SLICE = [(n, s) for n, s in SCHEMAS if n in PICKED]
REGEX_SLICE = [(n, p) for n, p in REGEXES if n in {"phone", "iso_date", "choice_pair", "hex_color"}]
MAX = 200
FORMATS = jsonschema.Draft202012Validator.FORMAT_CHECKER


@pytest.fixture(scope="module")
def http(sluice_on_smol):
    with httpx.Client(base_url=sluice_on_smol.url, timeout=300,
                      headers={"Authorization": f"Bearer {sluice_on_smol.api_key}"}) as client:
        yield client


@pytest.fixture(scope="module")
def sdk(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0,
                         timeout=300)


def valid_json(text: str, schema: dict, finish: str) -> None:
    if finish == "length":
        return  # cut by max_tokens: the dialect says so with its length reason
    jsonschema.validate(json.loads(text), schema, format_checker=FORMATS)


def ask_for(name: str, schema: dict) -> str:
    return f"Reply with JSON only ({name.replace('_', ' ')}) following this schema: {json.dumps(schema)}"


# ---- OpenAI (real SDK) ----

@pytest.mark.parametrize("name,schema", SLICE, ids=[n for n, _ in SLICE])
def test_openai_json_schema(sdk, name, schema):
    reply = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ask_for(name, schema)}], max_tokens=MAX, temperature=0,
        response_format={"type": "json_schema", "json_schema": {"name": name, "schema": schema, "strict": True}})
    choice = reply.choices[0]
    assert choice.finish_reason in ("stop", "length")
    valid_json(choice.message.content, schema, choice.finish_reason)


def test_openai_json_object_sampled_n2(sdk):
    reply = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Describe a book as a JSON object."}], max_tokens=MAX,
        temperature=0.9, seed=3, n=2, response_format={"type": "json_object"})
    assert len(reply.choices) == 2
    for choice in reply.choices:
        if choice.finish_reason == "stop":
            assert isinstance(json.loads(choice.message.content), dict)


def test_openai_invalid_schema_is_refused(sdk):
    with pytest.raises(openai.APIStatusError) as caught:
        sdk.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=20,
            response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}})
    assert caught.value.status_code == 400
    assert "schema" in str(caught.value.message).lower()


# ---- Friendli ----

@pytest.mark.parametrize("name,schema", SLICE[:4], ids=[n for n, _ in SLICE[:4]])
def test_friendli_json_schema(http, name, schema):
    response = http.post("/serverless/v1/chat/completions", json={
        "model": MODEL, "messages": [{"role": "user", "content": ask_for(name, schema)}], "max_tokens": MAX,
        "temperature": 0.8, "seed": 5,
        "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    valid_json(choice["message"]["content"], schema, choice["finish_reason"])


@pytest.mark.parametrize("name,pattern", REGEX_SLICE, ids=[n for n, _ in REGEX_SLICE])
def test_friendli_regex(http, name, pattern):
    response = http.post("/serverless/v1/completions", json={
        "model": MODEL, "prompt": f"An example of a {name.replace('_', ' ')}:", "max_tokens": 60, "temperature": 0,
        "response_format": {"type": "regex", "schema": pattern}})
    assert response.status_code == 200, response.text
    choice = response.json()["choices"][0]
    if choice.get("finish_reason") != "length":
        assert re.fullmatch(pattern, choice["text"]), choice["text"]


def test_friendli_invalid_regex_is_422(http):
    response = http.post("/serverless/v1/completions", json={
        "model": MODEL, "prompt": "x", "max_tokens": 10, "response_format": {"type": "regex", "schema": "[a-"}})
    assert response.status_code == 422, response.text
    assert "regex" in response.text


# ---- SGLang ----

@pytest.mark.parametrize("name,schema", SLICE[4:], ids=[n for n, _ in SLICE[4:]])
def test_sglang_json_schema(http, name, schema):
    response = http.post("/generate", json={"text": ask_for(name, schema), "sampling_params": {
        "json_schema": json.dumps(schema), "max_new_tokens": MAX, "temperature": 0}})
    assert response.status_code == 200, response.text
    body = response.json()
    valid_json(body["text"], schema, body["meta_info"]["finish_reason"]["type"])


@pytest.mark.parametrize("name,pattern", REGEX_SLICE, ids=[n for n, _ in REGEX_SLICE])
def test_sglang_regex(http, name, pattern):
    response = http.post("/generate", json={"text": f"An example of a {name.replace('_', ' ')}:", "sampling_params": {
        "regex": pattern, "max_new_tokens": 60, "temperature": 0.7, "sampling_seed": 1}})
    assert response.status_code == 200, response.text
    body = response.json()
    if body["meta_info"]["finish_reason"]["type"] != "length":
        assert re.fullmatch(pattern, body["text"]), body["text"]


def test_sglang_ebnf(http):
    response = http.post("/generate", json={"text": "Is water wet?", "sampling_params": {
        "ebnf": EBNF, "max_new_tokens": 30, "temperature": 0}})
    assert response.status_code == 200, response.text
    assert re.fullmatch(EBNF_PATTERN, response.json()["text"]), response.json()["text"]


def test_sglang_invalid_ebnf_is_refused(http):
    response = http.post("/generate", json={"text": "x", "sampling_params": {"ebnf": "root ::= nowhere",
                                                                             "max_new_tokens": 5}})
    assert response.status_code == 400, response.text  # SGLang remaps validation errors to 400
    assert "nowhere" in response.text


# ---- TGI ----

@pytest.mark.parametrize("name,schema", SLICE, ids=[n for n, _ in SLICE])
def test_tgi_grammar_json(http, name, schema):
    response = http.post("/generate", json={"inputs": ask_for(name, schema), "parameters": {
        "grammar": {"type": "json", "value": schema}, "max_new_tokens": MAX, "details": True}})
    assert response.status_code == 200, response.text
    body = response.json()
    valid_json(body["generated_text"], schema, body["details"]["finish_reason"])


@pytest.mark.parametrize("name,pattern", REGEX_SLICE, ids=[n for n, _ in REGEX_SLICE])
def test_tgi_grammar_regex(http, name, pattern):
    response = http.post("/generate", json={"inputs": f"An example of a {name.replace('_', ' ')}:", "parameters": {
        "grammar": {"type": "regex", "value": pattern}, "max_new_tokens": 60, "details": True}})
    assert response.status_code == 200, response.text
    body = response.json()
    if body["details"]["finish_reason"] != "length":
        assert re.fullmatch(pattern, body["generated_text"]), body["generated_text"]


def test_tgi_unsupported_schema_is_422(http):
    response = http.post("/generate", json={"inputs": "x", "parameters": {
        "grammar": {"type": "json", "value": {"not": {"type": "string"}}}, "max_new_tokens": 5}})
    assert response.status_code == 422, response.text
    assert "not" in response.json()["error"]


@pytest.mark.parametrize(("path", "body", "choice_of"), [
    ("/v1/completions", {"prompt": "A person as JSON:"}, lambda r: r["choices"][0]),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "A person as JSON"}]},
     lambda r: r["choices"][0]),
])
def test_a_cut_constrained_output_says_it_is_incomplete(http, path, body, choice_of):
    schema = {"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
              "required": ["name", "age"]}
    response = http.post(path, json={"model": MODEL, "max_tokens": 3, "temperature": 0, **body,
                                     "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert response.status_code == 200, response.text
    choice = choice_of(response.json())
    assert choice["finish_reason"] == "length"
    assert choice["incomplete"] is True
    whole = http.post(path, json={"model": MODEL, "max_tokens": 120, "temperature": 0, **body,
                                  "response_format": {"type": "json_schema", "json_schema": {"schema": schema}}})
    assert "incomplete" not in choice_of(whole.json())
