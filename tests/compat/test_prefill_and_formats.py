"""Issue #49 items 2, 3 and 5 through the real clients that found them, against `sluice serve` with the real model:
an Anthropic prefill is continued (create, stream, count_tokens) and so is vLLM's `continue_final_message`, each
counted as transformers' apply_chat_template(continue_final_message=True) lays it out; `messages.parse(
output_format=...)`; the SDK's `_request_id`; huggingface_hub's list-shaped `logit_bias`; `chat_template_kwargs`;
the context-overflow wording counts the completion asked for; `model_not_found` is OpenAI's type."""

from __future__ import annotations

import anthropic
import httpx
import openai
import pydantic
import pytest
from huggingface_hub import InferenceClient

from testkit.sluice import MODEL

QUESTION = {"role": "user", "content": "What is the capital of France?"}
PREFILL = "The capital of France is"
GREEDY = {"temperature": 0}  # this SDK release has no sampling arguments


@pytest.fixture(scope="module")
def claude(sluice_on_smol):
    return anthropic.Anthropic(base_url=sluice_on_smol.url, api_key=sluice_on_smol.api_key, max_retries=0)


@pytest.fixture(scope="module")
def gpt(sluice_on_smol):
    return openai.OpenAI(base_url=f"{sluice_on_smol.url}/v1", api_key=sluice_on_smol.api_key, max_retries=0)


def continued_tokens(tokenizer, messages) -> int:
    text = tokenizer.apply_chat_template(messages, tokenize=False, continue_final_message=True)
    return len(tokenizer(text, add_special_tokens=False).input_ids)


def test_anthropic_prefill_is_continued_and_counted(claude, smol_tokenizer):
    messages = [QUESTION, {"role": "assistant", "content": PREFILL}]
    message = claude.messages.create(model=MODEL, max_tokens=8, messages=messages, extra_body=GREEDY)
    text = message.content[0].text
    # old main closed the prefill's turn and started another: "The capital of France is Paris." came back
    assert not text.lstrip().startswith("The capital"), text
    assert "Paris" in text
    expected = continued_tokens(smol_tokenizer, messages)
    assert message.usage.input_tokens == expected  # old main: 11 more (the closed turn and a new header)
    counted = claude.messages.count_tokens(model=MODEL, messages=messages)
    assert counted.input_tokens == expected
    with claude.messages.stream(model=MODEL, max_tokens=8, messages=messages, extra_body=GREEDY) as stream:
        streamed = stream.get_final_message()
    assert streamed.content[0].text == text and streamed.usage.input_tokens == expected


def test_anthropic_prefill_with_trailing_whitespace_is_refused(claude):
    with pytest.raises(anthropic.BadRequestError) as refused:
        claude.messages.create(model=MODEL, max_tokens=4, messages=[QUESTION, {"role": "assistant", "content": "It "}])
    assert "trailing whitespace" in refused.value.body["error"]["message"]


class Capital(pydantic.BaseModel):
    city: str = pydantic.Field(max_length=24)
    country: str = pydantic.Field(max_length=24)


def test_anthropic_messages_parse_with_an_output_format(claude):
    parsed = claude.messages.parse(model=MODEL, max_tokens=64, extra_body=GREEDY, output_format=Capital,
                                   messages=[{"role": "user", "content": "Name the capital of France as JSON."}])
    assert isinstance(parsed.parsed_output, Capital)  # old main: 400 "output_config: Extra inputs are not permitted"
    unenforceable = {"format": {"type": "json_schema", "schema": {"type": "object", "not": {}}}}
    with pytest.raises(anthropic.BadRequestError) as refused:  # the worker's refusal, in this API's words
        claude.messages.create(model=MODEL, max_tokens=4, messages=[QUESTION], output_config=unenforceable)
    assert "output_config.format" in refused.value.body["error"]["message"]


def test_anthropic_sdk_reads_the_request_id(claude):
    raw = claude.messages.with_raw_response.create(model=MODEL, max_tokens=2, messages=[QUESTION])
    message = raw.parse()
    assert message._request_id is not None and message._request_id == raw.headers["x-request-id"]


def test_openai_continue_final_message_is_a_prefill(gpt, smol_tokenizer):
    messages = [QUESTION, {"role": "assistant", "content": PREFILL}]
    reply = gpt.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, temperature=0,
                                        extra_body={"continue_final_message": True, "add_generation_prompt": False})
    assert not reply.choices[0].message.content.lstrip().startswith("The capital")
    assert reply.usage.prompt_tokens == continued_tokens(smol_tokenizer, messages)
    with pytest.raises(openai.BadRequestError) as refused:
        gpt.chat.completions.create(model=MODEL, messages=messages, max_tokens=2,
                                    extra_body={"continue_final_message": True, "add_generation_prompt": True})
    assert refused.value.body["param"] == "continue_final_message"


def test_chat_template_kwargs_are_passed_and_bounded(gpt):
    reply = gpt.chat.completions.create(model=MODEL, messages=[QUESTION], max_tokens=2,
                                        extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].message.content is not None  # old main: 422 "not supported yet"
    for kwargs in ({"add_generation_prompt": False}, {"x": [1]}, {f"k{i}": 1 for i in range(17)}):
        with pytest.raises(openai.BadRequestError) as refused:
            gpt.chat.completions.create(model=MODEL, messages=[QUESTION], max_tokens=2,
                                        extra_body={"chat_template_kwargs": kwargs})
        assert refused.value.body["param"] == "chat_template_kwargs"


def test_huggingface_hub_list_shaped_logit_bias(sluice_on_smol, smol_tokenizer):
    favoured = smol_tokenizer.convert_tokens_to_ids("!")
    bias = [0.0] * (favoured + 1)
    bias[favoured] = 100.0
    client = InferenceClient(base_url=sluice_on_smol.url, api_key=sluice_on_smol.api_key)
    reply = client.chat_completion(messages=[QUESTION], max_tokens=4, logit_bias=bias, temperature=0)
    assert reply.choices[0].message.content == "!!!!"  # old main: 422, logit_bias must be an object


def test_context_overflow_counts_the_completion_asked_for(gpt, sluice_on_smol):
    with pytest.raises(openai.BadRequestError) as refused:
        gpt.completions.create(model=MODEL, prompt="hello " * 5000, max_tokens=4)
    message = refused.value.body["message"]
    assert "4 for the completion" in message, message  # old main: "0 for the completion"


def test_model_not_found_is_an_invalid_request_error(gpt):
    with pytest.raises(openai.NotFoundError) as missing:
        gpt.models.retrieve("no-such-model")
    assert missing.value.body["type"] == "invalid_request_error" and missing.value.body["code"] == "model_not_found"
    raw = httpx.post(f"{gpt.base_url}chat/completions", headers={"Authorization": f"Bearer {gpt.api_key}"},
                     json={"model": "no-such-model", "messages": [QUESTION]}, timeout=30)
    assert raw.status_code == 404 and raw.json()["error"]["type"] == "invalid_request_error"
