"""Tenant <-> tenant at the grammar compiler, through the real `sluice serve` in front of a worker that plays the
protocol (testkit/protocol_worker.py, which records every GenerateRequest it receives):

- every request the gateway sends names its billed team as the tenant (an opaque stable tag, not the team id), so
  the worker's per-tenant fair queue of grammar compiles (worker/decoding/grammar/fair_queue.py) and its fair
  admission turns (worker/engine/fair_turns.py) see who is who;
- a grammar over MAX_GRAMMAR_BYTES or with an enum over MAX_ENUM_VALUES values is refused at the gateway, on every
  path that yields one (response_format, TGI grammar, SGLang json_schema / regex / ebnf, tools), with the
  dialect's validation error naming the limit; nothing reaches a worker.

The worker's side (compiles killed when they overrun, the cache bounded in bytes) is in
tests/worker/grammar/test_compile_bounds.py.
"""

from __future__ import annotations

import json

import httpx
import pytest

from gateway.dialects import bounds
from testkit.admin import admin
from testkit.protocol_worker import MODEL, sluice_on_protocol_worker

ADMIN_KEY = "grammar-security-admin-key-0123456789abcdef"
CHAT = {"model": MODEL, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
WIDE = {"type": "object", "properties": {"v": {"enum": [f"v{i}" for i in range(bounds.MAX_ENUM_VALUES + 1)]}}}
BIG = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(700)}}
MEDIUM = {"type": "object", "properties": {f"p{i}": {"type": "string", "description": "x" * 100} for i in range(100)}}
WIDE_TEXT = json.dumps(WIDE)
BIG_REGEX = "(a|b)" * (bounds.MAX_GRAMMAR_BYTES // 5 + 1)


def tool(parameters: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": "pick", "parameters": parameters}}]


OPENAI = ("/v1/chat/completions", "/v1/completions")
OVER = [  # (path, body, the limit named)
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "w",
                                                                                                "schema": WIDE}}},
     "MAX_ENUM_VALUES"),
    ("/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object", "schema": BIG}}, "MAX_GRAMMAR_BYTES"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "response_format": {"type": "json_schema",
                                                                              "schema": WIDE_TEXT}}, "MAX_ENUM_VALUES"),
    ("/v1/completions", {"model": MODEL, "prompt": "Hi", "response_format": {"type": "regex", "schema": BIG_REGEX}},
     "MAX_GRAMMAR_BYTES"),
    ("/serverless/v1/chat/completions", {**CHAT, "response_format": {"type": "json_object", "schema": WIDE}},
     "MAX_ENUM_VALUES"),
    ("/v1/chat/completions", {**CHAT, "tools": tool({"type": "object", "properties": {"v": WIDE}})},
     "MAX_ENUM_VALUES"),
    ("/v1/chat/completions", {**CHAT, "tools": tool(BIG)}, "MAX_GRAMMAR_BYTES"),
    ("/v1/chat/completions", {**CHAT, "tools": [tool(MEDIUM)[0] | {"function": {"name": f"f{j}", "parameters": MEDIUM}}
                                                for j in range(7)]}, "MAX_GRAMMAR_BYTES"),  # each under, all over
    ("/v1/completions/generate", {"inputs": "Hi", "parameters": {"grammar": {"type": "json", "value": WIDE}}},
     "MAX_ENUM_VALUES"),
    ("/generate_stream", {"inputs": "Hi", "parameters": {"grammar": {"type": "regex", "value": BIG_REGEX}}},
     "MAX_GRAMMAR_BYTES"),
    ("/generate", {"text": "Hi", "sampling_params": {"json_schema": WIDE_TEXT}}, "MAX_ENUM_VALUES"),
    ("/generate", {"text": "Hi", "sampling_params": {"regex": BIG_REGEX}}, "MAX_GRAMMAR_BYTES"),
    ("/generate", {"text": "Hi", "sampling_params": {"ebnf": 'root ::= "a"' + ' | "a"' * 12_000}},
     "MAX_GRAMMAR_BYTES"),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    with sluice_on_protocol_worker(tmp_path_factory.mktemp("grammar"), ADMIN_KEY,
                                   settings="default_team_limits = {}\n") as pair:
        yield pair


@pytest.fixture(scope="module")
def teams(served) -> dict[str, tuple[str, dict]]:
    """name -> (team id, the headers of a service key of it)."""
    server, _ = served
    found = {}
    for name in ("grammar-a", "grammar-b"):
        team = admin(server, "POST", "/admin/teams", name=name)
        key = admin(server, "POST", "/admin/keys", name=f"{name}-key", team_id=team["id"])["key"]
        found[name] = team["id"], {"authorization": f"Bearer {key}"}
    return found


def post(server, path: str, body: dict, headers: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers=headers, timeout=60)


def test_every_request_to_a_worker_names_the_billed_team_as_its_tenant(served, teams):
    server, worker = served
    tenants = {}
    for name, (team_id, headers) in teams.items():
        before = len(worker.requests)
        assert post(server, "/v1/completions", {"model": MODEL, "prompt": ["a", "b"], "max_tokens": 2},
                    headers).status_code == 200
        assert post(server, "/v1/chat/completions", CHAT, headers).status_code == 200
        assert post(server, "/generate", {"text": "Hi"}, headers).status_code == 200
        sent = {request["tenant"] for request in worker.requests[before:]}
        assert len(worker.requests) - before == 4 and len(sent) == 1, sent  # every prompt, every dialect: one tag
        tenant = sent.pop()
        assert tenant and team_id not in tenant  # opaque: the worker never learns the team's id
        tenants[name] = tenant
    assert tenants["grammar-a"] != tenants["grammar-b"]
    _, headers = teams["grammar-a"]
    before = len(worker.requests)
    assert post(server, "/v1/completions", {"model": MODEL, "prompt": "again", "max_tokens": 2},
                headers).status_code == 200
    assert worker.requests[before]["tenant"] == tenants["grammar-a"]  # stable across requests


@pytest.mark.parametrize(("path", "body", "limit"), OVER, ids=[f"{p} {i}" for i, (p, _, _) in enumerate(OVER)])
def test_an_oversized_grammar_is_refused_naming_the_limit(served, teams, path, body, limit):
    server, worker = served
    _, headers = teams["grammar-a"]
    before = len(worker.requests)
    response = post(server, path, body, headers)
    # OpenAI and SGLang refuse a bad request with 400; TGI, DataCrunch and FriendliAI with 422
    assert response.status_code == (400 if path in ("/generate", *OPENAI) else 422), response.text
    assert limit in response.text
    answer = response.json()
    if path in OPENAI:
        assert answer["error"]["type"] == "invalid_request_error" and answer["error"]["param"]
    elif path == "/generate":
        assert answer["object"] == "error"
    elif path.startswith("/serverless"):
        assert answer["detail"][0]["loc"][0] == "body"
    else:
        assert answer["error_type"] == "validation"  # TGI
    assert len(worker.requests) == before  # refused before any worker saw it


def test_a_grammar_at_the_bounds_is_served(served, teams):
    server, worker = served
    _, headers = teams["grammar-b"]
    at_limit = {"type": "object", "properties": {"v": {"enum": [f"v{i}" for i in range(bounds.MAX_ENUM_VALUES)]}}}
    body = {**CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "w", "schema": at_limit}}}
    before = len(worker.requests)
    assert post(server, "/v1/chat/completions", body, headers).status_code == 200
    assert worker.requests[before]["params"]["constraint"]["value"] == json.dumps(at_limit, separators=(",", ":"))
