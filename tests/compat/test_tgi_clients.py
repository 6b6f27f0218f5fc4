"""TGI dialect with the real clients: huggingface_hub's InferenceClient (this venv), text-generation 0.7
(its own venv: it needs huggingface-hub<1.0), and every response checked against TGI's openapi.json."""

from __future__ import annotations

import json

import httpx
import pytest

from tests.compat.tgi_schema import assert_tgi_schema, sse_events
from tests.compat.venvs import run_in_venv

pytestmark = pytest.mark.slow

TEXT_GENERATION = ["text-generation==0.7.0"]
PROMPT = "The capital of France is"


def post(server, path, body, **kwargs):
    return httpx.post(f"{server.url}{path}", json=body, headers={"Authorization": f"Bearer {server.api_key}"},
                      timeout=120, **kwargs)


@pytest.fixture(scope="module")
def greedy(sluice_on_smol):
    """The reference: /generate, greedy, 8 tokens, with details."""
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8,
                                                                                 "details": True}})
    assert response.status_code == 200, response.text
    assert_tgi_schema(response.json(), "GenerateResponse")
    return response.json()


# ---- raw HTTP against the schema ----


def test_generate_details_and_headers(sluice_on_smol, greedy):
    details = greedy["details"]
    assert details["generated_tokens"] == len(details["tokens"]) == 8
    assert details["finish_reason"] == "length" and details["prefill"] == [] and details["seed"] is None
    assert "".join(t["text"] for t in details["tokens"]) == greedy["generated_text"]
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}})
    assert response.json() == {"generated_text": greedy["generated_text"]}  # details default false
    assert response.headers["x-generated-tokens"] == "8"
    assert int(response.headers["x-prompt-tokens"]) > 0
    assert float(response.headers["x-compute-time"]) > 0
    timing = {name: int(response.headers[f"x-{name}-time"]) for name in ("total", "validation", "queue", "inference")}
    assert timing["total"] > 0 and min(timing.values()) >= 0
    # the three phases partition the total (each rounded to a millisecond on its own)
    assert abs(timing["validation"] + timing["queue"] + timing["inference"] - timing["total"]) <= 2
    assert int(response.headers["x-time-per-token"]) == pytest.approx(timing["inference"] / 8, abs=1)


def test_compat_route_returns_array_and_streams(sluice_on_smol, greedy):
    response = post(sluice_on_smol, "/", {"inputs": PROMPT, "parameters": {"max_new_tokens": 8}})
    assert response.status_code == 200
    body = response.json()
    assert isinstance(body, list) and len(body) == 1
    assert body[0]["generated_text"] == greedy["generated_text"]
    assert_tgi_schema(body[0], "GenerateResponse")
    streamed = post(sluice_on_smol, "/", {"inputs": PROMPT, "stream": True,
                                          "parameters": {"max_new_tokens": 8, "details": True}})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    events = sse_events(streamed.text)
    assert events[-1]["generated_text"] == greedy["generated_text"]


def test_stream_events_and_close_without_done(sluice_on_smol, greedy):
    response = post(sluice_on_smol, "/generate_stream",
                    {"inputs": PROMPT, "parameters": {"max_new_tokens": 8, "details": True, "top_n_tokens": 2}})
    assert response.status_code == 200
    assert response.headers["x-accel-buffering"] == "no"
    assert "[DONE]" not in response.text
    events = sse_events(response.text)
    assert len(events) == 8
    for event in events:
        assert_tgi_schema(event, "StreamResponse")
        assert len(event["top_tokens"]) == 2
    assert all(e["generated_text"] is None and e["details"] is None for e in events[:-1])
    assert events[-1]["details"]["finish_reason"] == "length" and events[-1]["details"]["generated_tokens"] == 8
    assert [e["token"]["id"] for e in events] == [t["id"] for t in greedy["details"]["tokens"]]
    assert "".join(e["token"]["text"] for e in events) == events[-1]["generated_text"] == greedy["generated_text"]


def test_decoder_input_details_top_tokens_and_full_text(sluice_on_smol, greedy):
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 8, "details": True, "decoder_input_details": True, "top_n_tokens": 3,
        "return_full_text": True}})
    body = response.json()
    assert_tgi_schema(body, "GenerateResponse")
    prefill = body["details"]["prefill"]
    assert prefill[0]["logprob"] is None and all(p["logprob"] < 0 for p in prefill[1:])
    assert "".join(p["text"] for p in prefill) == PROMPT
    assert body["generated_text"] == PROMPT + greedy["generated_text"]
    top = body["details"]["top_tokens"]
    assert len(top) == 8 and all(len(t) == 3 for t in top)
    # greedy: the chosen token is the most likely one
    assert [t[0]["id"] for t in top] == [t["id"] for t in body["details"]["tokens"]]


def test_best_of_returns_the_best_and_the_others(sluice_on_smol):
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 6, "details": True, "best_of": 3, "do_sample": True, "top_n_tokens": 2}})
    body = response.json()
    assert_tgi_schema(body, "GenerateResponse")
    details = body["details"]
    others = details["best_of_sequences"]
    assert len(others) == 2
    best_score = sum(t["logprob"] for t in details["tokens"])
    for other in others:
        assert sum(t["logprob"] for t in other["tokens"]) <= best_score + 1e-4
        assert other["seed"] is not None and other["generated_tokens"] == len(other["tokens"])
        assert len(other["top_tokens"]) == len(other["tokens"]) and all(len(t) == 2 for t in other["top_tokens"])


def test_stop_sequence_is_kept_and_seed_reproduces(sluice_on_smol, greedy):
    word = greedy["generated_text"].split()[1]  # a word the greedy text contains after its first
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 8, "details": True, "stop": [word]}})
    body = response.json()
    assert body["details"]["finish_reason"] == "stop_sequence"
    assert body["generated_text"].endswith(word) and greedy["generated_text"].startswith(body["generated_text"])
    sampled = [post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 6, "details": True, "do_sample": True, "seed": 1234}}).json() for _ in range(2)]
    assert sampled[0] == sampled[1] and sampled[0]["details"]["seed"] == 1234


def test_truncate_and_watermark_run(sluice_on_smol):
    long = "one two three four five six seven eight nine ten " * 4
    short = post(sluice_on_smol, "/generate", {"inputs": long, "parameters": {"max_new_tokens": 3, "truncate": 4}})
    assert short.status_code == 200 and int(short.headers["x-prompt-tokens"]) == 4
    marked = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": {
        "max_new_tokens": 4, "watermark": True, "do_sample": True, "seed": 5}})
    assert marked.status_code == 200 and marked.json()["generated_text"]


def test_grammar_regex_end_to_end(sluice_on_smol):
    response = post(sluice_on_smol, "/generate", {"inputs": "My favourite number is", "parameters": {
        "max_new_tokens": 6, "grammar": {"type": "regex", "value": "[0-9]{3}"}}})
    assert response.status_code == 200, response.text
    assert response.json()["generated_text"].isdigit()


@pytest.mark.parametrize("parameters", [{"temperature": 0}, {"top_p": 1.0}, {"stop": ["a"] * 5},
                                        {"best_of": 2}, {"top_k": 0}])
def test_validation_errors_have_tgi_envelope(sluice_on_smol, parameters):
    response = post(sluice_on_smol, "/generate", {"inputs": PROMPT, "parameters": parameters})
    assert response.status_code == 422
    assert_tgi_schema(response.json(), "ErrorResponse")
    assert response.json()["error_type"] == "validation"


def test_error_statuses(sluice_on_smol):
    assert post(sluice_on_smol, "/generate", None, content=b"{nope").status_code == 400
    unknown = post(sluice_on_smol, "/v1/completions/generate", {"model": "nope", "inputs": "x"})
    # refusals TGI itself never makes carry no error_type: huggingface_hub raises its HTTP error of that status
    assert unknown.status_code == 404 and set(unknown.json()) == {"error"}
    anonymous = httpx.post(f"{sluice_on_smol.url}/generate", json={"inputs": "x"}, timeout=30)
    assert anonymous.status_code == 401 and set(anonymous.json()) == {"error"}
    stream_invalid = post(sluice_on_smol, "/generate_stream", {"inputs": "x", "parameters": {"best_of": 2,
                                                                                            "do_sample": True}})
    assert stream_invalid.status_code == 422 and stream_invalid.json()["error_type"] == "validation"


def test_info_tokenize_metrics(sluice_on_smol):
    info = httpx.get(f"{sluice_on_smol.url}/info", timeout=30).json()
    assert_tgi_schema(info, "Info")
    assert info["model_id"] == "HuggingFaceTB/SmolLM2-135M-Instruct" and info["max_stop_sequences"] == 4
    tokens = post(sluice_on_smol, "/tokenize", {"inputs": PROMPT}).json()
    assert_tgi_schema(tokens, "TokenizeResponse")
    assert "".join(t["text"] for t in tokens) == PROMPT
    assert all(PROMPT[t["start"]:t["stop"]] == t["text"] for t in tokens)
    metrics = httpx.get(f"{sluice_on_smol.url}/metrics", timeout=30,  # an operator's view: the admin key
                        headers={"authorization": f"Bearer {sluice_on_smol.admin_key}"})
    assert metrics.status_code == 200 and metrics.headers["content-type"].startswith("text/plain")
    text = metrics.text
    assert 'sluice_requests_total{dialect="tgi"' in text
    assert "sluice_request_duration_seconds_bucket" in text and "sluice_generated_tokens_total" in text
    assert httpx.get(f"{sluice_on_smol.url}/health", timeout=30).status_code == 200


# ---- huggingface_hub.InferenceClient (the version installed in the project venv) ----


def test_hf_hub_text_generation(sluice_on_smol, greedy):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=sluice_on_smol.url, token=sluice_on_smol.api_key)
    assert client.text_generation(PROMPT, max_new_tokens=8) == greedy["generated_text"]
    output = client.text_generation(PROMPT, max_new_tokens=8, details=True, decoder_input_details=True)
    assert output.generated_text == greedy["generated_text"]
    assert output.details.finish_reason == "length" and output.details.generated_tokens == 8
    assert [t.id for t in output.details.tokens] == [t["id"] for t in greedy["details"]["tokens"]]
    assert len(output.details.prefill) > 1


def test_hf_hub_streaming(sluice_on_smol, greedy):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=sluice_on_smol.url, token=sluice_on_smol.api_key)
    pieces = list(client.text_generation(PROMPT, max_new_tokens=8, stream=True))
    assert "".join(pieces) == greedy["generated_text"]
    events = list(client.text_generation(PROMPT, max_new_tokens=8, stream=True, details=True))
    assert events[-1].generated_text == greedy["generated_text"]
    assert events[-1].details.finish_reason == "length"
    generate_stream = InferenceClient(model=f"{sluice_on_smol.url}/generate_stream", token=sluice_on_smol.api_key)
    assert "".join(generate_stream.text_generation(PROMPT, max_new_tokens=8, stream=True)) == greedy["generated_text"]


def test_hf_hub_errors_are_typed(sluice_on_smol):
    from huggingface_hub import InferenceClient
    from huggingface_hub.errors import ValidationError

    client = InferenceClient(model=sluice_on_smol.url, token=sluice_on_smol.api_key)
    with pytest.raises(ValidationError):
        client.text_generation(PROMPT, max_new_tokens=4, stop=["a", "b", "c", "d", "e"])
    with pytest.raises(ValidationError):
        client.text_generation(PROMPT, max_new_tokens=4, stream=True, top_p=1.0)


def test_hf_hub_chat_completion(sluice_on_smol):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key)
    reply = client.chat.completions.create(model="HuggingFaceTB/SmolLM2-135M-Instruct",
                                           messages=[{"role": "user", "content": "Say hi"}], max_tokens=5)
    assert reply.choices[0].message.content


def test_hf_hub_chat_completion_with_url_model(sluice_on_smol):
    from huggingface_hub import InferenceClient

    client = InferenceClient(model=sluice_on_smol.url, token=sluice_on_smol.api_key)
    reply = client.chat_completion([{"role": "user", "content": "Say hi"}], max_tokens=5)
    assert reply.choices[0].message.content


# ---- text-generation 0.7 (TGI's own client) in its venv ----

TEXT_GENERATION_SCRIPT = """
import json, os
from text_generation import Client
from text_generation.errors import ValidationError

client = Client(os.environ["BASE_URL"], headers={"Authorization": "Bearer " + os.environ["API_KEY"]}, timeout=120)
prompt = os.environ["PROMPT"]
out = {}
reply = client.generate(prompt, max_new_tokens=8)
out["generate"] = {"text": reply.generated_text, "finish": reply.details.finish_reason.value,
                   "tokens": [t.id for t in reply.details.tokens], "generated_tokens": reply.details.generated_tokens}
stream = list(client.generate_stream(prompt, max_new_tokens=8))
out["stream"] = {"texts": [r.token.text for r in stream], "final": stream[-1].generated_text,
                 "finish": stream[-1].details.finish_reason.value}
best = client.generate(prompt, max_new_tokens=5, best_of=2, do_sample=True)
out["best_of"] = {"others": len(best.details.best_of_sequences or []),
                  "tokens": len(best.details.tokens), "seed": best.details.seed,
                  "finish": str(best.details.finish_reason.value)}
prefill = client.generate(prompt, max_new_tokens=3, decoder_input_details=True)
out["prefill"] = [[p.id, p.text, p.logprob] for p in prefill.details.prefill]
try:
    client.generate(prompt, max_new_tokens=3, stop_sequences=["a", "b", "c", "d", "e"])
    out["error"] = None
except ValidationError as exc:
    out["error"] = str(exc)
print(json.dumps(out))
"""


def test_text_generation_client(sluice_on_smol, greedy):
    result = run_in_venv("text-generation", TEXT_GENERATION, TEXT_GENERATION_SCRIPT,
                         {"BASE_URL": sluice_on_smol.url, "API_KEY": sluice_on_smol.api_key, "PROMPT": PROMPT})
    assert result["generate"]["text"] == greedy["generated_text"]
    assert result["generate"]["finish"] == "length" and result["generate"]["generated_tokens"] == 8
    assert result["generate"]["tokens"] == [t["id"] for t in greedy["details"]["tokens"]]
    assert "".join(result["stream"]["texts"]) == result["stream"]["final"] == greedy["generated_text"]
    assert result["best_of"]["others"] == 1
    # sampled (TGI allows no seed with best_of): the best candidate may end at EOS before 5 tokens
    best = result["best_of"]
    assert (best["tokens"] == 5 if best["finish"] == "length"
            else 1 <= best["tokens"] < 5 and best["finish"] == "eos_token")
    assert result["best_of"]["seed"] is not None
    assert result["prefill"][0][2] is None and len(result["prefill"]) > 1
    assert "stop" in result["error"]


def test_schema_document_is_tgi_openapi():
    """The fixture document really is TGI's (guards the extraction in tgi_schema)."""
    from tests.compat.tgi_schema import tgi_openapi

    document = tgi_openapi()
    assert document["info"]["title"] == "Text Generation Inference"
    assert {"/generate", "/generate_stream", "/info", "/tokenize"} <= set(document["paths"])
    json.dumps(document)
