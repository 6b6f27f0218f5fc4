"""MonsterAPI `/v1/generate` with the real `monsterapi` LLMClient (own venv): the body it sends (every
field, `formatted_prompt`), our response schema, beam search, `messages`, and `mock_response`, which
never reaches a worker and is never counted against limits."""

from __future__ import annotations

import httpx
import pytest

from gateway.dialects.monster.dialect import MOCK_TEXT
from testkit.sluice import MODEL
from tests.compat.sdk_pins import MONSTERAPI
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

PRELUDE = """
import json, os
from monsterapi.nextGenLLMClient import GenerateRequest, LLMClient
c = LLMClient(api_key=os.environ["KEY"], base_url=os.environ["URL"] + "/v1")
M = os.environ["MODEL"]
def request(**kw):  # `model` is a client-side Literal of four hosted names: build without validation
    return GenerateRequest.model_construct(**{**GenerateRequest().model_dump(), "model": M, **kw})
"""


def run(server, body: str, key: str | None = None):
    return run_in_venv("monsterapi", MONSTERAPI, PRELUDE + body,
                       {"URL": server.url, "KEY": key or server.api_key, "MODEL": MODEL})


def check_schema(reply: dict, n: int) -> None:
    assert {"id", "object", "created", "model", "text", "choices", "usage"} <= set(reply)
    assert len(reply["text"]) == len(reply["choices"]) == n
    assert [c["text"] for c in reply["choices"]] == reply["text"]
    assert all(c["finish_reason"] in ("stop", "length") for c in reply["choices"])
    usage = reply["usage"]
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]


def test_client_generate_formatted_prompt_and_messages(sluice_on_smol):
    out = run(sluice_on_smol, """
a = c.generate(request(formatted_prompt="The capital of France is", max_tokens=5, temperature=0.0, n=2))
b = c.generate(request(messages=[{"role": "user", "content": "Hi"}], max_tokens=4, top_k=5, min_p=0.05))
print(json.dumps({"a": a, "b": b}))
""")
    check_schema(out["a"], 2)
    assert out["a"]["text"][0] == out["a"]["text"][1]  # temperature 0: both choices greedy
    assert 0 < out["a"]["usage"]["completion_tokens"] <= 10
    check_schema(out["b"], 1)
    assert out["b"]["usage"]["prompt_tokens"] > 10  # the chat template wraps the message


def test_client_beam_search(sluice_on_smol):
    out = run(sluice_on_smol, """
print(json.dumps(c.generate(request(formatted_prompt="Hello", max_tokens=4, use_beam_search=True, best_of=3, n=2,
                                    temperature=0.0, length_penalty=1.0, early_stopping=True))))
""")
    check_schema(out, 2)


def test_mock_response_skips_worker_and_limits(sluice_on_smol):
    admin = {"authorization": f"Bearer {sluice_on_smol.admin_key}"}
    team = httpx.post(f"{sluice_on_smol.url}/admin/teams", json={"name": "monster", "limits": {"rpm": 1}},
                      headers=admin).json()
    key = httpx.post(f"{sluice_on_smol.url}/admin/keys", json={"name": "m", "team_id": team["id"]},
                     headers=admin).json()["key"]
    done_before = len(sluice_on_smol.log_events("request_done"))
    out = run(sluice_on_smol, """
import requests
first = c.generate(request(formatted_prompt="Hi", max_tokens=2))
mocks = [c.generate(request(formatted_prompt="Hi", mock_response=True, n=2)) for _ in range(3)]
try:
    c.generate(request(formatted_prompt="Hi", max_tokens=2))
    limited = None
except requests.HTTPError as e:
    limited = e.response.status_code
print(json.dumps({"first": first, "mocks": mocks, "limited": limited}))
""", key=key)
    check_schema(out["first"], 1)
    for mock in out["mocks"]:
        check_schema(mock, 2)
        assert mock["text"] == [MOCK_TEXT, MOCK_TEXT] and mock["usage"]["total_tokens"] == 0
    assert out["limited"] == 429  # rpm 1: the real request counted, the three mocks did not
    done = sluice_on_smol.log_events_once("request_done", lambda found: len(found) >= done_before + 2)[done_before:]
    assert len(done) == 2  # only the two real requests were accounted (ok + rejected)


@pytest.mark.parametrize(("body", "param"), [
    ({"prompt": "x", "top_k": 0}, "top_k"),
    ({"max_tokens": 5}, "prompt"),
    ({"prompt": "x", "formatted_prompt": "y"}, "prompt"),
    ({"prompt": "x", "use_beam_search": True}, "best_of"),
])
def test_validation_errors(sluice_on_smol, body, param):
    response = httpx.post(f"{sluice_on_smol.url}/v1/generate", json={"model": MODEL, **body},
                          headers={"authorization": f"Bearer {sluice_on_smol.api_key}"})
    assert response.status_code == 422 and response.json()["error"]["param"] == param


def test_stream(sluice_on_smol):
    response = httpx.post(f"{sluice_on_smol.url}/v1/generate", json={"model": MODEL, "prompt": "Hi", "max_tokens": 3,
                                                                      "stream": True},
                          headers={"authorization": f"Bearer {sluice_on_smol.api_key}"}, timeout=60)
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.text.rstrip().endswith("data: [DONE]")
