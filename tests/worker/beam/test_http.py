"""Beam search through the real HTTP surfaces of `sluice serve`: the worker's `POST /generate`
(the internal contract every dialect uses) and the gateway's `/v1/completions` with FriendliAI's
field names."""

from __future__ import annotations

import json

import httpx
import pytest

from testkit.sluice import MODEL, running_sluice
from tests.worker.beam.helpers import beam_reference

pytestmark = pytest.mark.slow

PROMPT = "The capital of France is"


# float32 pinned as `smol` pins it (the reference): on CUDA `auto` would serve nf4 in bfloat16
PINNED = f'[[models]]\nname = "{MODEL}"\nquantization = "none"\ndtype = "float32"\n'


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running_sluice(tmp_path_factory.mktemp("beam-serve"), config=PINNED) as running:
        yield running


def worker_generate(server, **params) -> httpx.Response:
    body = {"request_id": "beam-http", "model": MODEL, "prompt": PROMPT, "params": params}
    stream = params.pop("stream", None)
    if stream is not None:
        body["stream"] = stream
    return httpx.post(f"{server.worker_url()}/generate", json=body, headers=server.worker_headers(), timeout=300)


WORKER_REFUSED = [
    (dict(num_beams=32, max_tokens=4), "num_beams"),
    (dict(num_beams=2, n=3, max_tokens=4), "n"),
    (dict(num_beams=2, stop=["Paris"], max_tokens=4), "stop"),
    (dict(num_beams=2, top_k=5, max_tokens=4), "top_k"),
    (dict(num_beams=2, beam_compat_no_post_normalization=True, max_tokens=4), "beam_compat_no_post_normalization"),
    (dict(num_beams=2, seed=[1, 2], max_tokens=4), "seed"),
    (dict(num_beams=2, stream=True, max_tokens=4), "stream"),
]


@pytest.mark.parametrize("params,field", WORKER_REFUSED, ids=[f for _, f in WORKER_REFUSED])
def test_worker_refuses(server, params, field):
    reply = worker_generate(server, **params)
    assert reply.status_code == 422, reply.text
    error = reply.json()
    assert (error["kind"], error["field"]) == ("validation", field)
    assert error["message"]


def test_worker_beam_events(server, smol):
    params = dict(num_beams=3, n=2, max_tokens=8)
    reply = worker_generate(server, **params)
    assert reply.status_code == 200, reply.text
    events = [json.loads(line) for line in reply.text.splitlines() if line]
    assert [e["type"] for e in events] == ["accepted", "finish", "finish", "done"]
    ids = smol.tokenizer(PROMPT).input_ids
    expected, scores = beam_reference(smol.model, ids, dict(params), [smol.tokenizer.eos_token_id])
    finishes = events[1:3]
    assert [f["token_ids"] for f in finishes] == expected
    assert [f["score"] for f in finishes] == pytest.approx(scores, abs=1e-3)
    assert all(f["text"] for f in finishes)
    done = events[-1]
    assert done["completion_tokens"] == sum(len(s) for s in expected)
    assert done["compute_tokens"] >= 3 * max(len(s) for s in expected)


def complete_through_gateway(server, body: dict) -> httpx.Response:
    return httpx.post(f"{server.url}/v1/completions", json={"model": MODEL, "prompt": PROMPT, **body},
                      headers={"Authorization": f"Bearer {server.api_key}"}, timeout=300)


def test_gateway_friendli_fields(server, smol):
    reply = complete_through_gateway(server, {"num_beams": 3, "n": 2, "max_tokens": 8, "length_penalty": 1.5,
                             "early_stopping": True})
    assert reply.status_code == 200, reply.text
    body = reply.json()
    ids = smol.tokenizer(PROMPT).input_ids
    expected, _ = beam_reference(smol.model, ids, dict(num_beams=3, n=2, max_tokens=8, length_penalty=1.5,
                                                  early_stopping=True), [smol.tokenizer.eos_token_id])
    assert [c["tokens"] for c in body["choices"]] == expected
    assert body["usage"]["completion_tokens"] == sum(len(s) for s in expected)


@pytest.mark.parametrize("body,field", [
    ({"num_beams": 3, "stream": True}, "stream"),
    ({"num_beams": 3, "stop": ["Paris"]}, "stop"),
    ({"num_beams": 40}, "num_beams"),
    ({"num_beams": 2, "n": 3}, "n"),
])
def test_gateway_refuses(server, body, field):
    reply = complete_through_gateway(server, {"max_tokens": 4, **body})
    assert reply.status_code == 400, reply.text  # OpenAI's status for a request it refuses
    assert reply.json()["error"]["param"] == field
