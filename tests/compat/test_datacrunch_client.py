"""DataCrunch's endpoint (`/v1/completions/generate{,_stream}`, `/v1/completions/health`) with the real
`verda` / `datacrunch` InferenceClient in its own venv: the TGI dialect plus a top-level `model`."""

from __future__ import annotations

import httpx
import pytest

from tests.compat.tgi_schema import assert_tgi_schema, sse_events
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

VERDA = ["verda==1.25.0", "datacrunch==1.25.0"]
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"

SCRIPT = """
import json, os, warnings
warnings.simplefilter("ignore")
from verda.inference_client import InferenceClient, InferenceClientError
from datacrunch.InferenceClient import InferenceClient as DataCrunchClient

base = os.environ["BASE_URL"] + "/v1/completions"
client = InferenceClient(inference_key=os.environ["API_KEY"], endpoint_base_url=base)
out = {"alias": DataCrunchClient is InferenceClient}
out["health"] = client.health().status_code
model = os.environ["MODEL"]
reply = client.run_sync({"model": model, "inputs": "The capital of France is",
                         "parameters": {"max_new_tokens": 5, "details": True}}, path="generate")
out["generate"] = reply.output()
default = client.run_sync({"model": model, "inputs": "Count: one, two,"}, path="generate")
out["default"] = default.output()
lines = client.run_sync({"model": model, "inputs": "The capital of France is",
                         "parameters": {"max_new_tokens": 5}}, path="generate_stream", stream=True).stream()
out["stream"] = [line.decode() if isinstance(line, bytes) else line for line in lines]
try:
    client.run_sync({"model": model, "inputs": "x", "parameters": {"temperature": 0}}, path="generate")
    out["error"] = None
except InferenceClientError as exc:
    out["error"] = [str(exc), exc.__cause__.response.status_code, exc.__cause__.response.json()]
print(json.dumps(out))
"""


def test_verda_inference_client(sluice_on_smol):
    result = run_in_venv("verda", VERDA, SCRIPT, {"BASE_URL": sluice_on_smol.url, "API_KEY": sluice_on_smol.api_key,
                                                  "MODEL": MODEL})
    assert result["alias"] is True and result["health"] == 200
    reply = result["generate"]
    assert_tgi_schema(reply, "GenerateResponse")
    assert reply["details"]["generated_tokens"] == 5 and reply["generated_text"]
    # DataCrunch documents max_new_tokens 20 and details false by default
    assert set(result["default"]) == {"generated_text"}
    headers = {"Authorization": f"Bearer {sluice_on_smol.api_key}"}
    full = httpx.post(f"{sluice_on_smol.url}/v1/completions/generate", headers=headers, timeout=120,
                      json={"model": MODEL, "inputs": "Count: one, two,", "parameters": {"details": True}}).json()
    assert full["generated_text"] == result["default"]["generated_text"]
    assert full["details"]["generated_tokens"] == 20 or full["details"]["finish_reason"] != "length"
    events = sse_events("\n".join(result["stream"]))
    assert len(events) == 5 and all("[DONE]" not in line for line in result["stream"])
    for event in events:
        assert_tgi_schema(event, "StreamResponse")
    assert events[-1]["generated_text"] == reply["generated_text"]
    message, status, body = result["error"]
    assert status == 422 and body["error_type"] == "validation" and "422" in message


def test_model_is_optional_and_checked(sluice_on_smol):
    headers = {"Authorization": f"Bearer {sluice_on_smol.api_key}"}
    url = f"{sluice_on_smol.url}/v1/completions/generate"
    without = httpx.post(url, headers=headers, json={"inputs": "Hi", "parameters": {"max_new_tokens": 2}}, timeout=60)
    assert without.status_code == 200 and without.json()["generated_text"]
    unknown = httpx.post(url, headers=headers, json={"model": "llama-2-13b-chat", "inputs": "Hi"}, timeout=60)
    # not TGI's own refusal (it serves one model): no error_type, so huggingface_hub raises its HTTP 404 error
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}
