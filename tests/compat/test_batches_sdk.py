"""Batches end to end with the real model (#48): the `openai` SDK uploads a JSONL file, runs a batch on each of
`/v1/chat/completions`, `/v1/completions` and `/v1/responses`, polls it and reads its output; the `anthropic`
SDK runs a Message Batch and reads its results. A batch line goes through the same serving path as an
interactive request: with greedy decoding its answer is the interactive answer, token for token."""

from __future__ import annotations

import io
import json
import time

import anthropic
import openai
import pytest

from testkit.sluice import MODEL

pytestmark = pytest.mark.slow
QUESTIONS = ["What is the capital of France?", "Name a colour."]


@pytest.fixture(scope="module")
def client(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def run(client: openai.OpenAI, url: str, bodies: list[dict]):
    lines = b"".join(json.dumps({"custom_id": f"q{i}", "method": "POST", "url": url, "body": body}).encode() + b"\n"
                     for i, body in enumerate(bodies))
    file_id = client.files.create(file=("in.jsonl", io.BytesIO(lines)), purpose="batch").id
    batch = client.batches.create(input_file_id=file_id, endpoint=url, completion_window="24h")
    deadline = time.monotonic() + 300
    while (batch := client.batches.retrieve(batch.id)).status not in ("completed", "failed", "expired"):
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    assert batch.status == "completed" and batch.request_counts.completed == len(bodies), batch
    output = [json.loads(row) for row in client.files.content(batch.output_file_id).text.splitlines()]
    return batch, {line["custom_id"]: line["response"]["body"] for line in output}


def test_chat_batch_answers_as_interactive_requests_do(client):
    bodies = [{"model": MODEL, "messages": [{"role": "user", "content": q}], "max_tokens": 8, "temperature": 0}
              for q in QUESTIONS]
    batch, answers = run(client, "/v1/chat/completions", bodies)
    for i, body in enumerate(bodies):
        interactive = client.chat.completions.create(**body)
        assert answers[f"q{i}"]["choices"][0]["message"]["content"] == interactive.choices[0].message.content
    assert batch.usage.output_tokens == sum(a["usage"]["completion_tokens"] for a in answers.values())


def test_completions_and_responses_batches(client):
    _, completions = run(client, "/v1/completions",
                         [{"model": MODEL, "prompt": "Once upon a time", "max_tokens": 8, "temperature": 0}])
    interactive = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0)
    assert completions["q0"]["choices"][0]["text"] == interactive.choices[0].text
    _, responses = run(client, "/v1/responses", [{"model": MODEL, "input": "Say hi.", "max_output_tokens": 8,
                                                   "temperature": 0}])
    assert responses["q0"]["object"] == "response" and responses["q0"]["status"] in ("completed", "incomplete")
    assert responses["q0"]["output"][0]["content"][0]["text"]


def test_anthropic_message_batch(sluice_on_smol):
    api = anthropic.Anthropic(base_url=sluice_on_smol.url, api_key=sluice_on_smol.api_key, max_retries=0)
    params = {"model": MODEL, "max_tokens": 10, "temperature": 0,
              "messages": [{"role": "user", "content": QUESTIONS[0]}]}
    batch = api.messages.batches.create(requests=[{"custom_id": "a", "params": params},
                                                  {"custom_id": "b", "params": {**params, "max_tokens": -1}}])
    deadline = time.monotonic() + 300
    while (batch := api.messages.batches.retrieve(batch.id)).processing_status != "ended":
        assert time.monotonic() < deadline, batch
        time.sleep(0.5)
    results = {r.custom_id: r.result for r in api.messages.batches.results(batch.id)}
    interactive = api.messages.create(**{k: v for k, v in params.items() if k != "temperature"},
                                      extra_body={"temperature": 0})  # this SDK release has no sampling arguments
    assert results["a"].type == "succeeded"
    assert results["a"].message.content[0].text == interactive.content[0].text
    assert results["b"].type == "errored" and results["b"].error.error.type == "invalid_request_error"
