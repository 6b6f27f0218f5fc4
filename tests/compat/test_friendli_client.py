"""friendli-client 1.5.8 (the legacy SDK) in its own venv: it sends every field, nulls included, and parses
the legacy `token_sampled`/`complete` stream; on /v1 (container) and /serverless paths."""

from __future__ import annotations

import httpx
import pytest

from testkit.sluice import MODEL
from tests.compat.sdk_pins import FRIENDLI_CLIENT
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

PRELUDE = """
import json, os
from friendli import Friendli
URL, KEY, M = os.environ["URL"], os.environ["KEY"], os.environ["MODEL"]
def dump(x):
    return json.loads(x.model_dump_json())
"""


@pytest.fixture(scope="module")
def env(sluice_on_smol):
    return {"URL": sluice_on_smol.url, "KEY": sluice_on_smol.api_key, "MODEL": MODEL}


def run(env, body: str):
    return run_in_venv("friendli-client", FRIENDLI_CLIENT, PRELUDE + body, env)


@pytest.mark.parametrize("prefix", ["", "/serverless"])
def test_legacy_completions_streamed_and_not(env, prefix):
    out = run({**env, "PREFIX": prefix}, """
c = Friendli(token=KEY, base_url=URL + os.environ["PREFIX"])
kw = dict(model=M, prompt="The capital of France is", max_tokens=6, temperature=0.0, seed=[9])
plain = c.completions.create(**kw)
lines = [dump(line) for line in c.completions.create(**kw, stream=True)]
final = c.completions.create(**kw, stream=True).wait()
print(json.dumps({"plain": dump(plain), "lines": lines, "final": dump(final)}))
""")
    choice = out["plain"]["choices"][0]
    assert choice["seed"] == 9 and choice["tokens"] and out["plain"]["usage"]["completion_tokens"] <= 6
    assert all(line["event"] == "token_sampled" for line in out["lines"])
    assert [line["token"] for line in out["lines"]] == choice["tokens"]
    assert "".join(line["text"] for line in out["lines"]) == choice["text"]
    assert out["final"]["choices"][0]["text"] == choice["text"]
    assert out["final"]["usage"] == out["plain"]["usage"]


def test_container_call_without_a_model_gets_the_default_model(env):
    out = run(env, """
c = Friendli(token=KEY, base_url=URL)
print(json.dumps(dump(c.completions.create(prompt="The capital of France is", max_tokens=4, temperature=0.0))))
""")
    assert out["choices"][0]["tokens"] and out["usage"]["completion_tokens"] <= 4


def test_beam_fields_are_accepted(env):
    out = run(env, """
c = Friendli(token=KEY, base_url=URL)
reply = c.completions.create(model=M, prompt="Hello", max_tokens=4, num_beams=2, length_penalty=1.0,
                             early_stopping=True, beam_search_type="DETERMINISTIC",
                             beam_compat_pre_normalization=True, beam_compat_no_post_normalization=False,
                             no_repeat_ngram=2, timeout_microseconds=30_000_000)
print(json.dumps(dump(reply)))
""")
    assert out["choices"][0]["tokens"] and out["usage"]["completion_tokens"] >= 1


def test_legacy_client_errors(env):
    out = run(env, """
from friendli.errors import APIError
c = Friendli(token=KEY, base_url=URL)
try:
    c.completions.create(model=M, prompt="x", max_tokens=2, max_total_tokens=9)
    result = None
except APIError as e:
    result = str(e)
print(json.dumps(result))
""")
    assert out and "max_total_tokens" in out


def test_legacy_chat(env):
    out = run(env, """
c = Friendli(token=KEY, base_url=URL)
reply = c.chat.completions.create(model=M, messages=[{"role": "user", "content": "Hi"}], max_tokens=4)
chunks = [dump(ch) for ch in c.chat.completions.create(model=M, messages=[{"role": "user", "content": "Hi"}],
                                                       max_tokens=4, stream=True)]
print(json.dumps({"reply": dump(reply), "chunks": chunks}))
""")
    assert out["reply"]["choices"][0]["message"]["content"]
    assert out["chunks"][0]["choices"][0]["delta"]["role"] == "assistant"


def test_raw_legacy_stream_has_nothing_after_complete(sluice_on_smol):
    """The X-API-Dialect header selects the legacy stream too; no `[DONE]`, no `event:` lines."""
    response = httpx.post(f"{sluice_on_smol.url}/serverless/v1/completions",
                          headers={"authorization": f"Bearer {sluice_on_smol.api_key}",
                                   "x-api-dialect": "friendli-legacy"},
                          json={"model": MODEL, "prompt": "Hi", "max_tokens": 3, "stream": True, "n": 2}, timeout=60)
    assert response.headers["content-type"].startswith("text/event-stream")
    lines = [line for line in response.text.splitlines() if line]
    assert all(line.startswith("data: {") for line in lines)
    assert '"event":"complete"' in lines[-1] and '"token"' not in lines[-1]
    assert sum('"event":"token_sampled"' in line for line in lines) == 6
