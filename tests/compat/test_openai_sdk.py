"""The real `openai` SDK against `sluice serve`: completions and chat, streamed and not, typed errors,
429 retries, Friendli extensions on the OpenAI routes, and the cross-dialect HTTP rules."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from testkit.sluice import MODEL

pytestmark = pytest.mark.slow
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture(scope="module")
def client(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def post(server, path: str, body, headers: dict | None = None, raw: bytes | None = None) -> httpx.Response:
    return httpx.post(f"{server.url}{path}", content=raw if raw is not None else json.dumps(body).encode(),
                      headers={"authorization": f"Bearer {server.api_key}", "content-type": "application/json",
                               **(headers or {})}, timeout=120)


def sse_payloads(response: httpx.Response) -> list:
    """Every `data:` payload of an SSE body, `[DONE]` kept as the string."""
    payloads = []
    for line in response.text.splitlines():
        if line.startswith("data: "):
            data = line[len("data: "):]
            payloads.append(data if data == "[DONE]" else json.loads(data))
    return payloads


# ---- completions ----


def test_completion_n_seed_logprobs_echo(client):
    reply = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, n=2, seed=11, temperature=0.9,
                                      logprobs=2, echo=True)
    assert [c.index for c in reply.choices] == [0, 1]
    prompt_tokens = reply.usage.prompt_tokens  # one prompt, shared by both choices
    for choice in reply.choices:
        assert choice.text.startswith("The sky is")
        # echo with logprobs covers the prompt, then the completion (OpenAI's behaviour)
        assert len(choice.logprobs.tokens) == prompt_tokens + len(choice.model_extra["tokens"])
        assert choice.logprobs.token_logprobs[0] is None and choice.logprobs.top_logprobs[0] is None
        assert all(len(top) <= 2 for top in choice.logprobs.top_logprobs[1:])
        assert choice.logprobs.text_offset == sorted(choice.logprobs.text_offset)
    assert reply.choices[0].logprobs.token_logprobs[:prompt_tokens] == \
        reply.choices[1].logprobs.token_logprobs[:prompt_tokens]
    again = client.completions.create(model=MODEL, prompt="The sky is", max_tokens=6, n=2, seed=11, temperature=0.9)
    assert [c.text for c in again.choices] == [c.text[len("The sky is"):] for c in reply.choices]
    assert reply.usage.completion_tokens == sum(len(c.model_extra["tokens"]) for c in reply.choices)


def test_echo_logprobs_score_the_prompt_like_tgi_prefill(client, sluice_on_smol):
    prompt = "The quick brown fox jumps over the lazy dog"
    reply = client.completions.create(model=MODEL, prompt=prompt, max_tokens=1, temperature=0, logprobs=1, echo=True)
    scored = reply.choices[0].logprobs
    prefill = post(sluice_on_smol, "/generate", {"inputs": prompt, "parameters": {
        "max_new_tokens": 1, "details": True, "decoder_input_details": True}}).json()["details"]["prefill"]
    assert scored.tokens[:len(prefill)] == [p["text"] for p in prefill]
    assert scored.token_logprobs[0] is None and prefill[0]["logprob"] is None
    assert scored.token_logprobs[1:len(prefill)] == pytest.approx([p["logprob"] for p in prefill[1:]], abs=1e-4)
    streamed = post(sluice_on_smol, "/v1/completions", {"model": MODEL, "prompt": prompt, "max_tokens": 1,
                                                         "temperature": 0, "logprobs": 1, "echo": True, "stream": True})
    first = sse_payloads(streamed)[0]["choices"][0]
    assert first["text"] == prompt and first["logprobs"]["tokens"] == scored.tokens[:len(prefill)]


def test_completion_stop_is_excluded_and_finish_reason_stop(client):
    free = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0)
    word = free.choices[0].text.strip().split(",")[0].strip() or free.choices[0].text[:2]
    stopped = client.completions.create(model=MODEL, prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=[word])
    assert word not in stopped.choices[0].text
    assert stopped.choices[0].finish_reason == "stop"


def test_completion_stream_with_usage_and_friendli_extensions(client):
    chunks = list(client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                            stream=True, stream_options={"include_usage": True},
                                            extra_body={"top_k": 0, "repetition_penalty": 1.1, "min_tokens": 8}))
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    usage = chunks[-1].usage
    assert chunks[-1].choices == [] and usage.completion_tokens == 8
    assert finish == ["length"]
    plain = client.completions.create(model=MODEL, prompt="Once upon a time", max_tokens=8, temperature=0,
                                      extra_body={"top_k": 0, "repetition_penalty": 1.1, "min_tokens": 8})
    assert plain.choices[0].text == text


def test_completion_token_prompts(client):
    reply = client.completions.create(model=MODEL, prompt=[[504, 3537, 314], [28, 29]], max_tokens=3, temperature=0)
    assert [c.index for c in reply.choices] == [0, 1]
    assert reply.usage.prompt_tokens == 5


# ---- chat ----


def test_chat_non_streamed_has_every_required_key(sluice_on_smol):
    response = post(sluice_on_smol, "/v1/chat/completions", {"model": MODEL, "messages": HELLO, "max_tokens": 8})
    body = response.json()
    assert response.status_code == 200, body
    assert {"id", "object", "created", "model", "system_fingerprint", "usage", "choices"} <= set(body)
    choice = body["choices"][0]
    assert {"index", "message", "finish_reason", "logprobs"} <= set(choice)
    assert choice["message"]["role"] == "assistant" and choice["message"]["content"]
    assert body["object"] == "chat.completion"


def test_chat_sdk_streamed_equals_non_streamed(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0)
    chunks = list(client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=10, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == reply.choices[0].message.content
    assert chunks[-1].usage.total_tokens == reply.usage.total_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] \
        == [reply.choices[0].finish_reason]


def test_chat_stream_framing(sluice_on_smol):
    response = post(sluice_on_smol, "/v1/chat/completions",
                    {"model": MODEL, "messages": HELLO, "max_tokens": 4, "stream": True, "n": 2, "seed": [1, 2],
                     "stream_options": {"include_usage": True}})
    assert response.headers["content-type"].startswith("text/event-stream")
    payloads = sse_payloads(response)
    assert payloads[-1] == "[DONE]"
    assert payloads[-2]["choices"] == [] and payloads[-2]["usage"]["completion_tokens"] == 8
    first = [p["choices"][0] for p in payloads[:2]]
    assert [c["delta"] for c in first] == [{"role": "assistant", "content": ""}] * 2
    finishes = [p["choices"][0] for p in payloads[:-2] if p["choices"][0]["finish_reason"]]
    assert sorted(c["index"] for c in finishes) == [0, 1] and all(c["delta"] == {} for c in finishes)


def test_chat_prediction_speeds_nothing_up_it_cannot_change(client):
    """Predicted Outputs through the SDK on the real worker: the answer is the one without a prediction (greedy,
    logprobs equal), with n > 1 and logprobs, which OpenAI refuses beside a prediction; usage says how much of
    the prediction the answer took."""
    messages = [{"role": "user", "content": "Repeat exactly: the cat sat on the mat, the dog sat on the log."}]
    plain = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                           logprobs=True, top_logprobs=2)
    text = plain.choices[0].message.content
    predicted = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=24, temperature=0,
                                               logprobs=True, top_logprobs=2, n=2,
                                               prediction={"type": "content", "content": text})
    assert [c.message.content for c in predicted.choices] == [text, text]
    # the second request's prompt comes partly from the prefix cache, which rounds as another chunk would
    assert [t.logprob for t in predicted.choices[0].logprobs.content] == \
        pytest.approx([t.logprob for t in plain.choices[0].logprobs.content], abs=1e-4)
    details = predicted.usage.completion_tokens_details
    assert details.accepted_prediction_tokens > 0
    assert predicted.usage.completion_tokens == 2 * plain.usage.completion_tokens + details.rejected_prediction_tokens
    with pytest.raises(openai.BadRequestError) as refused:
        client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4,
                                       prediction={"type": "content", "content": [{"type": "image_url"}]})
    assert refused.value.body["param"] == "prediction"


def test_chat_logprobs_layout(client):
    reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, temperature=0, logprobs=True,
                                           top_logprobs=3)
    content = reply.choices[0].logprobs.content
    assert len(content) == reply.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and bytes(entry.bytes).decode(errors="replace")
        assert len(entry.top_logprobs) == 3
        assert entry.top_logprobs[0].logprob >= entry.logprob - 1e-4  # greedy: the chosen token is the best


def test_chat_response_format_is_passed_to_the_worker(client):
    # the mapping is tested at the parse level; here the route must accept every documented form
    for fmt in ({"type": "text"}, {"type": "json_object"},
                {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object"}}}):
        reply = client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=4, response_format=fmt)
        assert reply.choices[0].finish_reason in ("stop", "length")


def test_chat_json_object_output_is_json(client):
    reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "Give a JSON object."}],
                                           max_tokens=160, temperature=0, response_format={"type": "json_object"})
    choice = reply.choices[0]
    if choice.finish_reason == "stop":  # the grammar accepted: the content is a JSON object
        assert isinstance(json.loads(choice.message.content), dict)
    else:  # cut by max_tokens: the reply must say so
        assert choice.finish_reason == "length" and choice.model_extra["incomplete"] is True


# ---- errors and the cross-dialect rules ----


def test_typed_errors(sluice_on_smol, client):
    bad = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key="sk-sluice-bad", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model=MODEL, messages=HELLO)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="nope", messages=HELLO)
    with pytest.raises(openai.BadRequestError) as info:
        client.completions.create(model=MODEL, prompt="x", extra_body={"max_total_tokens": 5}, max_tokens=2)
    assert info.value.body["param"] == "max_total_tokens"


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/serverless/v1/completions",
                                  "/serverless/v1/chat/completions", "/v1/generate"])
def test_invalid_json_400_and_oversized_413(sluice_on_smol, path):
    assert post(sluice_on_smol, path, None, raw=b"{nope").status_code == 400
    huge = post(sluice_on_smol, path, {"model": MODEL, "prompt": "x" * (5 * 1024 * 1024)})
    assert huge.status_code == 413 and huge.json()["error"]["message"]
    prompt = {"messages": HELLO} if "chat" in path else {"prompt": "x"}  # the OpenAI routes refuse unknown keys
    wrong = post(sluice_on_smol, path, {"model": MODEL, **prompt, "max_tokens": "many"})
    status = 400 if path.startswith("/v1/c") else 422  # OpenAI's contract; Friendli's and MonsterAPI's FastAPI
    assert wrong.status_code == status and wrong.json()["error"]["param"] == "max_tokens"


def test_streaming_is_chosen_by_the_body_never_by_accept(sluice_on_smol):
    body = {"model": MODEL, "prompt": "Hi", "max_tokens": 2}
    plain = post(sluice_on_smol, "/v1/completions", body, headers={"accept": "text/event-stream"})
    assert plain.headers["content-type"].startswith("application/json") and plain.json()["choices"]
    streamed = post(sluice_on_smol, "/v1/completions", {**body, "stream": True},
                    headers={"accept": "application/json;q=1, text/event-stream;q=0"})
    assert streamed.headers["content-type"].startswith("text/event-stream")
    assert sse_payloads(streamed)[-1] == "[DONE]"


def test_missed_deadline_is_a_408_timeout_the_sdk_does_not_retry(sluice_on_smol):
    """Not a 429: SDKs retry those, and a retry with the same deadline misses it again. openai retries a
    408 too, unless told not to (x-should-retry: false); friendli never retries a 408."""
    for path, body in (("/v1/completions", {"prompt": "Count to one hundred:"}),
                       ("/v1/chat/completions", {"messages": HELLO})):
        for stream in (False, True):  # a stream's headers wait for the first token, so it gets the 408 too
            response = post(sluice_on_smol, path, {"model": MODEL, "max_tokens": 200, "ignore_eos": True,
                                                   "timeout_microseconds": 1, "stream": stream, **body})
            assert response.status_code == 408, response.text
            assert response.json()["error"]["type"] == "timeout"
            assert response.headers["x-should-retry"] == "false"
    seen: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda r: seen.append(r.status_code)]})
    client = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=2,
                           http_client=http)
    with pytest.raises(openai.APIStatusError) as info:
        client.completions.create(model=MODEL, prompt="Count:", max_tokens=200,
                                  extra_body={"ignore_eos": True, "timeout_microseconds": 1})
    assert info.value.status_code == 408 and seen == [408]  # one attempt, no retry


def test_streamed_refusals_before_the_first_token_keep_their_status(sluice_on_smol):
    too_long = post(sluice_on_smol, "/v1/completions", {"model": MODEL, "prompt": [7] * 5000, "max_tokens": 4,
                                                        "stream": True})
    assert too_long.status_code == 400, too_long.text
    assert too_long.json()["error"]["code"] == "context_length_exceeded"
    assert too_long.headers["content-type"].startswith("application/json")


def test_429_is_retried_by_the_sdk(sluice_on_smol, monkeypatch):
    admin = {"authorization": f"Bearer {sluice_on_smol.admin_key}"}
    team = httpx.post(f"{sluice_on_smol.url}/admin/teams", json={"name": "slow", "limits": {"rpm": 1}},
                      headers=admin).json()
    key = httpx.post(f"{sluice_on_smol.url}/admin/keys", json={"name": "k", "team_id": team["id"]},
                     headers=admin).json()["key"]
    seen: list[int] = []
    http = httpx.Client(event_hooks={"response": [lambda r: seen.append(r.status_code)]})
    limited = openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=key, max_retries=2, http_client=http)
    assert limited.completions.create(model=MODEL, prompt="Hi", max_tokens=1).choices
    waits: list[float] = []
    monkeypatch.setattr("openai._base_client.time.sleep", waits.append)  # the SDK's own back-off, not our code
    with pytest.raises(openai.RateLimitError) as info:
        limited.completions.create(model=MODEL, prompt="Hi", max_tokens=1)
    assert seen == [200, 429, 429, 429]  # the first call, then the SDK's attempt and its two retries
    retry_after = float(info.value.response.headers["retry-after"])
    assert 0 < retry_after <= 60 and len(waits) == 2 and all(w > 1 for w in waits)
