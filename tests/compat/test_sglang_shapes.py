"""SGLang's native API has no client SDK: its request/response shapes (dialects.md §3), checked with httpx
against the real server and model."""

from __future__ import annotations

import json

import httpx
import pytest

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"
MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


def post(server, body, path="/generate", method="POST"):
    return httpx.request(method, f"{server.url}{path}", json=body, timeout=120,
                         headers={"Authorization": f"Bearer {server.api_key}"})


def sse(text: str) -> list:
    return [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]


@pytest.fixture(scope="module")
def greedy(sluice_on_smol):
    response = post(sluice_on_smol, {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert response.status_code == 200, response.text
    return response.json()


def test_single_prompt_shape(sluice_on_smol, greedy):
    assert set(greedy) == {"text", "output_ids", "meta_info"}
    meta = greedy["meta_info"]
    assert meta["finish_reason"] == {"type": "length", "length": 6}
    assert meta["completion_tokens"] == len(greedy["output_ids"]) == 6
    assert meta["prompt_tokens"] > 0 and meta["cached_tokens"] == 0 and meta["e2e_latency"] > 0 and meta["id"]
    detok = post(sluice_on_smol, {"tokens": greedy["output_ids"]}, "/detokenize").json()
    assert detok["text"] == greedy["text"]
    same = post(sluice_on_smol, {"input_ids": post(sluice_on_smol, {"text": PROMPT}, "/tokenize").json()["tokens"],
                                 "sampling_params": {"max_new_tokens": 6, "temperature": 0}}, method="PUT").json()
    assert same["text"] == greedy["text"]


def test_batch_and_n_are_arrays_in_order(sluice_on_smol, greedy):
    body = {"text": [PROMPT, "Water boils at"], "sampling_params": {"max_new_tokens": 6, "temperature": 0, "n": 2},
            "rid": ["first", "second"]}
    outputs = post(sluice_on_smol, body).json()
    assert isinstance(outputs, list) and len(outputs) == 4
    assert [o["meta_info"]["id"] for o in outputs] == ["first", "first", "second", "second"]
    assert outputs[0]["text"] == outputs[1]["text"] == greedy["text"]
    assert outputs[2]["text"] != greedy["text"]


def test_stop_and_no_stop_trim(sluice_on_smol, greedy):
    word = greedy["text"].split()[1]
    trimmed = post(sluice_on_smol, {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                        "stop": word}}).json()
    assert trimmed["meta_info"]["finish_reason"] == {"type": "stop", "matched": word}
    assert word not in trimmed["text"] and greedy["text"].startswith(trimmed["text"])
    kept = post(sluice_on_smol, {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                     "stop": [word], "no_stop_trim": True}}).json()
    assert kept["text"] == trimmed["text"] + word
    token = greedy["output_ids"][2]
    by_id = post(sluice_on_smol, {"text": PROMPT, "sampling_params": {"max_new_tokens": 6, "temperature": 0,
                                                                      "stop_token_ids": [token]}}).json()
    assert by_id["meta_info"]["finish_reason"] == {"type": "stop", "matched": token}


def test_logprobs(sluice_on_smol, greedy):
    chosen = greedy["output_ids"][0]
    body = {"text": PROMPT, "sampling_params": {"max_new_tokens": 3, "temperature": 0}, "return_logprob": True,
            "top_logprobs_num": 2, "logprob_start_len": 1, "token_ids_logprob": [chosen, 5],
            "return_text_in_logprobs": True}
    meta = post(sluice_on_smol, body).json()["meta_info"]
    outputs = meta["output_token_logprobs"]
    assert len(outputs) == 3 and all(len(t) == 3 for t in outputs)
    assert outputs[0][1] == chosen and outputs[0][0] < 0 and isinstance(outputs[0][2], str)
    assert [t[0][1] for t in meta["output_top_logprobs"]] == greedy["output_ids"][:3]
    assert meta["input_token_logprobs"][0][1] != chosen and len(meta["input_token_logprobs"]) == \
        meta["prompt_tokens"] - 1
    inputs, input_tops = meta["input_token_logprobs"], meta["input_top_logprobs"]
    assert len(input_tops) == len(inputs) and all(len(top) == 2 for top in input_tops)
    for (logprob, token, _), top in zip(inputs, input_tops):
        assert top[0][0] >= top[1][0] >= logprob or token in (top[0][1], top[1][1])  # the two most likely
    assert [[t[1] for t in row] for row in meta["input_token_ids_logprobs"]] == [[chosen, 5]] * len(inputs)
    ids_logprobs = meta["output_token_ids_logprobs"][0]
    assert [t[1] for t in ids_logprobs] == [chosen, 5]
    # greedy with no processors: the requested id's logprob is the chosen token's logprob
    assert ids_logprobs[0][0] == pytest.approx(outputs[0][0], abs=1e-4)
    plain = post(sluice_on_smol, {**body, "return_text_in_logprobs": False}).json()["meta_info"]
    assert plain["output_token_logprobs"][0][2] is None


def test_hidden_states_and_embeddings(sluice_on_smol):
    hidden = post(sluice_on_smol, {"text": PROMPT, "sampling_params": {"max_new_tokens": 2, "temperature": 0},
                                   "return_hidden_states": True}).json()
    states = hidden["meta_info"]["hidden_states"]
    assert len(states) == 2 and len(states[0]) == 576  # SmolLM2-135M hidden size
    embeds = post(sluice_on_smol, {"input_embeds": [[0.01] * 576] * 3,
                                   "sampling_params": {"max_new_tokens": 2, "temperature": 0}})
    assert embeds.status_code == 200 and len(embeds.json()["output_ids"]) == 2
    wrong = post(sluice_on_smol, {"input_embeds": [[0.01] * 5], "sampling_params": {"max_new_tokens": 2}})
    assert wrong.status_code == 400 and "576" in wrong.json()["error"]["message"]


def test_cumulative_stream_ends_with_done(sluice_on_smol, greedy):
    response = post(sluice_on_smol, {"text": PROMPT, "stream": True,
                                     "sampling_params": {"max_new_tokens": 6, "temperature": 0}})
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse(response.text)
    assert payloads[-1] == "[DONE]"
    events = [json.loads(p) for p in payloads[:-1]]
    texts = [e["text"] for e in events]
    assert all(texts[i + 1].startswith(texts[i]) for i in range(len(texts) - 1))  # cumulative
    assert texts[-1] == greedy["text"]
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 6}
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    batch = post(sluice_on_smol, {"text": [PROMPT, "Hi"], "stream": True, "sampling_params": {"max_new_tokens": 2}})
    indexes = {json.loads(p)["index"] for p in sse(batch.text)[:-1]}
    assert indexes == {0, 1}


def test_regex_constrains_output(sluice_on_smol):
    response = post(sluice_on_smol, {"text": "Number:", "sampling_params": {"max_new_tokens": 4, "regex": "[0-9]+"}})
    assert response.status_code == 200, response.text
    assert response.json()["text"].isdigit()


def test_errors(sluice_on_smol):
    refused = post(sluice_on_smol, {"text": "x", "custom_logit_processor": "payload"})
    assert refused.status_code == 400 and refused.json()["object"] == "error"
    assert "never executes" in refused.json()["message"]
    image = post(sluice_on_smol, {"text": "x", "image_data": "http://example.com/cat.png"})
    assert image.status_code == 400 and "not supported by this model" in image.json()["message"]
    neither = post(sluice_on_smol, {"prompt": "x"})
    assert neither.status_code == 400 and neither.json()["object"] == "error"
    both = post(sluice_on_smol, {"inputs": "x", "text": "y"})
    assert both.status_code == 422 and both.json()["error_type"] == "validation"
    too_long = post(sluice_on_smol, {"text": "word " * 5000, "sampling_params": {"max_new_tokens": 2}})
    assert too_long.status_code == 400 and "context" in too_long.json()["error"]["message"]
    bad_ids = post(sluice_on_smol, {"tokens": [10**9]}, "/detokenize")
    assert bad_ids.status_code == 400 and bad_ids.json()["param"] == "tokens"


def test_helpers(sluice_on_smol):
    info = httpx.get(f"{sluice_on_smol.url}/get_model_info", timeout=30).json()
    assert info == {"model_path": MODEL, "tokenizer_path": MODEL, "is_generation": True,
                    "preferred_sampling_params": None, "weight_version": "default"}
    server = httpx.get(f"{sluice_on_smol.url}/get_server_info", timeout=30).json()
    assert server["served_models"][0]["context_length"] == 4096
    health = httpx.get(f"{sluice_on_smol.url}/health_generate", timeout=60)
    assert health.status_code == 200 and health.content == b""
    tokens = post(sluice_on_smol, {"text": ["Hello world", "Hi"]}, "/tokenize").json()
    assert tokens["count"] == [len(t) for t in tokens["tokens"]] and tokens["max_model_len"] == 4096
