"""OpenAI's prompt scoring on `/v1/completions` (issue #34): `echo: true` with `max_tokens: 0` returns the prompt
and its logprobs and generates nothing, as OpenAI does (evaluation harnesses compute likelihoods this way);
`max_tokens: 0` without `echo` stays a 400. Through the real gateway app; the protocol worker answers as the
engine does for it (tests/worker/engine/test_engine.py::test_max_tokens_zero_scores_the_prompt_and_generates_nothing).
"""

from __future__ import annotations

import json

from common.protocol import Accepted, Done, Finish, PromptToken
from testkit.protocol_worker import MODEL, Reply

PROMPT = "Paris is big"
SCORED = [Accepted(prompt_tokens=3, prompt_ids=[5, 6, 7], seeds=[1], prompt_text=PROMPT,
                   prompt_details=[PromptToken(5, "Paris", None), PromptToken(6, " is", -1.5),
                                   PromptToken(7, " big", -2.25)]),
          Finish(index=0, reason="length", text="", token_ids=[], seed=1),
          Done(prompt_tokens=3, completion_tokens=0, compute_tokens=0)]
BODY = {"model": MODEL, "prompt": PROMPT, "echo": True, "max_tokens": 0, "logprobs": 0}


async def test_echo_with_max_tokens_zero_scores_the_prompt(gateway_app, worker):
    worker.replies = [Reply(SCORED)]
    response = await gateway_app.post("/v1/completions", json=BODY, headers=gateway_app.key_headers)
    assert response.status_code == 200, response.text
    (choice,) = response.json()["choices"]
    assert choice["text"] == PROMPT and choice["finish_reason"] == "length"
    assert choice["logprobs"]["tokens"] == ["Paris", " is", " big"]
    assert choice["logprobs"]["token_logprobs"] == [None, -1.5, -2.25]
    assert response.json()["usage"] == {"prompt_tokens": 3, "completion_tokens": 0, "total_tokens": 3,
                                        "prompt_tokens_details": {"cached_tokens": 0}}
    sent = worker.requests[-1]["params"]
    assert sent["max_tokens"] == 0 and sent["prompt_logprobs"] is True


async def test_echo_scoring_streams_too(gateway_app, worker):
    worker.replies = [Reply(SCORED)]
    response = await gateway_app.post("/v1/completions", json={**BODY, "stream": True}, headers=gateway_app.key_headers)
    chunks = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: {")]
    assert chunks[0]["choices"][0]["text"] == PROMPT
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


async def test_max_tokens_zero_without_echo_is_refused(gateway_app, worker):
    response = await gateway_app.post("/v1/completions", json={**BODY, "echo": False}, headers=gateway_app.key_headers)
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_tokens", response.text
    assert worker.requests == []
