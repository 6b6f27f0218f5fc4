"""The current Friendli SDK (`friendli`, Speakeasy) in its own venv: serverless, dedicated and container
completions and chat, streamed and not, with the team header, and its error surface."""

from __future__ import annotations

import httpx
import pytest

from testkit.sluice import MODEL
from tests.compat.sdk_pins import FRIENDLI
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

PRELUDE = """
import json, os
from friendli import SyncFriendli
from friendli.core.utils.retries import BackoffStrategy, RetryConfig
URL, KEY, TEAM, M = os.environ["URL"], os.environ["KEY"], os.environ["TEAM"], os.environ["MODEL"]
c = SyncFriendli(token=KEY, server_url=URL)
NO_RETRY = RetryConfig("backoff", BackoffStrategy(100, 200, 1.5, 500), False)
def dump(x):
    return json.loads(x.model_dump_json())
"""


@pytest.fixture(scope="module")
def env(sluice_on_smol):
    teams = httpx.get(f"{sluice_on_smol.url}/admin/teams",
                      headers={"authorization": f"Bearer {sluice_on_smol.admin_key}"}).json()["data"]
    team = next(t["id"] for t in teams if t["name"] == "default")
    return {"URL": sluice_on_smol.url, "KEY": sluice_on_smol.api_key, "TEAM": team, "MODEL": MODEL}


def run(env, body: str):
    return run_in_venv("friendli", FRIENDLI, PRELUDE + body, env)


def test_serverless_completions_streamed_and_not(env):
    out = run(env, """
body = {"model": M, "prompt": "The capital of France is", "max_tokens": 6, "temperature": 0, "seed": 5}
plain = c.serverless.completions.complete(serverless_completions_body=body, x_friendli_team=TEAM)
chunks = [dump(e.data) for e in c.serverless.completions.complete(
    serverless_completions_body={**body, "stream": True, "stream_options": {"include_usage": True}},
    x_friendli_team=TEAM)]
print(json.dumps({"plain": dump(plain), "chunks": chunks}))
""")
    choice = out["plain"]["choices"][0]
    assert choice["text"] and len(choice["tokens"]) == out["plain"]["usage"]["completion_tokens"] <= 6
    assert choice["seed"] == 5 and choice["finish_reason"] in ("stop", "length")
    streamed = "".join(ch["choices"][0]["text"] for ch in out["chunks"] if ch["choices"])
    assert streamed == choice["text"]
    assert out["chunks"][-1]["usage"]["completion_tokens"] == len(choice["tokens"])


def test_dedicated_endpoint_id_and_token_prompt(env):
    out = run(env, """
from friendli.core.models import SDKError
ok = c.dedicated.completions.complete(dedicated_completions_body={"model": M, "tokens": [504, 3537, 314],
                                                                  "max_tokens": 3, "temperature": 0},
                                      x_friendli_team=TEAM)
try:
    c.dedicated.completions.complete(dedicated_completions_body={"model": "ep-unknown", "prompt": "x"},
                                     retries=NO_RETRY)
    missing = None
except SDKError as e:
    missing = e.status_code
print(json.dumps({"ok": dump(ok), "missing": missing}))
""")
    assert out["ok"]["usage"]["prompt_tokens"] == 3 and out["ok"]["model"] == MODEL
    assert out["missing"] == 404


def test_container_completions_and_chat(env):
    out = run(env, """
done = c.container.completions.complete(request={"model": M, "prompt": "Hi", "max_tokens": 3}, server_url=URL,
                                        http_headers={"authorization": "Bearer " + KEY})
chat = c.container.chat.complete(model=M, messages=[{"role": "user", "content": "Hi"}], max_tokens=3,
                                 server_url=URL, http_headers={"authorization": "Bearer " + KEY})
print(json.dumps({"done": dump(done), "chat": dump(chat)}))
""")
    assert out["done"]["choices"][0]["tokens"]
    assert out["chat"]["choices"][0]["message"]["role"] == "assistant"


def test_serverless_chat_streamed_and_not_with_extras(env):
    out = run(env, """
kw = dict(model=M, messages=[{"role": "user", "content": "Name a colour."}], max_tokens=6, temperature=0,
          min_p=0.05, repetition_penalty=1.1, x_friendli_team=TEAM)
plain = c.serverless.chat.complete(**kw)
chunks = [dump(e.data) for e in c.serverless.chat.complete(**kw, stream=True)]
print(json.dumps({"plain": dump(plain), "chunks": chunks}))
""")
    message = out["plain"]["choices"][0]["message"]
    assert message["role"] == "assistant" and message["content"]
    assert out["chunks"][0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(ch["choices"][0]["delta"].get("content") or "" for ch in out["chunks"] if ch["choices"])
    assert text == message["content"]


def test_validation_error_surfaces_as_sdk_error_422(env):
    out = run(env, """
from friendli.core.models import SDKError
try:
    c.serverless.completions.complete(serverless_completions_body={"model": M, "prompt": "x", "max_tokens": 2,
                                                                   "max_total_tokens": 9}, retries=NO_RETRY)
    result = None
except SDKError as e:
    result = {"status": e.status_code, "body": json.loads(e.body)}
print(json.dumps(result))
""")
    assert out["status"] == 422
    assert out["body"]["error"]["param"] == "max_total_tokens"
    assert out["body"]["detail"][0]["loc"] == ["body", "max_total_tokens"]
