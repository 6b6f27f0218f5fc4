"""LoRA adapters through `sluice serve` and its real worker: a PEFT adapter built in the test for SmolLM2 and
registered on the endpoint in the config, named by OpenAI's `model: "<endpoint>:<adapter>"` (the real SDK),
TGI's `adapter_id` and SGLang's `lora_path`; greedy output equals PEFT's merged model; unknown names are a 404
in each dialect's envelope; /v1/models lists the adapter."""

from __future__ import annotations

import json
import time

import httpx
import openai
import pytest

from common.protocol import ModelConfig
from testkit import sluice
from testkit.lora_adapters import ATTENTION, write_adapter
from testkit.sluice import MODEL, MODEL_CACHE
from tests.compat.sdk_pins import FRIENDLI
from tests.compat.venvs import run_in_venv
from tests.worker.lora.adapters import references
from worker.loading import load_model

pytestmark = pytest.mark.slow
PROMPT = "The capital of France is"
TOKENS = 12


@pytest.fixture(scope="module")
def built(tmp_path_factory, monkeypatch_module):
    """(adapter directory, PEFT merged-model greedy tokens, base greedy tokens, tokenizer)."""
    monkeypatch_module.setenv("SLUICE_MODEL_CACHE", str(MODEL_CACHE))
    smol = load_model(ModelConfig(dtype="float32", quantization="none"), tmp_path_factory.mktemp("lora-data"))
    directory = write_adapter(smol.model, tmp_path_factory.mktemp("lora") / "poet", 13, ATTENTION, rank=8, alpha=16,
                              strength=0.3)
    ids = [smol.tokenizer(PROMPT).input_ids]
    eos = smol.tokenizer.eos_token_id
    with_adapter = references(smol.model, directory, ids, TOKENS, eos)[0]
    base = references(smol.model, None, ids, TOKENS, eos)[0]
    assert with_adapter != base  # the adapter changes what the model says
    return directory, smol.tokenizer.decode(with_adapter), smol.tokenizer.decode(base)


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def server(built, tmp_path_factory):
    directory = built[0]
    # PEFT parity is exact in the float32 mode, pinned as every parity test does (the CPU default, q4 or w8a8, is
    # close to float32, not equal)
    config = (f'[[models]]\nname = "{MODEL}"\nquantization = "none"\ndtype = "float32"\n'
              f'adapters = {{ poet = "{directory}" }}\n')
    with sluice.running_sluice(tmp_path_factory.mktemp("lora-gateway"), config=config) as running:
        yield running


def post(server, path: str, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", json=body, headers={"authorization": f"Bearer {server.api_key}"},
                      timeout=300)


def test_openai_model_names_the_adapter(server, built):
    _, adapted, base = built
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    reply = client.completions.create(model=f"{MODEL}:poet", prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    assert reply.choices[0].text == adapted
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=TOKENS, temperature=0)
    assert plain.choices[0].text == base
    with pytest.raises(openai.NotFoundError) as info:
        client.completions.create(model=f"{MODEL}:nope", prompt=PROMPT, max_tokens=2)
    assert info.value.body["param"] == "model" and "poet" in info.value.message


def test_tgi_adapter_id_and_sglang_lora_path(server, built):
    _, adapted, _ = built
    tgi = post(server, "/generate", {"inputs": PROMPT, "parameters": {"adapter_id": "poet", "max_new_tokens": TOKENS}})
    assert tgi.status_code == 200 and tgi.json()["generated_text"] == adapted
    sglang = post(server, "/generate", {"text": PROMPT, "lora_path": "poet",
                                        "sampling_params": {"max_new_tokens": TOKENS, "temperature": 0}})
    assert sglang.status_code == 200 and sglang.json()["text"] == adapted
    missing = post(server, "/generate", {"inputs": PROMPT, "parameters": {"adapter_id": "nope"}})
    # a 404 is not one of TGI's error_types: huggingface_hub raises its HTTP 404 error for it
    assert missing.status_code == 404 and "error_type" not in missing.json() and "nope" in missing.json()["error"]
    missing = post(server, "/generate", {"text": PROMPT, "lora_path": "nope"})
    assert missing.status_code == 404


FRIENDLI_SCRIPT = """
import json, os
from friendli import SyncFriendli
from friendli.core.models import SDKError
from friendli.core.utils.retries import BackoffStrategy, RetryConfig
c = SyncFriendli(token=os.environ["KEY"], server_url=os.environ["URL"])
body = {"model": os.environ["ADAPTER"], "prompt": os.environ["PROMPT"], "max_tokens": int(os.environ["TOKENS"]),
        "temperature": 0}
serverless = c.serverless.completions.complete(serverless_completions_body=body)
dedicated = c.dedicated.completions.complete(dedicated_completions_body=body)
try:
    c.dedicated.completions.complete(dedicated_completions_body={**body, "model": os.environ["ADAPTER"] + "x"},
                                     retries=RetryConfig("backoff", BackoffStrategy(100, 200, 1.5, 500), False))
    missing = None
except SDKError as e:
    missing = {"status": e.status_code, "body": json.loads(e.body)}
print(json.dumps({"serverless": serverless.choices[0].text, "dedicated": dedicated.choices[0].text,
                  "missing": missing}))
"""


def test_friendli_model_names_the_adapter(server, built):
    """Friendli names an adapter by `model: "<endpoint>:<adapter>"` on /serverless and /dedicated (the real SDK);
    an unknown one is a 404 in the Friendli envelope (OpenAI's, naming `model`), on completions and chat."""
    _, adapted, _ = built
    out = run_in_venv("friendli", FRIENDLI, FRIENDLI_SCRIPT, {"URL": server.url, "KEY": server.api_key,
                                                             "ADAPTER": f"{MODEL}:poet", "PROMPT": PROMPT,
                                                             "TOKENS": str(TOKENS)})
    assert out["serverless"] == out["dedicated"] == adapted
    error = out["missing"]["body"]["error"]
    assert out["missing"]["status"] == 404 and error["code"] == "adapter_not_found" and error["param"] == "model"
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert post(server, "/serverless/v1/chat/completions", {**chat, "model": f"{MODEL}:poet"}).status_code == 200
    for path in ("/serverless/v1/chat/completions", "/dedicated/v1/completions"):
        missing = post(server, path, {**chat, "prompt": PROMPT, "model": f"{MODEL}:nope"})
        error = missing.json()["error"]
        assert missing.status_code == 404 and error["code"] == "adapter_not_found" and "poet" in error["message"]


def test_datacrunch_adapter_id(server, built):
    """DataCrunch's paths take TGI bodies with a `model`: `adapter_id` picks the adapter, streamed and not; an
    unknown one is a 404 in TGI's envelope naming the adapters there are."""
    _, adapted, _ = built
    body = {"model": MODEL, "inputs": PROMPT, "parameters": {"adapter_id": "poet", "max_new_tokens": TOKENS}}
    reply = post(server, "/v1/completions/generate", body)
    assert reply.status_code == 200 and reply.json()["generated_text"] == adapted, reply.text
    streamed = post(server, "/v1/completions/generate_stream", body)
    final = [json.loads(line[len("data:"):]) for line in streamed.text.splitlines() if line.startswith("data:")][-1]
    assert streamed.status_code == 200 and final["generated_text"] == adapted
    for path in ("/v1/completions/generate", "/v1/completions/generate_stream"):
        missing = post(server, path, {**body, "parameters": {"adapter_id": "nope"}})
        assert missing.status_code == 404 and "error_type" not in missing.json(), missing.text
        assert "'nope' is not registered" in missing.json()["error"] and "poet" in missing.json()["error"]


def test_the_ledger_records_the_adapter(server):
    """Each request's usage record names the adapter it ran with ("" for the base model); the usage API groups
    by it (`-`: the base model), the team's view, the admin's and its CSV export alike."""
    named = post(server, "/generate", {"inputs": PROMPT, "parameters": {"adapter_id": "poet", "max_new_tokens": 2}})
    plain = post(server, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 2}})
    assert named.status_code == plain.status_code == 200
    wanted = {named.headers["x-request-id"]: "poet", plain.headers["x-request-id"]: ""}
    found: dict[str, str] = {}
    deadline = time.monotonic() + 60  # records ship to the database in the background
    while set(found) != set(wanted) and time.monotonic() < deadline:
        records = httpx.get(f"{server.url}/admin/usage/records?limit=10000",
                            headers={"authorization": f"Bearer {server.admin_key}"}).json()["data"]
        found = {r["request_id"]: r["adapter"] for r in records if r["request_id"] in wanted}
        time.sleep(0.2)
    assert found == wanted
    team = {"authorization": f"Bearer {server.api_key}"}
    listed = httpx.get(f"{server.url}/v1/usage/requests?limit=1000", headers=team).json()["data"]
    counts = {"poet": sum(r["adapter"] == "poet" for r in listed), "-": sum(r["adapter"] == "" for r in listed)}
    grouped = httpx.get(f"{server.url}/v1/usage?group_by=adapter", headers=team).json()["rows"]
    assert {row["key"]: row["requests"] for row in grouped} == counts
    poet_only = httpx.get(f"{server.url}/v1/usage?group_by=none&adapter=poet", headers=team).json()["totals"]
    assert poet_only["requests"] == counts["poet"]
    exported = httpx.get(f"{server.url}/admin/usage?group_by=adapter&format=csv",
                         headers={"authorization": f"Bearer {server.admin_key}"}).text.splitlines()
    assert exported[0].startswith("adapter,requests,") and any(line.startswith("poet,") for line in exported)


def test_models_list_the_adapter(server):
    client = openai.OpenAI(base_url=f"{server.url}/v1", api_key=server.api_key, max_retries=0)
    assert {m.id for m in client.models.list()} >= {MODEL, f"{MODEL}:poet"}


def test_admin_api_registers_lists_and_removes_adapters(server, built):
    directory, adapted, _ = built
    admin = {"authorization": f"Bearer {server.admin_key}"}
    base = f"{server.url}/admin/endpoints/{MODEL}/adapters"
    created = httpx.post(base, json={"name": "verse", "source": str(directory)}, headers=admin)
    assert created.status_code == 201 and created.json()["model"] == f"{MODEL}:verse"
    listed = httpx.get(base, headers=admin).json()["data"]
    assert {a["name"]: a["origin"] for a in listed} == {"poet": "declared", "verse": "registered"}
    reply = post(server, "/v1/completions", {"model": f"{MODEL}:verse", "prompt": PROMPT, "max_tokens": TOKENS,
                                             "temperature": 0})
    assert reply.json()["choices"][0]["text"] == adapted
    assert httpx.delete(f"{base}/verse", headers=admin).json()["deleted"] is True
    gone = post(server, "/v1/completions", {"model": f"{MODEL}:verse", "prompt": PROMPT, "max_tokens": 2})
    assert gone.status_code == 404 and gone.json()["error"]["code"] == "adapter_not_found"


@pytest.mark.parametrize(("method", "path", "body", "status", "words"), [
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "a", "source": "relative/dir"}, 422, "PEFT adapter"),
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "a", "source": "/nonexistent"}, 422, "PEFT adapter"),
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "a/b", "source": "s3://b/p"}, 422, "name"),
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "a", "source": "s3://"}, 422, "s3://"),
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "a"}, 422, "source"),
    ("post", "/admin/endpoints/no-such-model/adapters", {"name": "a", "source": "s3://b/p"}, 404, "does not exist"),
    ("get", f"/admin/endpoints/{MODEL}/lora", None, 404, "does not exist"),
    ("post", f"/admin/endpoints/{MODEL}", {"name": "a", "source": "s3://b/p"}, 404, "no such admin path"),
    ("delete", f"/admin/endpoints/{MODEL}/adapters/never", None, 404, "not registered"),
    ("post", f"/admin/endpoints/{MODEL}/adapters", {"name": "poet", "source": "s3://b/p"}, 409, "declared"),
    ("delete", f"/admin/endpoints/{MODEL}/adapters/poet", None, 409, "declared"),
])
def test_admin_api_refusals(server, method, path, body, status, words):
    admin = {"authorization": f"Bearer {server.admin_key}"}
    reply = httpx.request(method, f"{server.url}{path}", json=body, headers=admin)
    assert reply.status_code == status and words in reply.json()["error"]["message"], reply.text


def test_admin_api_needs_an_admin_key(server):
    reply = httpx.get(f"{server.url}/admin/endpoints/{MODEL}/adapters",
                      headers={"authorization": f"Bearer {server.api_key}"})
    assert reply.status_code == 403
